"""An Arrow or Parquet table opened as a store: its files read once at open (schemas checked to
agree, rows counted per file, nulls per column, the row-group cache sized), its key column
checked, and per-process file handles. The base of
:class:`~mmloader.storage.arrow.store.ArrowStore`, which reads rows and columns; kept apart so
opening and checking a table is one job.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ...errors import FormatError
from ..base import Store
from ..remote.urls import is_url
from .files import RangedFile, _column_of, _pa, _remote_files, table_files
from .kinds import _cell_kind, _hf_features

log = logging.getLogger("mmloader")

#: the columns that give keys, in order of preference
KEY_COLUMNS = ("__key__", "key")


class ArrowTable(Store):
    """A table's files opened and checked, with per-process handles; see
    :class:`~mmloader.storage.arrow.store.ArrowStore` (its arguments, and its reads)."""

    def __init__(
        self,
        path: str | os.PathLike,
        cache_bytes: int | None = None,
        storage_options: dict | None = None,
        **remote,
    ):
        self.path = str(path)
        self.location: Any = None
        self.sizes: list[int] = []
        if is_url(self.path):  # Parquet on object storage or the Hub: column chunks by ranged GETs
            self.location, names = _remote_files(self.path, storage_options, remote)
            self.path = self.location.shown
            self.kind, self.files = "parquet", [n for n, _size in names]
            self.sizes = [size for _n, size in names]
        else:
            self.kind, files = table_files(path)
            self.files = [str(f) for f in files]
        pa = _pa()
        group_rows: list[int] = []  # rows and bytes of the largest row group (sizing the cache)
        group_bytes = 0
        uncounted: dict[str, int] = {}  # Parquet columns whose statistics give no null count -> bytes
        schema = None
        counts: list[int] = []
        nulls: dict[str, int] = {}
        for i, f in enumerate(self.files):
            try:
                if self.kind == "parquet":
                    meta = pa.parquet.ParquetFile(self._source(i)).metadata
                    file_schema = meta.schema.to_arrow_schema()
                    counts.append(meta.num_rows)
                    for rg in range(meta.num_row_groups):
                        group = meta.row_group(rg)
                        group_rows.append(group.num_rows)
                        group_bytes = max(group_bytes, group.total_byte_size)
                        for c in range(group.num_columns):
                            col = group.column(c)
                            stats, leaf = col.statistics, col.path_in_schema
                            name = _column_of(leaf, file_schema.names)
                            # a row's value is missing where the column is null: the statistics say
                            # it of a flat column, and of an Image/Audio struct through its bytes
                            counted = leaf == name or leaf == f"{name}.bytes"
                            if counted and stats is not None and stats.has_null_count:
                                nulls[name] = nulls.get(name, 0) + stats.null_count
                            elif leaf != f"{name}.path":
                                uncounted[name] = uncounted.get(name, 0) + col.total_compressed_size
                else:
                    table = self._read_ipc(f)
                    file_schema = table.schema
                    counts.append(table.num_rows)
                    for name in table.column_names:
                        nulls[name] = nulls.get(name, 0) + table.column(name).null_count
            except (OSError, pa.ArrowInvalid) as e:
                raise FormatError(f"{f}: not a readable {self.kind} file ({e})") from None
            if schema is None:
                schema = file_schema
            elif not file_schema.equals(schema, check_metadata=False):
                raise FormatError(f"{f}: its columns differ from those of {self.files[0]} ({file_schema} vs {schema})")
        assert schema is not None
        self.cache_bytes = self._cache_size(cache_bytes, group_rows, group_bytes)
        self.kinds = {name: _cell_kind(schema.field(name).type) for name in schema.names}
        self.features = _hf_features(schema)  # column -> datasets' feature type ("Image", "Value"...)
        self.key_column = next((c for c in KEY_COLUMNS if self.kinds.get(c) in ("text", "integer", "bytes")), None)
        #: keys are row numbers (no key column): they name other rows in another table
        self.synthetic_keys = self.key_column is None
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        n = int(self.starts[-1])
        for name, nbytes in uncounted.items():  # nested columns, files written without statistics
            nulls[name] = self._count_nulls(name, nbytes, nulls.get(name, 0))
        fields = [c for c in schema.names if c != self.key_column]
        self._meta: dict[str, Any] = {
            "format": self.kind,
            "count": n,
            "fields": fields,
            "field_counts": {c: n - nulls.get(c, 0) for c in fields},
            "columns": {c: str(schema.field(c).type) for c in schema.names},
        }
        self._reset()
        if self.key_column is not None:
            self._check_keys()

    # -- per-process handles ---------------------------------------------------------------------------
    def reads_object_storage(self) -> bool:
        return self.location is not None

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._open: dict[int, Any] = {}
        self._groups: OrderedDict[tuple[int, int, str], Any] = OrderedDict()  # decoded row groups
        self._held = 0
        self._starts_of: dict[tuple[int, str], np.ndarray] = {}  # (file, column) -> chunk starts
        self._decoding: dict[tuple[int, int, str], threading.Lock] = {}  # row groups being decoded
        self._bounds: dict[int, np.ndarray] = {}  # file -> first row of each row group
        self._key_index: tuple[np.ndarray, np.ndarray] | None = None  # sorted keys, their rows

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("_lock", "_open", "_groups", "_held", "_pid", "_starts_of", "_decoding", "_bounds", "_key_index"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    #: Columns without a recorded null count are read at open to count them up to this size.
    MAX_COUNTED_BYTES = 256 << 20

    def _count_nulls(self, name: str, nbytes: int, known: int) -> int:
        """Rows where column ``name`` is null, read from the files (what zip's coverage check and
        the readers' field alternatives need); for a column too large to read, the nulls the
        statistics did record (``known``), the rest taken as present."""
        if nbytes > self.MAX_COUNTED_BYTES:
            log.warning(
                "%s: column %r records no null count (nested, or written without statistics) and is too large to "
                "count at open: every row is taken to have it; a row without it is an error when it is read",
                self.path,
                name,
            )
            return known
        pa = _pa()
        return sum(
            pa.parquet.ParquetFile(self._source(i)).read(columns=[name]).column(0).null_count
            for i in range(len(self.files))
        )

    #: Rows a shuffled read touches at once: the Stream's default shuffle window (16 blocks of 1,024).
    WINDOW_ROWS = 16 * 1024
    #: The most the automatic cache takes per process.
    MAX_AUTO_CACHE = 2 << 30

    def _cache_size(self, given: int | None, group_rows: list[int], group_bytes: int) -> int:
        """``cache_bytes``, or (None) enough for the row groups a shuffle window spans: a row
        group is decoded whole, and one evicted while its rows are still being asked for is
        decoded again (measured: 295 samples/s with room for 2 of 5 groups, 3,000 with all)."""
        if given is not None:
            if not isinstance(given, int) or isinstance(given, bool) or given < 0:
                raise ValueError(f"cache_bytes={given!r}: expected a number of bytes >= 0")
            return given
        rows = [r for r in group_rows if r]
        if not rows:
            return 0
        typical = max(int(np.median(rows)), 1)  # (a file's short last row group is not typical)
        need = (-(-self.WINDOW_ROWS // typical) + 1) * group_bytes
        if need > self.MAX_AUTO_CACHE and group_bytes > (128 << 20):
            log.warning(
                "%s: row groups of %d MB: a shuffled read spans more of them than %d GB holds, so some are "
                "decoded more than once; write the table with smaller row groups (about 64-128 MB) or convert "
                "it (`mmloader convert parquet`)",
                self.path,
                group_bytes >> 20,
                self.MAX_AUTO_CACHE >> 30,
            )
        return int(min(max(need, 64 << 20), self.MAX_AUTO_CACHE))

    def _source(self, f: int):
        """File ``f`` as pyarrow reads it: a local path, or a file whose reads are ranged GETs."""
        if self.location is None:
            return self.files[f]
        return RangedFile(self.location, self.files[f], self.sizes[f])

    @staticmethod
    def _read_ipc(path: str):
        pa = _pa()
        source = pa.memory_map(path)  # zero-copy: the columns are views of the mapped file
        try:
            return pa.ipc.open_stream(source).read_all()  # what save_to_disk writes
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all()

    def _handle(self, f: int):
        if self._pid != os.getpid():
            self._reset()
        h = self._open.get(f)
        if h is None:
            with self._lock:
                h = self._open.get(f)
                if h is None:
                    pa = _pa()
                    if self.kind == "parquet":
                        source = self._source(f)
                        h = pa.parquet.ParquetFile(source, memory_map=isinstance(source, str))
                    else:
                        h = self._read_ipc(self.files[f])
                    self._open[f] = h
        return h

    @staticmethod
    def _key_text(value: Any) -> str:
        """A key as text: bytes decoded (hex when they are no UTF-8: digests), integers written
        out (what key() and index_of() share)."""
        if isinstance(value, (bytes, bytearray)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return bytes(value).hex()
        return str(value)

    def _all_keys(self) -> list[str]:
        """Every key, in row order (the key column read whole, once: it is small)."""
        out: list[str] = []
        assert self.key_column is not None
        for f in range(len(self.files)):
            h = self._handle(f)
            col = h.column(self.key_column) if self.kind == "arrow" else h.read(columns=[self.key_column]).column(0)
            out += [self._key_text(v) if v is not None else None for v in col.to_pylist()]  # type: ignore[misc]
        return out

    def _check_keys(self) -> None:
        """A key column must name each row once: a missing or repeated key would pair one row's
        image with another's caption when readers are zipped by key."""
        keys = self._all_keys()
        missing = next((i for i, k in enumerate(keys) if k is None or k == ""), None)
        twice = None
        if len(set(keys)) != len(keys):
            seen: set[str] = set()
            twice = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        if missing is None and twice is None:
            return
        problem = f"is empty at row {missing}" if missing is not None else f"holds {twice!r} more than once"
        if self.key_column == "key":  # a column that merely is called key (a music key, a label): data
            log.warning("%s: column 'key' %s, so it is read as data and rows are keyed by number", self.path, problem)
            self.key_column, self.synthetic_keys = None, True
            self._meta["fields"] = list(self.kinds)
            self._meta["field_counts"]["key"] = sum(k is not None for k in keys)
            return
        raise FormatError(f"{self.path}: column {self.key_column!r} (the keys) {problem}: keys must name each row once")
