"""Parquet and Arrow IPC tables, one row a sample -> image / txt / cls / json fields.

SRC is one or more Parquet (``.parquet``) or Arrow IPC (``.arrow``, ``.feather``, ``.ipc``: the
file or the streaming format) files or folders of them, in the order given (a folder's files in
sorted order). A Hugging Face ``datasets`` folder written by ``save_to_disk`` is read in the
order of its ``state.json``; one written by ``to_parquet`` is a Parquet file like any other. A
``DatasetDict`` folder is refused: name one split (``SRC/train``).

``--image-column``: raw bytes, an HF ``datasets`` ``Image`` struct (``{bytes, path}``: the bytes,
or the file at ``path`` when there are none) or a path (relative to the table file); the field
is named by the image header (``jpg``, ``png``, ...). ``--text-column`` -> ``txt``;
``--label-column`` -> ``cls`` (integers as they are; an HF ``ClassLabel`` column keeps its names
as ``classes`` and -1 is a missing label; a column of names is numbered in sorted order as in the
manifest layout); ``--key-column`` -> the key (default: the row number over all files). The
other columns go into a ``json`` field (or only ``--keep-columns``); binary columns are left out
and noted.

Tables are read in record batches with pyarrow, with the columns needed only: memory does not
grow with the file size (it is bounded by the largest data page or record batch the writer of
the file made). Parts (``--part``, ``--engine ray``) are ranges of rows, cut at multiples of
``--shard-size`` for tar output: each part reads only the row groups (record batches) its rows
are in.

Bad rows (``--on-error skip`` lists them in DST.skipped.tsv as ``FILE:row N``, 0-based within the
file; ``--on-error raise`` stops naming file, row, row group and column): a corrupt or missing
image, a row group that cannot be read, a file whose schema lacks a named column or holds it
with another type, a file that is not a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from .common import (
    IMAGE_EXTENSIONS,
    ConversionError,
    Item,
    ItemError,
    SourceWalker,
    Summary,
    UsageError,
    check_required_fields,
    execute,
    label_kind,
    layout_parser,
    load_item,
    options_from,
    ordered_map,
    part_bounds,
    shard_alignment,
    write_samples,
)
from .provenance import describe_input

EXAMPLES = (
    "mmloader convert parquet laion/ out/ --image-column jpg --text-column caption --workers 2",
    "mmloader convert parquet hf_saved/train out.lmdb --image-column image --label-column label",
    "mmloader convert parquet a.parquet b.arrow out/ --image-column image --engine ray --parts 64",
    "mmloader convert parquet data/ out/ --image-column image --part 3/8    # then: mmloader merge out/",
)
LOOKED_FOR = "Parquet or Arrow IPC files (.parquet, .arrow, .feather, .ipc)"
TABLE_SUFFIXES = (".parquet", ".pq", ".parq", ".arrow", ".feather", ".ipc")
#: Rows handed on at a time (a record batch of images is this many images in memory, per stage).
BATCH_ROWS = 256
#: pyarrow's buffered reads: without them a row group's whole column chunk is read at once
#: (measured: 453 MB peak RSS for one 300 MB row group, 139 MB with 1 MiB buffered reads).
BUFFER_BYTES = 1 << 20


def _pa():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConversionError("the parquet layout needs pyarrow: pip install 'mmloader[parquet]'") from None
    return pyarrow


@dataclass
class Table:
    """One input file: where it is, its kind, row counts per row group / record batch, schema."""

    path: str
    rel: str
    kind: str = ""  # parquet | arrow-file | arrow-stream
    chunks: list[int] = field(default_factory=list)
    schema: Any = None
    error: str | None = None
    size: int = 0

    @property
    def rows(self) -> int:
        return sum(self.chunks)


def _kind(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:6] == b"ARROW1":
        return "arrow-file"
    if head[:4] == b"\xff\xff\xff\xff" or len(head) >= 4:
        return "arrow-stream"  # checked by opening it
    raise OSError("empty file")


def open_table(t: Table) -> Table:
    pa = _pa()
    try:
        t.size = os.path.getsize(t.path)
        t.kind = _kind(t.path)
        if t.kind == "parquet":
            meta = pa.parquet.ParquetFile(t.path).metadata
            t.chunks = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            t.schema = meta.schema.to_arrow_schema()
        elif t.kind == "arrow-file":
            with pa.memory_map(t.path) as m:  # zero-copy: only the batches' metadata is touched
                reader = pa.ipc.open_file(m)
                t.chunks = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
                t.schema = reader.schema
        else:
            with pa.memory_map(t.path) as m:
                reader = pa.ipc.open_stream(m)
                t.chunks = [b.num_rows for b in reader]
                t.schema = reader.schema
    except (OSError, pa.ArrowException, ValueError) as e:
        t.error = f"not a readable Parquet or Arrow IPC file: {e}"
        t.chunks = []
    return t


def list_tables(args: argparse.Namespace, notes: list[str]) -> list[Table]:
    tables: list[Table] = []
    other: list[str] = []
    for src in args.src:
        root = Path(src)
        if root.is_file():
            tables.append(Table(str(root), root.name))
            continue
        if (root / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in root.iterdir() if (p / "state.json").is_file())
            raise UsageError(
                f"{root} is a datasets DatasetDict (saved with save_to_disk): convert one split, "
                f"e.g. {root / (splits[0] if splits else 'train')} (splits: {', '.join(splits) or 'none'})"
            )
        state = root / "state.json"
        if state.is_file():  # datasets' save_to_disk: its Arrow files, in its order
            try:
                files = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConversionError(f"{state}: not a datasets state.json ({e})") from None
            tables += [Table(str(root / f), f) for f in files]
            continue
        walker = SourceWalker(str(root), args.dst)
        for dirpath, names in walker.walk():
            for name in names:
                full = os.path.join(dirpath, name)
                if name.lower().endswith(TABLE_SUFFIXES):
                    tables.append(Table(full, os.path.relpath(full, root).replace(os.sep, "/")))
                else:
                    other.append(full)
        for folder, reason in walker.unreadable:
            tables.append(Table(folder, os.path.relpath(folder, root), error=reason))
        notes += walker.notes()
    if other:
        notes.append(f"not input: {len(other)} file(s) that are not Parquet or Arrow, e.g. {other[0]}")
    return [open_table(t) if t.error is None else t for t in tables]


# -- columns ---------------------------------------------------------------------------------------
def _has_binary(t) -> bool:
    pa = _pa()
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or getattr(pa.types, "is_binary_view", lambda _t: False)(t)
    ):
        return True
    if pa.types.is_struct(t):
        return any(_has_binary(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_binary(t.value_type)
    if pa.types.is_dictionary(t):
        return _has_binary(t.value_type)
    return False


def _is_text(t) -> bool:
    pa = _pa()
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t)
    )


def _is_bytes(t) -> bool:
    pa = _pa()
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or getattr(pa.types, "is_binary_view", lambda _t: False)(t)
    )


def image_kind(t) -> str | None:
    """bytes | struct (HF Image) | path, or None for a type that holds no image."""
    pa = _pa()
    if _is_bytes(t):
        return "bytes"
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and _is_bytes(t.field("bytes").type):
        return "struct"
    if _is_text(t):
        return "path"
    return None


def _check_type(role: str, t) -> str | None:
    """Why a column of type ``t`` cannot serve as ``role``, or None."""
    pa = _pa()
    if role == "image" and image_kind(t) is None:
        return f"is {t}: an image column holds bytes, a datasets Image struct {{bytes, path}} or a path"
    if role == "text" and not (_is_text(t) or _is_bytes(t)):
        return f"is {t}: a text column holds strings (or UTF-8 bytes)"
    if role == "label":
        v = t.value_type if pa.types.is_dictionary(t) else t
        if not (pa.types.is_integer(v) or pa.types.is_floating(v) or _is_text(v)):
            return f"is {t}: a label column holds integers or class names"
    if role == "key" and (pa.types.is_nested(t) or _has_binary(t)):
        return f"is {t}: a key column holds strings or integers"
    return None


def hf_features(schema) -> dict:
    """The datasets features recorded in a table's schema metadata ({} when none)."""
    meta = (schema.metadata or {}) if schema is not None else {}
    raw = meta.get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


@dataclass
class Columns:
    image: str | None
    text: str | None
    label: str | None
    key: str | None
    keep: list[str] | None

    def named(self) -> dict[str, str]:
        return {
            role: c
            for role, c in (("image", self.image), ("text", self.text), ("label", self.label), ("key", self.key))
            if c
        }


def schema_problem(table: Table, cols: Columns) -> str | None:
    """Why this file's rows cannot be converted with these columns (a schema that differs)."""
    names = table.schema.names
    for role, c in cols.named().items():
        if c not in names:
            return f"schema differs: this file has no column {c!r} (its columns: {', '.join(map(repr, names))})"
        why = _check_type(role, table.schema.field(c).type)
        if why:
            return f"schema differs: column {c!r} {why}"
    return None


def json_columns(table: Table, cols: Columns) -> tuple[list[str], list[str]]:
    """(columns kept in the json field, binary columns left out) for one file."""
    named = set(cols.named().values())
    keep, binary = [], []
    for f in table.schema:
        if f.name in named or (cols.keep is not None and f.name not in cols.keep):
            continue
        (binary if _has_binary(f.type) else keep).append(f.name)
    return keep, binary


# -- labels ----------------------------------------------------------------------------------------
def label_table(tables: list[Table], cols: Columns, notes: list[str]) -> tuple[list[str] | None, dict | None]:
    """(class names or None, {raw value: int label or error text}) — None mapping: integers as they
    are (with an HF ClassLabel's -1 a missing label)."""
    pa = _pa()
    c = cols.label
    good = [t for t in tables if t.error is None and schema_problem(t, cols) is None]
    for t in good:
        feature = hf_features(t.schema).get(c, {})
        if feature.get("_type") == "ClassLabel" and pa.types.is_integer(t.schema.field(c).type):
            return list(feature.get("names") or []), None
    if good and all(pa.types.is_integer(t.schema.field(c).type) for t in good):
        return None, None
    uniques: set = set()  # a pass over the label column alone: the class names are the sorted distinct names
    for t in good:
        for _g, _r, batch in read_batches(t, [c], 0, t.rows, errors=[]):
            uniques.update(batch.column(0).unique().to_pylist())
    uniques.discard(None)
    kinds = {v: label_kind(v) for v in uniques}
    names = any(k == "name" for k, _ in kinds.values())
    mapping: dict = {}
    if not names:
        for v, (kind, value) in kinds.items():
            if kind == "number":
                mapping[v] = value if isinstance(value, int) else f"bad label: {value!r} is not an integer"
            elif kind == "missing":
                mapping[v] = f"missing label: {c!r} is empty"
            else:
                mapping[v] = f"bad label: {value}"
        return None, mapping

    def as_name(v, kind, value):
        return value if kind == "name" else (v.strip() if isinstance(v, str) else json.dumps(v))

    classes = sorted({as_name(v, k, x) for v, (k, x) in kinds.items() if k in ("name", "number")})
    index = {name: i for i, name in enumerate(classes)}
    numbers = [v for v, (k, _x) in kinds.items() if k == "number"]
    for v, (kind, value) in kinds.items():
        if kind in ("name", "number"):
            mapping[v] = index[as_name(v, kind, value)]
        elif kind == "missing":
            mapping[v] = f"missing label: {c!r} is empty"
        else:
            mapping[v] = f"bad label: {value}"
    if numbers:
        notes.append(
            f"label column {c!r} mixes class names and numbers: numeric label(s) such as {numbers[0]!r} "
            "are class names as written (classes are sorted names)"
        )
    return classes, mapping


# -- reading ---------------------------------------------------------------------------------------
def read_batches(t: Table, columns: list[str], start: int, stop: int, errors: list) -> Iterator[tuple[int, int, Any]]:
    """Record batches of rows ``[start, stop)`` of ``t`` (rows counted within the file): yields
    ``(chunk, first row, batch)``. A chunk that fails to read appends ``(chunk, first row not
    read, stop of that chunk, reason)`` to ``errors`` and reading goes on with the next chunk
    (a streaming Arrow file cannot go on: the rest of it is in error)."""
    pa = _pa()
    bounds = []
    row = 0
    for g, n in enumerate(t.chunks):
        if row + n > start and row < stop:
            bounds.append((g, row, row + n))
        row += n
    if not bounds:
        return
    if t.kind == "parquet":
        pf = pa.parquet.ParquetFile(t.path, buffer_size=BUFFER_BYTES, pre_buffer=False, page_checksum_verification=True)
        for g, a, b in bounds:
            pos = a
            try:
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=columns, use_threads=False):
                    yield from _clip(g, pos, batch, start, stop)
                    pos += batch.num_rows
            except (OSError, pa.ArrowException, ValueError) as e:
                errors.append((g, max(pos, start), min(b, stop), f"row group {g} cannot be read: {e}"))
        return
    source = pa.OSFile(t.path)  # not a memory map: pages read are not kept mapped (flat RSS)
    try:
        if t.kind == "arrow-file":
            reader = pa.ipc.open_file(source)
            for g, a, b in bounds:
                try:
                    batch = reader.get_batch(g).select(columns)
                except (OSError, pa.ArrowException, ValueError) as e:
                    errors.append((g, max(a, start), min(b, stop), f"record batch {g} cannot be read: {e}"))
                    continue
                for off in range(0, batch.num_rows, BATCH_ROWS):
                    yield from _clip(g, a + off, batch.slice(off, BATCH_ROWS), start, stop)
            return
        reader = pa.ipc.open_stream(source)
        g, a = 0, 0
        try:
            for batch in reader:  # a stream has no index: batches before the range are read and dropped
                b = a + batch.num_rows
                if b > start and a < stop:
                    batch = batch.select(columns)
                    for off in range(0, batch.num_rows, BATCH_ROWS):
                        yield from _clip(g, a + off, batch.slice(off, BATCH_ROWS), start, stop)
                if b >= stop:
                    return
                g, a = g + 1, b
        except (OSError, pa.ArrowException, ValueError) as e:
            errors.append((g, max(a, start), stop, f"record batch {g} and the rest of the stream cannot be read: {e}"))
    finally:
        source.close()


def _clip(g: int, first: int, batch, start: int, stop: int):
    lo, hi = max(start - first, 0), min(stop - first, batch.num_rows)
    if hi <= lo:
        return
    if lo or hi < batch.num_rows:
        batch = batch.slice(lo, hi - lo)
    yield g, first + lo, batch


def _cells(batch, name: str, kind: str | None = None) -> list:
    col = batch.column(batch.schema.get_field_index(name))
    if kind == "struct":
        import pyarrow.compute as pc

        data = pc.struct_field(col, "bytes").to_pylist()
        paths = (
            pc.struct_field(col, "path").to_pylist() if col.type.get_field_index("path") >= 0 else [None] * len(data)
        )
        valid = col.is_valid().to_pylist()
        return [(d, p) if ok else (None, None) for d, p, ok in zip(data, paths, valid)]
    return col.to_pylist()


# -- the conversion ------------------------------------------------------------------------------
class Plan:
    def __init__(self, args: argparse.Namespace, notes: list[str]):
        self.args, self.notes = args, notes
        keep = [c for c in args.keep_columns.split(",") if c] if args.keep_columns is not None else None
        self.cols = Columns(args.image_column, args.text_column, args.label_column, args.key_column, keep)
        self.tables = list_tables(args, notes)
        readable = [t for t in self.tables if t.error is None]
        if not self.tables or (len(readable) == len(self.tables) and not any(t.rows for t in readable)):
            raise ConversionError(
                f"no samples found in {', '.join(args.src)}: looked for {LOOKED_FOR}"
                + (f"; {'; '.join(notes)}" if notes else "")
            )
        self._check_columns(readable)
        self.problems = {t.path: schema_problem(t, self.cols) for t in readable}
        self.total = sum(t.rows for t in self.tables) + sum(1 for t in self.tables if t.error)
        self.width = max(len(str(self.total)), 9)
        self.classes, self.labels = label_table(self.tables, self.cols, notes) if self.cols.label else (None, None)
        binary = sorted({c for t in readable for c in json_columns(t, self.cols)[1]})
        if binary:
            notes.append(
                f"not kept: binary column(s) {', '.join(map(repr, binary))} (a json field holds text; "
                "name an image column with --image-column)"
            )
        layout_fields = (
            (list(IMAGE_EXTENSIONS) if self.cols.image else [])
            + (["txt"] if self.cols.text else [])
            + (["cls"] if self.cols.label else [])
            + ["json"]
        )
        check_required_fields(args.require, [], layout_fields)
        self.metadata: dict = {"layout": "parquet", "columns": self.cols.named()}
        if self.classes is not None:
            self.metadata["classes"] = self.classes
        found = {
            "files": len(self.tables),
            "rows": sum(t.rows for t in readable),
            "bytes": sum(t.size for t in self.tables),
        }
        self.metadata = describe_input(self.metadata, args, self.digest(), found)

    def _check_columns(self, readable: list[Table]) -> None:
        """A column option naming a column no file has (or none with a usable type) is a usage error."""
        for role, c in self.cols.named().items():
            having = [t for t in readable if c in t.schema.names]
            if readable and not having:
                raise UsageError(
                    f"--{role}-column {c!r} is not a column of {readable[0].path} (columns: "
                    f"{', '.join(map(repr, readable[0].schema.names))})"
                )
            whys = [_check_type(role, t.schema.field(c).type) for t in having]
            if having and all(whys):
                raise UsageError(f"--{role}-column {c!r} {whys[0]}")
        for c in self.cols.keep or ():
            if readable and not any(c in t.schema.names for t in readable):
                raise UsageError(
                    f"--keep-columns {c}: not a column of {readable[0].path} (columns: "
                    f"{', '.join(map(repr, readable[0].schema.names))})"
                )

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in self.tables:
            h.update(
                json.dumps(
                    [
                        t.rel,
                        t.size,
                        t.kind,
                        t.chunks,
                        t.error,
                        t.schema.to_string(show_field_metadata=False) if t.schema is not None else None,
                    ]
                ).encode()
                + b"\n"
            )
        return h.hexdigest()

    # Rows are numbered over all files; an unreadable file counts as one row (its error item).
    def items(self, start: int, stop: int) -> Iterator[Item]:
        base = 0
        for t in self.tables:
            rows = t.rows if t.error is None else 1
            lo, hi = max(start - base, 0), min(stop - base, rows)
            if lo < hi:
                yield from self._file_items(t, base, lo, hi)
            base += rows
            if base >= stop:
                return

    def _key(self, n: int) -> str:
        return f"{n:0{self.width}d}"

    def _file_items(self, t: Table, base: int, lo: int, hi: int) -> Iterator[Item]:
        if t.error is not None:
            yield Item(key=t.rel, where=t.path, error=t.error)
            return
        problem = self.problems.get(t.path)
        if problem:
            for r in range(lo, hi):
                yield Item(key=self._key(base + r), where=f"{t.path}:row {r}", error=problem)
            return
        cols = self.cols
        keep, _binary = json_columns(t, cols)
        named = list(dict.fromkeys(cols.named().values()))
        ikind = image_kind(t.schema.field(cols.image).type) if cols.image else None
        folder = os.path.dirname(os.path.abspath(t.path))
        errors: list = []
        for g, first, batch in read_batches(t, named + keep, lo, hi, errors):
            yield from self._errors(t, base, errors)
            images = _cells(batch, cols.image, ikind) if cols.image else None
            texts = _cells(batch, cols.text) if cols.text else None
            labels = _cells(batch, cols.label) if cols.label else None
            keys = _cells(batch, cols.key) if cols.key else None
            rest = batch.select(keep).to_pylist() if keep else None
            for j in range(batch.num_rows):
                r = first + j
                item = Item(key=self._key(base + r), where=f"{t.path}:row {r}")
                where_in = f"row group {g}"
                if keys is not None:
                    k = keys[j]
                    item.key = "" if k is None else str(k)
                    if not item.key:
                        item.key, item.error = self._key(base + r), f"empty key: column {cols.key!r} ({where_in})"
                        yield item
                        continue
                if images is not None:
                    self._image(item, images[j], ikind, folder, f"column {cols.image!r} ({where_in})")
                if texts is not None and texts[j] is not None:
                    if isinstance(texts[j], bytes):
                        item.data["txt"], item.origin["txt"] = texts[j], f"column {cols.text!r} ({where_in})"
                    else:
                        item.values["txt"] = texts[j]
                if labels is not None:
                    label = self._label(labels[j])
                    if isinstance(label, str):
                        item.error = f"column {cols.label!r} ({where_in}): {label}"
                    else:
                        item.values["cls"] = label
                if rest is not None and rest[j]:
                    item.values["json"] = json.dumps(rest[j], ensure_ascii=False, separators=(",", ":"), default=str)
                yield item
        yield from self._errors(t, base, errors)

    def _errors(self, t: Table, base: int, errors: list) -> Iterator[Item]:
        while errors:
            g, a, b, reason = errors.pop(0)
            for r in range(a, b):
                yield Item(key=self._key(base + r), where=f"{t.path}:row {r}", error=reason)

    @staticmethod
    def _image(item: Item, cell, kind: str | None, folder: str, origin: str) -> None:
        data, path = cell if kind == "struct" else ((cell, None) if kind == "bytes" else (None, cell))
        if data is not None:
            item.data[""], item.origin[""] = data, origin
        elif path:
            item.files[""] = path if os.path.isabs(path) else os.path.join(folder, path)
            item.origin[""] = origin

    def _label(self, value):
        if value is None or (self.labels is None and self.classes is not None and value == -1):
            return f"missing label: {self.cols.label!r} is empty"
        if self.labels is None:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"bad label: {value!r} is not an integer"
            return value
        return self.labels.get(value, f"bad label: {value!r}")


def _load(args) -> tuple[Item, dict | None, ItemError | None]:
    """Load one row (in a worker thread); a file's error names the row, the column and the file."""
    item, opts = args
    try:
        return item, load_item(item, opts), None
    except ItemError as e:
        if e.path and e.path != item.where and item.where:  # an image file named by a path column
            origin = item.origin.get("")
            return item, None, ItemError(f"{origin + ': ' if origin else ''}{e.reason} ({e.path})", item.where)
        return item, None, e


def prepare(args: argparse.Namespace, notes: list[str]):
    if args.shuffle_seed is not None:
        raise UsageError(
            "--shuffle-seed: parquet rows are converted in file order, read in record batches "
            "(constant memory); shuffle when reading (mmloader.Stream shuffles every epoch)"
        )
    plan = Plan(args, notes)

    def convert(part: tuple[int, int] | None, dst: str) -> Summary:
        start, stop = part_bounds(plan.total, part, shard_alignment(args)) if part else (0, plan.total)
        opts = options_from(args)
        loaded = ordered_map(_load, ((it, opts) for it in plan.items(start, stop)), args.workers)
        return write_samples(
            loaded, dst, args, plan.metadata, total=stop - start, notes=notes, unique_keys=not args.key_column
        )

    return plan.digest(), convert


def parser() -> argparse.ArgumentParser:
    p = layout_parser("parquet", __doc__, EXAMPLES)
    for action in p._actions:  # SRC: one or more files or folders
        if action.dest == "src":
            action.nargs, action.metavar = "+", "SRC"
            action.help = "Parquet / Arrow IPC files or folders of them (a datasets save_to_disk folder too)"
    p.add_argument("--image-column", help="column holding the image: bytes, a datasets Image struct or a path")
    p.add_argument("--text-column", help="column stored as the txt field")
    p.add_argument(
        "--label-column",
        help="column stored as the cls field: integers as they are (a datasets "
        "ClassLabel keeps its names), class names numbered in sorted order",
    )
    p.add_argument("--key-column", help="column used as the sample key (default: the row number over all files)")
    p.add_argument(
        "--keep-columns",
        default=None,
        help="comma-separated other columns to keep in the json field (default: all but binary ones)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
