"""The parquet converter's input: the Parquet and Arrow IPC files named (a folder's files, a
``save_to_disk`` folder's in its ``state.json`` order), each opened for its kind, row counts per
row group / record batch and schema, and their rows read back in record batches of the columns
asked for (a chunk that fails to read is noted, not fatal). Kept apart from the conversion's plan
so finding and reading files is one job; pyarrow is imported lazily.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .common import ConversionError, SourceWalker, UsageError

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
