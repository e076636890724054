"""A raw UTF-8 text file as a store: one sample per line, field ``txt``.

A sidecar ``<file>.lines.npy`` (built once, with a progress bar) holds every
line's start offset; it is mmapped, so line *i* is one ``pread`` and memory does
not grow with the file. The sidecar records the file's size and mtime and is
rebuilt when they change.
"""

from __future__ import annotations

import codecs
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from ...errors import FormatError
from ..base import Store

CHUNK = 1 << 24
_HEADER = 2  # [file size, mtime_ns] precede the offsets


def line_key(i: int) -> str:
    """The key of line *i* (0-based); the textlines converter uses the same keys."""
    return f"{i:010d}"


def _scan(path: Path, progress: bool, on_newline) -> int:
    size = path.stat().st_size
    n = 0
    with (
        open(path, "rb") as f,
        tqdm(total=size, unit="B", unit_scale=True, disable=not progress, desc=f"indexing lines of {path.name}") as bar,
    ):
        pos = 0
        while chunk := f.read(CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            on_newline(nl + pos, n)
            n += len(nl)
            pos += len(chunk)
            bar.update(len(chunk))
    return n


def build_line_index(
    path: str | os.PathLike, index_path: str | os.PathLike | None = None, progress: bool = True
) -> Path:
    """Write the line-offset sidecar for ``path`` (two streaming passes, constant memory)."""
    path = Path(path)
    out = Path(index_path) if index_path else path.with_name(path.name + ".lines.npy")
    st = path.stat()
    newlines = _scan(path, False, lambda nl, n: None)
    size = st.st_size
    last_unterminated = size > 0 and (newlines == 0 or _last_byte(path) != b"\n")
    count = newlines + (1 if last_unterminated else 0)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    table = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(_HEADER + count + 1,))
    table[0], table[1] = size, st.st_mtime_ns
    table[_HEADER] = 0

    def fill(nl, n, table=table):  # line n+1 starts after newline n
        table[_HEADER + 1 + n : _HEADER + 1 + n + len(nl)] = nl + 1

    _scan(path, progress, fill)
    table[_HEADER + count] = size  # end of the last line
    table.flush()
    del table
    os.replace(tmp, out)
    return out


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


class TextLinesStore(Store):
    """Random access to the lines of a text file (``store[i]["txt"]`` is line *i*, without its newline).

    >>> lines = TextLinesStore("corpus.txt"); len(lines), lines[10]["txt"]    # doctest: +SKIP
    """

    format = "textlines"

    def __init__(self, path: str | os.PathLike, index_path: str | os.PathLike | None = None, progress: bool = True):
        self.file = Path(path).resolve()
        if not self.file.is_file():
            raise FileNotFoundError(f"text file {self.file} does not exist")
        self.path = str(self.file)
        self.index_path = Path(index_path) if index_path else self.file.with_name(self.file.name + ".lines.npy")
        self.progress = progress
        self._pid = -1
        self._fd: int | None = None
        self._table: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {"file": str(self.file), "index_path": str(self.index_path), "progress": self.progress}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["file"], state["index_path"], state["progress"])

    def _offsets(self) -> np.ndarray:
        """The line index, mapped but never read through the map (see :meth:`_spans`)."""
        if self._pid != os.getpid():
            st = self.file.stat()
            table = None
            if self.index_path.is_file():
                table = np.load(self.index_path, mmap_mode="r", allow_pickle=False)
                if _read_pair(self.index_path, table, 0) != (st.st_size, st.st_mtime_ns):
                    table = None  # the text changed since the sidecar was built
            if table is None:
                try:
                    build_line_index(self.file, self.index_path, self.progress)
                except PermissionError as e:
                    raise FormatError(
                        f"cannot write the line index {self.index_path}: {e}; pass index_path= to put it elsewhere"
                    ) from e
                table = np.load(self.index_path, mmap_mode="r", allow_pickle=False)
            # Offsets are read with pread, not through the map: a fault maps a whole page-cache
            # folio (up to ~1 MB here), so random lookups would map ever more of a big index
            # into every process (measured: +27 MB PSS a worker for a 4 GB file after 12 s).
            self._index_fd, self._index_base = os.open(self.index_path, os.O_RDONLY), table.offset
            self._span = _pair_format(table)
            self._table, self._fd, self._pid = table, os.open(self.file, os.O_RDONLY), os.getpid()
        assert self._table is not None  # set above, in this process
        return self._table

    def _spans(self, idx: Sequence[int]) -> list[tuple[int, int]]:
        """(start, end) byte offsets of lines ``idx`` (checked indices), one ``pread`` each."""
        self._offsets()
        fd, base, unpack = self._index_fd, self._index_base + 8 * _HEADER, self._span.unpack
        return [unpack(os.pread(fd, 16, base + 8 * i)) for i in idx]

    @property
    def metadata(self) -> dict:
        return {"format": "textlines", "count": len(self), "fields": ["txt"], "field_counts": {"txt": len(self)}}

    def __len__(self) -> int:
        return len(self._offsets()) - _HEADER - 1

    def key(self, index: int) -> str:
        return line_key(self._check_index(index))

    def index_of(self, key: str) -> int | None:
        if not key.isdigit():
            return None
        i = int(key)
        return i if i < len(self) and line_key(i) == key else None

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        i = self._check_index(index)
        ((start, end),) = self._spans([i])
        out: dict[str, Any] = {"__key__": line_key(i), "__index__": i}
        if fields is None or "txt" in fields:
            out["txt"] = self._line(start, end)
        return out

    def _line(self, start: int, end: int) -> bytes:
        """The line's bytes without its line end (``\n`` or ``\r\n``)."""
        assert self._fd is not None  # opened by _offsets, which _spans calls first
        data = os.pread(self._fd, end - start, start)
        if start == 0:
            data = data.removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte-order mark is not line 0's text
        if data.endswith(b"\n"):
            data = data[:-1]
        if data.endswith(b"\r"):
            data = data[:-1]
        return data

    def read_many(
        self, indices: Sequence[int], fields: Sequence[str], views: bool = False
    ) -> tuple[list[str], dict[str, list]]:
        """The batch's lines: one ``pread`` for each line's offsets and one for its bytes."""
        idx = self._check_indices(indices)
        columns: dict[str, list] = {f: [None] * len(idx) for f in fields}
        if "txt" in columns:
            columns["txt"] = [self._line(start, end) for start, end in self._spans(idx)]
        return [line_key(i) for i in idx], columns

    def field_size(self, index: int, field: str) -> int:
        """The line's span in the file, line end included (no read: enough to bucket by length)."""
        return int(self.field_sizes([index], field)[0])

    def field_sizes(self, indices: Sequence[int], field: str) -> np.ndarray:
        idx = self._check_indices(indices)
        if field != "txt":
            return np.zeros(len(idx), dtype=np.int64)
        return np.fromiter((end - start for start, end in self._spans(idx)), dtype=np.int64, count=len(idx))


def _pair_format(table: np.ndarray) -> struct.Struct:
    """Two int64 entries of the index as stored (numpy writes them in native byte order)."""
    return struct.Struct({"<": "<", ">": ">"}.get(table.dtype.byteorder, "=") + "qq")


def _read_pair(path: Path, table: np.memmap, entry: int) -> tuple[int, int]:
    with open(path, "rb") as f:
        f.seek(table.offset + 8 * entry)
        return _pair_format(table).unpack(f.read(16))
