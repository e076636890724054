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
from typing import Iterator, Sequence

from .common import (
    IMAGE_EXTENSIONS,
    ConversionError,
    Item,
    ItemError,
    Summary,
    UsageError,
    check_required_fields,
    execute,
    layout_parser,
    load_item,
    options_from,
    ordered_map,
    part_bounds,
    shard_alignment,
    write_samples,
)
from .items import strict_json
from .parquet_columns import Columns, _check_type, image_kind, json_columns, label_table, schema_problem
from .parquet_tables import Table, _cells, list_tables, read_batches
from .provenance import describe_input

EXAMPLES = (
    "mmloader convert parquet laion/ out/ --image-column jpg --text-column caption --workers 2",
    "mmloader convert parquet hf_saved/train out.lmdb --image-column image --label-column label",
    "mmloader convert parquet a.parquet b.arrow out/ --image-column image --engine ray --parts 64",
    "mmloader convert parquet data/ out/ --image-column image --part 3/8    # then: mmloader merge out/",
)
LOOKED_FOR = "Parquet or Arrow IPC files (.parquet, .arrow, .feather, .ipc)"


# -- the conversion ------------------------------------------------------------------------------
class Plan:
    def __init__(self, args: argparse.Namespace, notes: list[str]):
        self.args, self.notes = args, notes
        self.nonfinite = 0  # NaN / infinite values of the json field, stored as null
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
                break
        if self.nonfinite:
            self.notes.append(f"{self.nonfinite} NaN or infinite value(s) in the json field stored as null (missing)")
            self.nonfinite = 0

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
                    plain, replaced = strict_json(rest[j])  # NaN is not JSON: null (missing)
                    self.nonfinite += replaced
                    item.values["json"] = json.dumps(
                        plain, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False
                    )
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
