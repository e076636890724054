"""Random access to a directory of tar shards through mmloader's manifest and offset indexes."""

from __future__ import annotations

import bisect
import json
import mmap
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from ...errors import FormatError, RandomAccessError, SampleError
from ..base import Store, key_hasher
from ..keys import split_member_name
from ..meta import TAR_FORMATS
from .index import MANIFEST
from .layout import sha256_file
from .stages import group_samples, tar_members

MAX_OPEN_SHARDS = 64  # bounded per-process cache of open shard files and index maps


def compressed_shard(where: str) -> RandomAccessError:
    """The error for a random read of a compressed shard (local or remote)."""
    return RandomAccessError(
        f"shard {where} is compressed: it can only be read sequentially "
        "(store.iter_samples()). For random access, shuffling and DDP splitting, "
        "decompress it (e.g. `gunzip -c x.tgz > x.tar`) and run `mmloader index` again."
    )


def checked_index(table: np.ndarray, shard: dict) -> np.ndarray:
    """A shard's offset index, refused if its rows are not the manifest's count of samples."""
    if table.shape[0] != shard["count"]:
        raise FormatError(
            f"{shard['index']}: {table.shape[0]} rows but the manifest lists {shard['count']} samples for {shard['file']}"
        )
    return table


class TarStore(Store):
    """Map-style access to tar shards: ``store[i]`` is one ``pread`` per field, no scan.

    >>> ds = TarStore("shards/")                    # doctest: +SKIP
    >>> ds[5]["txt"], ds.get("0005")["__index__"]     # doctest: +SKIP
    """

    format = "tar"

    def __init__(self, path: str | os.PathLike, *, check_headers: bool = True, verify_checksums: bool = False):
        """``check_headers``: each read also fetches the 512-byte tar header before the data
        (same ``pread``) and checks that it names the expected member and size, so an offset
        index that does not match its shard is an error, never wrong bytes passed on.
        ``verify_checksums``: hash each shard against the manifest on first use in a process."""
        self.check_headers, self.verify_checksums = check_headers, verify_checksums
        p = Path(path).resolve()
        self.manifest_path = p / MANIFEST if p.is_dir() else p
        self.path = str(self.manifest_path.parent)
        if not self.manifest_path.is_file():
            has_tars = p.is_dir() and (any(p.glob("*.tar*")) or any(p.glob("*.tgz")))
            hint = " (it holds tar files: run `mmloader index DIR` to index them)" if has_tars else ""
            raise FormatError(f"{self.path} has no {MANIFEST}{hint}")
        self._meta: dict | None = None
        self._reset_handles()

    def _reset_handles(self) -> None:
        self._lock = threading.Lock()  # the LRU caches below are shared by a thread-backend's threads
        self._pid = os.getpid()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._closing: int | None = None
        self._idx: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keys: np.ndarray | None = None
        self._order: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {
            "path": str(self.manifest_path),
            "_meta": self._meta,
            "check_headers": self.check_headers,
            "verify_checksums": self.verify_checksums,
        }

    def __setstate__(self, state: dict) -> None:
        self.check_headers = state.get("check_headers", True)
        self.verify_checksums = state.get("verify_checksums", False)
        self.manifest_path = Path(state["path"])
        self.path = str(self.manifest_path.parent)
        self._meta = state["_meta"]
        self._reset_handles()

    # os functions bound here: at interpreter exit the module's globals may be gone before this runs
    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:
        if getattr(self, "_pid", None) == _getpid():  # never close descriptors a parent owns
            for fd in [*getattr(self, "_fds", {}).values(), getattr(self, "_closing", None)]:
                if fd is not None:
                    try:
                        _close(fd)
                    except OSError:
                        pass

    @property
    def metadata(self) -> dict:
        if self._meta is None:
            try:
                text = self.manifest_path.read_text()
            except OSError as e:
                raise FormatError(f"{self.manifest_path}: unreadable manifest: {e}") from e
            self._meta = prepare_manifest(text, self.manifest_path)
        return self._meta

    @property
    def shards(self) -> list[dict]:
        return self.metadata["shards"]

    def shard_path(self, s: int) -> str:
        return os.path.join(self.path, self.shards[s]["file"])

    def __len__(self) -> int:
        return int(self.metadata["count"])

    def _local(self) -> None:
        if self._pid != os.getpid():  # inherited through fork: never reuse the parent's descriptors
            self._reset_handles()

    def key_table(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, order): every key as fixed-width bytes in index order, and the argsort that
        sorts them (both memory-mapped), e.g. for ``verify`` and ``merge``."""
        return self._key_arrays()

    def first_index(self, s: int) -> int:
        """Dataset index of shard ``s``'s first sample."""
        return self.metadata["_starts"][s]

    def offset_table(self, s: int) -> np.ndarray:
        """Shard ``s``'s offset index: (samples, fields, 2) int64 data offsets and sizes (-1: absent),
        columns in the order of ``shards[s]["fields"]``."""
        return self._shard_index(s)

    def _key_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        self._local()
        # into locals: another thread may have set _keys and not yet _order (then both load here)
        keys, order = self._keys, self._order
        if keys is None or order is None:
            meta = self.metadata
            keys = np.load(os.path.join(self.path, meta["keys"]), mmap_mode="r", allow_pickle=False).view(np.ndarray)
            order = np.load(os.path.join(self.path, meta["key_order"]), mmap_mode="r", allow_pickle=False)
            self._keys, self._order = keys, order
        return keys, order

    def key(self, index: int) -> str:
        return bytes(self._key_arrays()[0][self._check_index(index)]).decode("utf-8")

    def key_digest(self) -> str:
        """:meth:`KeysView.fingerprint`, read from the mapped key table in chunks."""
        keys, _order = self._key_arrays()
        h = key_hasher(len(keys))
        for start in range(0, len(keys), 65536):
            for k in keys[start : start + 65536].tolist():
                h.update(b"\0" + k)
        return h.hexdigest()

    def _keys_at(self, idx: np.ndarray) -> list[str]:
        """The keys of samples ``idx`` (checked indices), in order."""
        keys_arr, _ = self._key_arrays()
        return [k.decode("utf-8") for k in keys_arr[idx].tolist()]

    def index_of(self, key: str) -> int | None:
        keys, order = self._key_arrays()
        kb = key.encode("utf-8")
        lo, hi = 0, len(order)
        while lo < hi:  # binary search over the mmapped sorted view: O(log n) page touches
            mid = (lo + hi) // 2
            if keys[order[mid]] < kb:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(order) and keys[order[lo]] == kb:
            return int(order[lo])
        return None

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, row within shard) of sample ``index``."""
        i = self._check_index(index)
        s = bisect.bisect_right(self.metadata["_starts"], i) - 1
        return s, i - self.metadata["_starts"][s]

    def _shard_index(self, s: int) -> np.ndarray:
        self._local()
        with self._lock:
            return self._shard_index_locked(s)

    def _shard_index_locked(self, s: int) -> np.ndarray:
        table = self._idx.get(s)
        if table is None:
            if self.shards[s]["compressed"]:
                raise compressed_shard(self.shard_path(s))
            table = checked_index(map_offsets(os.path.join(self.path, self.shards[s]["index"])), self.shards[s])
            self._idx[s] = table
            if len(self._idx) > MAX_OPEN_SHARDS:
                self._idx.popitem(last=False)
        else:
            self._idx.move_to_end(s)
        return table

    def _fd(self, s: int) -> int:
        """An open descriptor of shard ``s`` (bounded LRU). Data is read with ``pread``, not
        mmap: mapped pages would count as this worker's private memory (USS) and grow with the
        part of the dataset it has touched; ``pread`` copies from the shared page cache."""
        with self._lock:
            fd = self._fds.get(s)
            if fd is not None:
                self._fds.move_to_end(s)
                return fd
            path = self.shard_path(s)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise FormatError(f"shard {path} is listed in {self.manifest_path} but missing on disk") from None
            except OSError as e:
                raise FormatError(
                    f"shard {path} (of {self.manifest_path}) cannot be opened: {e.strerror or e}"
                ) from None
            if self.verify_checksums:
                digest = sha256_file(path)
                if digest != self.shards[s]["sha256"]:
                    os.close(fd)
                    raise FormatError(
                        f"shard {path}: sha256 {digest[:12]}... does not match the manifest's "
                        f"{self.shards[s]['sha256'][:12]}...: the file changed since it was written"
                    )
            self._fds[s] = fd
            if len(self._fds) > MAX_OPEN_SHARDS:
                # Closed only once no reader thread can be using it: threads read under the GIL
                # between lookup and pread, so defer the close to the next eviction.
                old = self._fds.popitem(last=False)[1]
                if self._closing is not None:
                    os.close(self._closing)
                self._closing = old
            return fd

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        i = self._check_index(index)
        keys, columns = self.read_many([i], self.fields if fields is None else fields)
        out: dict[str, Any] = {"__key__": keys[0], "__index__": i}
        out.update((f, values[0]) for f, values in columns.items() if values[0] is not None)
        return out

    def read_many(self, indices, fields, views: bool = False):
        """A batch at once: lookups vectorised over the batch, then one ``pread`` per sample
        (one per field when big fields nobody asked for sit between the wanted ones).

        ``views``: values are zero-copy memoryviews of the bytes read, not copies.
        """
        layout = self._batch_layout(indices, fields)
        if layout.done:
            return layout.keys, layout.columns
        keys, columns, groups, shard_of = layout.keys, layout.columns, layout.groups, layout.shard_of
        offs_l, sizes_l, lo_l, hi_l, one_read, head = (
            layout.offs,
            layout.sizes,
            layout.lo,
            layout.hi,
            layout.one_read,
            layout.head,
        )
        # Shard by shard: each descriptor is used while it is the newest in the LRU, so no other
        # thread's eviction can close it under us.
        for rows in groups:
            s = int(shard_of[rows[0]])
            fd = self._fd(s)
            for j in rows.tolist():
                a, b = lo_l[j], hi_l[j]
                if b <= 0:
                    continue  # none of the wanted fields in this sample
                if one_read[j]:  # the sample's members are contiguous: one read
                    span = os.pread(fd, b - a, a)
                    for f, o, z in zip(fields, offs_l[j], sizes_l[j]):
                        if o >= 0:
                            columns[f][j] = self._member(span, a, keys[j], f, o, z, s, views)
                else:  # big fields nobody asked for sit in between: read the wanted ones alone
                    for f, o, z in zip(fields, offs_l[j], sizes_l[j]):
                        if o >= 0:
                            columns[f][j] = self._member(
                                os.pread(fd, z + head, o - head), o - head, keys[j], f, o, z, s, views
                            )
        return keys, columns

    def _batch_layout(self, indices, fields) -> "_Layout":
        """Where a batch's wanted members lie: keys, per-shard groups of batch rows, and per row
        the offsets and sizes of each field, the span ``[lo, hi)`` holding them with their
        headers, and whether one read of that span is cheaper than one read per field."""
        meta = self.metadata
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"index {bad} out of range for {self.path} ({n} samples)")
        for f in fields:
            if f not in meta["field_counts"]:
                raise KeyError(f"{self.path} has no field {f!r} (fields: {self.fields})")
        keys = self._keys_at(idx)
        columns: dict[str, list] = {f: [None] * len(idx) for f in fields}
        if not len(idx) or not fields:
            return _Layout(True, keys, columns)
        starts = meta["_starts"]
        shard_of = np.searchsorted(meta["_starts_array"], idx, side="right") - 1
        # Offsets and sizes of every wanted member: one gather per shard, the rest over the batch.
        order = np.argsort(shard_of, kind="stable")
        cuts = [0, *(np.flatnonzero(np.diff(shard_of[order])) + 1).tolist(), len(order)]
        groups = [order[c:d] for c, d in zip(cuts, cuts[1:])]
        offs = np.full((len(idx), len(fields)), -1, dtype=np.int64)
        sizes = np.zeros_like(offs)
        for rows in groups:
            s = int(shard_of[rows[0]])
            cols = meta["_columns"][s]
            have = [k for k, f in enumerate(fields) if f in cols]
            if have:
                table = self._shard_index(s)[idx[rows] - starts[s]][:, [cols[fields[k]] for k in have]]
                at = (rows[:, None], have)
                offs[at], sizes[at] = table[..., 0], table[..., 1]
        present = offs >= 0
        head = 512 if self.check_headers else 0
        lo = np.where(present, offs, np.iinfo(np.int64).max).min(1) - head
        hi = np.where(present, offs + sizes, 0).max(1)
        one_read = (hi - lo <= np.where(present, sizes, 0).sum(1) + 2048 * present.sum(1)).tolist()
        return _Layout(
            False,
            keys,
            columns,
            groups,
            shard_of,
            offs.tolist(),
            sizes.tolist(),
            lo.tolist(),
            hi.tolist(),
            one_read,
            head,
        )

    def _member(
        self, buf: bytes, base: int, key: str, field: str, offset: int, size: int, s: int, view: bool = False
    ) -> bytes | memoryview:
        """Member ``key.field`` (``size`` bytes at file ``offset``) from ``buf``, read from file
        position ``base``; checks that it was not cut short and that its tar header matches."""
        start = offset - base
        if start + size > len(buf):
            raise SampleError(
                f"shard is truncated: wanted {size} bytes at offset {offset}, got {max(len(buf) - start, 0)}",
                key=key,
                field=field,
                where=self.shard_path(s),
            )
        if self.check_headers:
            h = start - 512
            # fast path: the header names this member and holds its size as tarfile writes it
            if not (buf.startswith(f"{key}.{field}\0".encode(), h) and buf.startswith(b"%011o" % size, h + 124)):
                problem = _header_problem(buf[h:start], f"{key}.{field}", size)
                if problem:
                    raise SampleError(
                        f"offset index does not match the shard at offset {offset}: {problem}; "
                        "re-run `mmloader index` or `mmloader verify`",
                        key=key,
                        field=field,
                        where=self.shard_path(s),
                    )
        return memoryview(buf)[start : start + size] if view else buf[start : start + size]

    def field_size(self, index: int, field: str) -> int:
        s, row = self.locate(index)
        c = self.metadata["_columns"][s].get(field)
        return 0 if c is None else max(int(self._shard_index(s)[row, c, 1]), 0)

    def iter_samples(self, shards: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
        """Read shards front to back (works for compressed shards too)."""
        for s in range(len(self.shards)) if shards is None else shards:
            for sample in group_samples(tar_members(self.shard_path(s)), where=self.shard_path(s)):
                sample.pop("__offsets__")
                yield sample


class _Layout(NamedTuple):
    done: bool  # nothing to read (no sample or no field): keys and columns are the answer
    keys: list
    columns: dict
    groups: list = []
    shard_of: Any = None
    offs: list = []
    sizes: list = []
    lo: list = []
    hi: list = []
    one_read: list = []
    head: int = 0


def prepare_manifest(text: str | bytes, where: Any) -> dict:
    """A parsed manifest with the lookup tables readers use (``_starts``, ``_columns``)."""
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise FormatError(f"{where}: unreadable manifest: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") not in TAR_FORMATS:
        raise FormatError(f"{where}: unknown format {meta.get('format') if isinstance(meta, dict) else None!r}")
    starts = [0]
    for s in meta["shards"]:
        starts.append(starts[-1] + s["count"])
    meta["_starts"] = starts
    meta["_starts_array"] = np.asarray(starts, dtype=np.int64)
    meta["_columns"] = [{f: c for c, f in enumerate(s["fields"])} for s in meta["shards"]]
    return meta


_OFFSETS_HEADER = re.compile(rb"\{'descr': '<i8', 'fortran_order': False, 'shape': \((\d+), (\d+), 2\), \} *\n")


def map_offsets(path: str) -> np.ndarray:
    """A shard's offset table (``samples x fields x 2`` int64, as ``numpy.save`` writes it)
    as a read-only memory map. The header is matched by one regex: ``np.load`` parses it
    with ``ast.literal_eval``, which compiles code per file and was a quarter of the cost
    of a first batch that opens dozens of shards. Any other header goes through ``np.load``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 512, 0)
        if head[:8] == b"\x93NUMPY\x01\x00":
            end = 10 + int.from_bytes(head[8:10], "little")
            m = _OFFSETS_HEADER.fullmatch(head, 10, end)
            if m is not None:
                rows, fields = int(m.group(1)), int(m.group(2))
                if os.fstat(fd).st_size >= end + rows * fields * 16:
                    if rows * fields == 0:  # nothing to map
                        empty = np.empty((rows, fields, 2), dtype=np.int64)
                        empty.flags.writeable = False
                        return empty
                    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # stays valid after close(fd)
                    return np.frombuffer(mapped, dtype="<i8", count=rows * fields * 2, offset=end).reshape(
                        rows, fields, 2
                    )
    finally:
        os.close(fd)
    return np.load(path, mmap_mode="r", allow_pickle=False).view(np.ndarray)


def _header_problem(header: bytes, member: str, size: int) -> str | None:
    """Why a 512-byte tar header is not the one for ``member`` of ``size`` bytes (None if it is)."""
    if header[257:262] != b"ustar":
        return "no tar header there"
    raw = header[124:136]
    if raw[0] & 0x80:  # GNU base-256 size for members over 8 GB
        found = int.from_bytes(raw[1:], "big")
    else:
        try:
            found = int(raw.strip(b"\0 ") or b"0", 8)
        except ValueError:
            return "corrupt tar header"
    if found != size:
        return f"the member there has {found} bytes, the index says {size}"
    name = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:263] == b"ustar\0" else b""
    full = (prefix + b"/" + name if prefix else name).decode("utf-8", "replace")
    encoded = member.encode("utf-8")
    # Long or non-ASCII names live in a PAX/GNU header before this one; the plain name is then
    # truncated or replaced, so only short ASCII names can be compared exactly.
    # Field names are read lower-cased, as WebDataset does (member ``x.JPG`` is field ``jpg``).
    as_read = split_member_name(full)
    if (
        len(encoded) < 100
        and encoded.isascii()
        and full != member
        and (as_read is None or f"{as_read[0]}.{as_read[1]}" != member)
    ):
        return f"the member there is {full!r}, expected {member!r}"
    return None
