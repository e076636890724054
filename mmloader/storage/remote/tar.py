"""Tar shards read in place on object storage: the manifest and offset indexes fetched once per
process, samples by ranged GETs — coalesced, concurrent, each checked against its tar header
exactly like a local read — with read-ahead along the plan and an optional node-local cache.

Three ways a sample's bytes arrive, cheapest first:

1. **The shard cache** (``cache_dir=``): a whole shard copied to local disk, read with ``pread``
   as a local shard is. A shard is downloaded in the background the first time the plan touches
   it (and the next shard with it); until it is there, the other two ways serve it.
   (:mod:`.tar_cache`)
2. **Read-ahead chunks** (``readahead=``): the plan is blockwise (runs of ``block_size``
   consecutive samples, shuffled within a window), so the first sample read from a region of a
   shard announces the rest of that region within the window. The first touch of a chunk of
   consecutive samples (about ``chunk_bytes``) starts one large ranged GET for it in the
   background and is itself served by a small ranged GET; later samples of the chunk are sliced
   from it. Chunks in memory never exceed ``readahead_bytes``; a chunk is dropped as soon as
   each of its samples has been served once (so memory follows the window), or when it has sat
   unused while room is needed. Read-ahead is on by default in the process that opened the
   store (the thread backend, a single process) and off in worker processes, which read
   interleaved batches (each would fetch whole chunks to use a fraction of them); the shard
   cache is the way to share whole shards between worker processes. (:mod:`.read_ahead`)
3. **Per-sample ranged GETs**, a batch at once: ranges of one shard less than ``coalesce``
   bytes apart are merged into one request, and all requests of the batch run concurrently
   (``max_in_flight``), without the GIL (obstore).

Whatever the way, :meth:`TarStore._member` checks each member against its tar header and size:
never wrong bytes, whatever a server or a cache returned. The manifest and offset indexes are
:mod:`.tar_index`'s; this module builds the store and serves its reads.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..tar.index import MANIFEST
from . import Location, Policy, coalesce
from .read_ahead import ReadAhead
from .shard_cache import parse_limit
from .tar_cache import _CachedShards


class RemoteTarStore(_CachedShards):
    """A shard directory on object storage, with :class:`TarStore`'s API.

    ``index_dir``: a local folder holding the manifest and indexes (what ``mmloader index URL -o
    DIR`` wrote), for shards another tool wrote where no index can go beside them (a Hub dataset
    of someone else's): :func:`~mmloader.storage.open_store` opens such a folder as this store.

    >>> ds = RemoteTarStore("s3://bucket/shards/", cache_dir="/scratch/mm", cache_limit="200G")  # doctest: +SKIP
    >>> ds[5]["txt"], len(ds)                                                                  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        readahead: bool | None = None,
        readahead_bytes: int = 512 << 20,
        chunk_bytes: int = 8 << 20,
        coalesce: int = 64 << 10,
        check_headers: bool = True,
        verify_checksums: bool = False,
        retry_deadline: float | None = None,
        request_timeout: float | None = None,
        max_in_flight: int | None = None,
        index_dir: str | os.PathLike | None = None,
    ):
        url = url.rstrip("/")
        if url.endswith("/" + MANIFEST):
            url = url[: -len(MANIFEST) - 1]
        for name, value, low in (
            ("readahead_bytes", readahead_bytes, 0),
            ("chunk_bytes", chunk_bytes, 1),
            ("coalesce", coalesce, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}={value!r}: expected an integer >= {low} (bytes)")
        if cache_limit is not None and cache_dir is None:
            raise ValueError("cache_limit= needs cache_dir= (or MMLOADER_CACHE_DIR): there is no cache to limit")
        policy = Policy.from_env(
            retry_deadline=retry_deadline, request_timeout=request_timeout, max_in_flight=max_in_flight
        )
        self.location = Location(url, storage_options or {}, policy)
        self.check_headers, self.verify_checksums = check_headers, verify_checksums
        self.path = self.url = self.location.shown  # named in messages (requests go through location)
        #: a local folder holding the manifest and indexes (``mmloader index URL -o DIR``): the
        #: shards are read where they are, the index from here
        self.index_dir = os.path.abspath(index_dir) if index_dir is not None else None
        if self.index_dir is not None:
            self.location.changed_remedy = (
                f"the index in {self.index_dir} describes the version it was built from: build it again "
                f"(`mmloader index {self.url} -o NEW_DIR`)"
            )
        self.manifest_path = self._manifest_path()  # type: ignore[assignment]  # named in messages
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.cache_limit = parse_limit(cache_limit)
        self.readahead, self.readahead_bytes, self.chunk_bytes = readahead, readahead_bytes, chunk_bytes
        self.coalesce = coalesce
        self._owner = os.getpid()
        self._meta = None
        self._idx = OrderedDict()
        self._keys = self._order = None
        self._reset_remote()

    def reads_object_storage(self) -> bool:
        return True

    def _reset_remote(self) -> None:
        """Per-process state: descriptors of cached shards, read-ahead, background downloads.
        Index tables are plain memory and survive fork."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._reset_cache()
        on = self.readahead if self.readahead is not None else (not self.cache_dir and os.getpid() == self._owner)
        self._ra = ReadAhead(self, self.readahead_bytes, self.chunk_bytes) if on else None
        self.bytes_fetched = 0  # by per-sample ranged reads in this process

    def _reset_handles(self) -> None:  # TarStore's hook: keep index tables, reset the rest
        self._reset_remote()

    def _local(self) -> None:
        if self._pid != os.getpid():
            self._reset_remote()

    def __getstate__(self) -> dict:
        return {
            "location": self.location,
            "_meta": self._meta,
            "check_headers": self.check_headers,
            "verify_checksums": self.verify_checksums,
            "cache_dir": self.cache_dir,
            "cache_limit": self.cache_limit,
            "readahead": self.readahead,
            "readahead_bytes": self.readahead_bytes,
            "chunk_bytes": self.chunk_bytes,
            "coalesce": self.coalesce,
            "_owner": self._owner,
            "index_dir": self.index_dir,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.path = self.url = self.location.shown  # named in messages (requests go through location)
        self.manifest_path = self._manifest_path()  # type: ignore[assignment]  # named in messages
        self._idx = OrderedDict()
        self._keys = self._order = None
        self._reset_remote()

    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:  # TarStore's signature
        try:
            if getattr(self, "_pid", None) == _getpid():
                for fd in list(getattr(self, "_fds", {}).values()):
                    _close(fd)
        except Exception:  # at interpreter exit, or a descriptor already closed
            pass

    def __repr__(self) -> str:
        if self.index_dir is not None:
            return f"RemoteTarStore({self.url!r}, index_dir={self.index_dir!r})"
        return f"RemoteTarStore({self.url!r})"

    # -- reading ------------------------------------------------------------------------------------------
    def read_many(self, indices, fields, views: bool = False):
        self._local()
        meta = self.metadata
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx):
            valid = idx[(idx >= 0) & (idx < len(self))]
            self.fetch_indexes(np.unique(np.searchsorted(meta["_starts_array"], valid, side="right") - 1).tolist())
        layout = self._batch_layout(idx, fields)
        if layout.done:
            return layout.keys, layout.columns
        keys, columns, head = layout.keys, layout.columns, layout.head
        starts = meta["_starts"]
        requests = []  # (row in batch, field or None for the whole span, shard, row in shard, start, end)
        for rows in layout.groups:
            s = int(layout.shard_of[rows[0]])
            for j in rows.tolist():
                a, b = layout.lo[j], layout.hi[j]
                if b <= 0:
                    continue
                r = int(idx[j]) - starts[s]
                if layout.one_read[j]:
                    requests.append((j, None, s, r, a, b))
                else:
                    for f, o, z in zip(fields, layout.offs[j], layout.sizes[j]):
                        if o >= 0:
                            requests.append((j, f, s, r, o - head, o + z))
        spans = self._fetch(requests)
        for (j, f, s, _r, a, b), (buf, base) in zip(requests, spans):
            for name, o, z in zip(fields, layout.offs[j], layout.sizes[j]):
                if o >= 0 and (f is None or f == name):
                    columns[name][j] = self._member(buf, base, keys[j], name, o, z, s, views)
        return keys, columns

    def _fetch(self, requests) -> list[tuple[Any, int]]:
        out: list = [None] * len(requests)
        pending = []
        for k, (_j, _f, s, r, a, b) in enumerate(requests):
            if self._cache is not None:
                fd = self._cached_fd(s)
                if fd is not None:
                    out[k] = (os.pread(fd, b - a, a), a)
                    continue
            if self._ra is not None:
                hit = self._ra.serve(s, r, a, b)
                if hit is not None:
                    out[k] = hit
                    continue
            pending.append(k)
        if pending:
            by_shard: dict[int, list[int]] = {}
            for k in pending:
                by_shard.setdefault(requests[k][2], []).append(k)
            gets, members = [], []
            for s, ks in by_shard.items():
                name = self.shards[s]["file"]
                for start, end, inside in coalesce([(requests[k][4], requests[k][5]) for k in ks], self.coalesce):
                    gets.append((name, start, end))
                    members.append([ks[i] for i in inside])
            if self._ra is not None and self._ra.planned:
                datas = self._get_then_start(gets)
            else:
                datas = self.location.get_ranges(gets)
            for (_name, start, end), inside, data in zip(gets, members, datas):
                self.bytes_fetched += end - start
                buf = bytes(data)
                for k in inside:
                    out[k] = (buf, start)
        return out

    def _get_then_start(self, gets):
        """This batch's reads, then the read-ahead chunks they announced, queued behind them."""
        pending = self.location.start_ranges(gets)
        self._ra.start()
        return pending.result()

    def field_size(self, index: int, field: str) -> int:
        s, row = self.locate(index)
        c = self.metadata["_columns"][s].get(field)
        return 0 if c is None else max(int(self._shard_index(s)[row, c, 1]), 0)

    def stats(self) -> dict:
        """Bytes fetched in this process: by per-sample ranged reads and as read-ahead chunks."""
        return {"ranged": self.bytes_fetched, "readahead": self._ra.fetched if self._ra is not None else 0}
