"""Arrow and Parquet tables read in place as stores: a folder written by
``datasets.Dataset.save_to_disk`` (Arrow IPC files, memory-mapped) or Parquet files (one, a
folder of them, or a list), with random access by row and only the asked columns decoded.

Each column is a field: binary and string columns as their bytes, an HF ``Image`` or ``Audio``
struct (``{bytes, path}``) as its bytes, numbers as their text (what :class:`~mmloader.LabelReader`
parses), anything else (lists, other structs) as JSON. A ``__key__`` column (or ``key``, as
img2dataset writes) gives the keys; otherwise a row's key is its number, zero-padded.

Nothing of the table's data is held in memory: Arrow files are memory-mapped (pages the OS can drop),
and a Parquet row group is decoded when a row of it is asked for and kept in a small cache
(``cache_bytes``: by default room for the row groups one shuffle window spans); a key column is
read whole (to check it, and per process on a first lookup by key). A process opens the
files itself (handles never travel to workers).
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...errors import FormatError
from ..base import Store
from ..remote.urls import is_url

log = logging.getLogger("mmloader")

#: the columns that give keys, in order of preference
KEY_COLUMNS = ("__key__", "key")


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError("reading Arrow and Parquet tables needs pyarrow: pip install 'mmloader[parquet]'") from None
    return pa


def is_table(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``save_to_disk`` folder, a Parquet file or a folder of Parquet files."""
    p = Path(path)
    if p.is_file():
        return p.suffix.lower() == ".parquet"
    return p.is_dir() and (
        (p / "state.json").is_file() or (p / "dataset_dict.json").is_file() or any(p.glob("*.parquet"))
    )


def table_files(path: str | os.PathLike) -> tuple[str, list[Path]]:
    """(``"arrow"`` or ``"parquet"``, the files in row order) of a table; a FormatError names
    what is wrong (a ``DatasetDict`` folder: name a split)."""
    p = Path(path)
    if p.is_file():
        return "parquet", [p]
    if (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if (d / "state.json").is_file())
        raise FormatError(f"{p} holds a DatasetDict (splits {', '.join(splits)}): open one split, e.g. {p / splits[0]}")
    state = p / "state.json"
    if state.is_file():
        try:
            names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{state}: not a state.json written by datasets' save_to_disk ({e})") from None
        files = [p / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FormatError(f"{state} lists {len(missing)} missing Arrow file(s): {', '.join(missing[:3])}")
        return "arrow", files
    files = sorted(p.glob("*.parquet"))
    if not files:
        raise FormatError(f"{p} is not an Arrow folder (state.json) and holds no .parquet files")
    return "parquet", files


def _cell_kind(t) -> str:
    """How a column's cells become bytes: bytes, text, struct (HF Image/Audio), number or json.
    A dictionary-encoded column (pandas ``category``) is its values' kind."""
    pa = _pa()
    if pa.types.is_dictionary(t):
        return _cell_kind(t.value_type)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if getattr(pa.types, "is_binary_view", lambda _t: False)(t):
        return "bytes"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t):
        return "text"
    if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} in ({"bytes"}, {"bytes", "path"}):
        return "struct"  # datasets' Image and Audio: {bytes, path}; any other struct is JSON
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    return "json"


def _hf_features(schema) -> dict[str, str]:
    """Column -> the ``_type`` of its feature in the ``huggingface`` schema metadata that datasets
    writes (``save_to_disk``, ``to_parquet``): ``Image``, ``Audio``, ``Value``...; empty without it."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
        return {name: str(f.get("_type", "")) for name, f in features.items() if isinstance(f, dict)}
    except (KeyError, ValueError, TypeError, AttributeError):
        return {}


#: First bytes of the image, audio and video files a binary column may hold.
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")
_AUDIO_MAGIC = (b"fLaC", b"OggS", b"ID3")


def _media_kind(data: bytes | None) -> str | None:
    """``image``, ``audio`` or ``video`` from a value's first bytes, or None.

    >>> _media_kind(b"\\x89PNG\\r\\n\\x1a\\n..."), _media_kind(b"fLaC..."), _media_kind(b"\\0\\0\\0\\x18ftypisom")
    ('image', 'audio', 'video')
    """
    if not data:
        return None
    head = bytes(data[:16])
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return "image"
    if len(head) > 2 and head[0] == 0x50 and head[1] in b"123456" and head[2] in b" \t\r\n#":
        return "image"  # netpbm (ppm, pgm)
    if head.startswith(_AUDIO_MAGIC) or (head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"):
        return "audio"
    if head[4:8] == b"ftyp":
        return "audio" if head[8:12] in (b"M4A ", b"M4B ") else "video"
    if head[:4] == b"\x1a\x45\xdf\xa3" or (head[:4] == b"RIFF" and head[8:11] == b"AVI"):
        return "video"
    return None


def _is_json_text(data: bytes | None) -> bool:
    """Whether a text value is a JSON object or array."""
    if not data or data.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _json_default(value: Any):
    """JSON for what a table holds that JSON does not: bytes as base64 text, the rest as text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode()
    return str(value)


def _is_view(t) -> bool:
    pa = _pa()
    return any(getattr(pa.types, f, lambda _t: False)(t) for f in ("is_string_view", "is_binary_view"))


class ArrowStore(Store):
    """A table as a store; see the module's text.

    Args:
        path: a ``save_to_disk`` folder, a Parquet file, or a folder of Parquet files.
        cache_bytes: decoded Parquet row groups kept per process (bytes); default: room for the
            row groups a shuffle window (16,384 rows) spans, at least 64 MiB, at most 2 GiB.
        storage_options: client settings for a table on object storage or the Hub.
        remote: ``retry_deadline``, ``request_timeout`` for a table on object storage.

    >>> ds = ArrowStore("hf-dataset/"); ds[0]["image"][:4], ds.fields   # doctest: +SKIP
    """

    format = "arrow"

    def __init__(
        self,
        path: str | os.PathLike,
        cache_bytes: int | None = None,
        storage_options: dict | None = None,
        **remote,
    ):
        self.path = str(path)
        self.location = None
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

    # -- what a column holds -----------------------------------------------------------------------------
    #: Record batches or row groups looked at, per column, for a first value to tell its kind by.
    KIND_PROBES = 4

    def field_kind(self, name: str) -> str | None:
        """What column ``name`` holds, as the readers' kinds name it (what a refusal that proposes
        other columns for a reader compares): ``image``, ``audio`` or ``video`` (an HF
        ``Image``/``Audio``/``Video`` feature, or bytes whose first value begins as such a file
        does), ``text`` (strings), ``label`` (integers), ``number`` (floats, booleans), ``json``
        (lists, other structs, strings of JSON objects); None for bytes of no known format (the
        column's name may tell). A binary or string column's first value is read to tell it (in
        a few row groups at most)."""
        feature = {"Image": "image", "Audio": "audio", "Video": "video"}.get(self.features.get(name, ""))
        if feature is not None:
            return feature
        kind = self.kinds.get(name)
        if kind in ("bytes", "struct"):
            return _media_kind(self._first_value(name))
        if kind == "text":  # JSON written as text (a string column of objects) is JSON
            return "json" if _is_json_text(self._first_value(name)) else "text"
        return {"integer": "label", "number": "number", "json": "json"}.get(kind or "")

    def _first_value(self, name: str) -> bytes | None:
        """The first non-null value of column ``name`` among its first few record batches or row
        groups (None if they hold none, or a path that is no file here)."""
        import pyarrow.compute as pc

        for _f, row, cells in self._probed_parts(name):
            if cells.null_count == len(cells):
                continue
            at = pc.index(cells.is_valid(), True).as_py()
            try:
                return self._encode(name, cells[at].as_py(), row + at)
            except (FormatError, OSError):
                return None
        return None

    def _probed_parts(self, name: str):
        """(file, first row, cells) of column ``name``'s first :attr:`KIND_PROBES` record batches
        (memory-mapped) or row groups (decoded, through the row-group cache)."""
        looked = 0
        for f in range(len(self.files)):
            h = self._handle(f)
            row = int(self.starts[f])
            if self.kind == "arrow":
                parts = list(h.column(name).chunks)
            else:
                parts = list(range(h.metadata.num_row_groups))
            for part in parts:
                if looked >= self.KIND_PROBES:
                    return
                looked += 1
                cells = part if self.kind == "arrow" else self._group(f, part, name)
                yield f, row, cells
                row += len(cells)

    # -- reading ---------------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict:
        return self._meta

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _column(self, f: int, rows: np.ndarray, name: str) -> list:
        """The cells of ``rows`` (within file ``f``, ascending) of column ``name``, as Python values."""
        h = self._handle(f)
        if self.kind == "arrow":
            # chunk by chunk: ChunkedArray.take concatenates every chunk first (the whole column
            # copied for each batch: 185 ms against 4 ms for 64 rows of a 400 MB column)
            column = h.column(name)
            starts = self._chunk_starts(f, name, column)
            which = np.searchsorted(starts, rows, side="right") - 1
            values: list = []
            for c in np.unique(which).tolist():
                chunk = column.chunk(c)
                if _is_view(chunk.type):  # no take kernel for view types
                    chunk = chunk.cast(_pa().large_binary() if "binary" in str(chunk.type) else _pa().large_string())
                values += chunk.take(rows[which == c] - starts[c]).to_pylist()
            return values
        bounds = self._bounds.get(f)
        if bounds is None:
            meta = h.metadata
            bounds = self._bounds[f] = np.concatenate(
                [[0], np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])]
            )
        out: list = []
        groups = np.searchsorted(bounds, rows, side="right") - 1
        for g in np.unique(groups).tolist():
            local = rows[groups == g] - bounds[g]
            out += self._group(f, g, name).take(local).to_pylist()
        return out

    def _chunk_starts(self, f: int, name: str, column) -> np.ndarray:
        """The first row of each chunk (record batch) of a memory-mapped column."""
        key = (f, name)
        starts = self._starts_of.get(key)
        if starts is None:
            starts = self._starts_of[key] = np.concatenate([[0], np.cumsum([len(c) for c in column.chunks])])
        return starts

    def _group(self, f: int, g: int, name: str):
        """One decoded column of one row group, from the cache (least recently used dropped)."""
        key = (f, g, name)
        with self._lock:
            hit = self._groups.get(key)
            if hit is not None:
                self._groups.move_to_end(key)
                return hit
            decoding = self._decoding.setdefault(key, threading.Lock())
        with decoding:  # threads asking for one row group decode it once
            with self._lock:
                hit = self._groups.get(key)
            if hit is not None:
                return hit
            col = self._handle(f).read_row_group(g, columns=[name]).column(0).combine_chunks()
            with self._lock:
                self._groups[key] = col
                self._held += col.nbytes
                while self._held > self.cache_bytes and len(self._groups) > 1:
                    _k, old = self._groups.popitem(last=False)
                    self._held -= old.nbytes
                self._decoding.pop(key, None)
        return col

    def _cells(self, indices: Sequence[int], name: str) -> list:
        """Column ``name`` of rows ``indices`` (any order), as Python values."""
        idx = np.asarray(indices, dtype=np.int64)
        out: list = [None] * len(idx)
        files = np.searchsorted(self.starts, idx, side="right") - 1
        for f in np.unique(files).tolist():
            at = np.flatnonzero(files == f)
            local = idx[at] - self.starts[f]
            order = np.argsort(local, kind="stable")
            values = self._column(f, local[order], name)
            for j, v in zip(at[order].tolist(), values):
                out[j] = v
        return out

    def _encode(self, name: str, value: Any, row: int) -> bytes | None:
        if value is None:
            return None
        kind = self.kinds[name]
        if kind == "bytes":
            return value
        if kind == "text":
            return value.encode()
        if kind == "struct":
            data, path = value.get("bytes"), value.get("path")
            if data is not None:
                return data
            if path and os.path.isabs(path) and os.path.isfile(path):
                with open(path, "rb") as fh:  # datasets keeps a local file's path, not its bytes
                    return fh.read()
            if path:
                raise FormatError(
                    f"{self.path}: row {row}, column {name!r} holds only a path ({path!r}) that is not a file here"
                )
            return None
        if kind in ("number", "integer"):
            return str(int(value) if isinstance(value, bool) else value).encode()
        return json.dumps(value, default=_json_default).encode()

    def content_digest(self) -> str:
        """A digest of the table's content without reading its rows (what resumes compare): the
        schema and counts, and per file its row groups' sizes and column statistics (Parquet
        footers) or datasets' own fingerprint of the Arrow files (``state.json``)."""
        import hashlib

        known: str | None = getattr(self, "_digest", None)
        if known is not None:  # every checkpoint asks: the footers are read once
            return known
        h = hashlib.sha256(json.dumps(self._meta, sort_keys=True, default=str).encode())
        if self.kind == "arrow":
            state = os.path.join(self.path, "state.json")
            with open(state, "rb") as f:
                h.update(json.dumps(json.load(f).get("_fingerprint"), default=str).encode())
            for name in self.files:
                h.update(f"{os.path.basename(name)}:{os.path.getsize(name)}".encode())
        else:
            pa = _pa()
            for i, name in enumerate(self.files):
                meta = pa.parquet.ParquetFile(self._source(i)).metadata
                h.update(os.path.basename(name).encode())
                for g in range(meta.num_row_groups):
                    group = meta.row_group(g)
                    h.update(f"{group.num_rows}:{group.total_byte_size}".encode())
                    for c in range(group.num_columns):
                        col = group.column(c)
                        stats = col.statistics
                        h.update(f"{col.total_compressed_size}:{stats.to_dict() if stats is not None else ''}".encode())
        self._digest = h.hexdigest()[:32]
        return self._digest

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

    def key(self, index: int) -> str:
        i = self._check_index(index)
        if self.key_column is None:
            return f"{i:08d}"
        return self._key_text(self._cells([i], self.key_column)[0])

    def index_of(self, key: str) -> int | None:
        if self.key_column is None:
            return int(key) if key.isdigit() and int(key) < len(self) and key == f"{int(key):08d}" else None
        if self._key_index is None:  # built once per process, on the first lookup: O(log n) after
            keys = np.array(self._all_keys(), dtype=object)
            order = np.argsort(keys, kind="stable")
            self._key_index = (keys[order], order)
        ordered, rows = self._key_index
        at = int(np.searchsorted(ordered, key))
        return int(rows[at]) if at < len(ordered) and ordered[at] == key else None

    def read_many(self, indices, fields, views: bool = False):
        idx = self._check_indices(indices)
        unknown = [f for f in fields if f not in self.kinds]
        if unknown:
            raise KeyError(f"{self.path} has no column {unknown[0]!r} (columns: {', '.join(self._meta['fields'])})")
        keys = (
            [f"{i:08d}" for i in idx]
            if self.key_column is None
            else [self._key_text(k) for k in self._cells(idx, self.key_column)]
        )
        columns = {name: [self._encode(name, v, i) for v, i in zip(self._cells(idx, name), idx)] for name in fields}
        return keys, columns

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        i = self._check_index(index)
        names = list(self._meta["fields"] if fields is None else fields)
        keys, columns = self.read_many([i], names)
        out: dict[str, Any] = {"__key__": keys[0], "__index__": i}
        out.update({k: v[0] for k, v in columns.items() if v[0] is not None})
        return out


def _remote_files(url: str, storage_options: dict | None, remote: dict):
    """(the folder's Location, [(name, size)] of its Parquet files) of a table URL: a folder of
    ``.parquet`` files, or one file."""
    from ..remote import Location, Policy

    policy = Policy.from_env(**{k: remote.pop(k) for k in ("retry_deadline", "request_timeout") if k in remote})
    if remote:
        raise TypeError(f"{url}: options {sorted(remote)} do not apply to Parquet tables")
    one = url.rstrip("/").endswith(".parquet")
    folder, _, name = url.rstrip("/").rpartition("/") if one else (url, "", "")
    location = Location(folder, storage_options or {}, policy)
    if one:
        size = location.size(name, purpose="meta")
        if size is None:
            raise FileNotFoundError(f"{location.name_url(name)}: no such file")
        return location, [(name, size)]
    names = [(n, size) for n, size in location.list(purpose="meta") if n.endswith(".parquet") and "/" not in n]
    if not names:
        raise FormatError(f"{location.shown} holds no .parquet file")
    return location, sorted(names)


class RangedFile(io.RawIOBase):
    """A file on object storage or the Hub as pyarrow reads it: each read one ranged GET (pyarrow
    reads a file's footer, then whole column chunks).

    Args:
        location: the folder.
        name: the file's name in it.
        size: its size in bytes.
    """

    def __init__(self, location, name: str, size: int):
        super().__init__()
        self.location, self.name, self._size, self._pos = location, name, int(size), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + int(offset))
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self.location.get_ranges([(self.name, self._pos, end)])[0]
        self._pos = end
        return bytes(data)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _column_of(leaf: str, names: Sequence[str]) -> str:
    """The top-level column a Parquet leaf (``path_in_schema``) belongs to: a name may hold dots
    itself (``seg.png``), so the longest column name that is the leaf or begins it."""
    best = ""
    for name in names:
        if (leaf == name or leaf.startswith(name + ".")) and len(name) > len(best):
            best = name
    return best or leaf.split(".")[0]
