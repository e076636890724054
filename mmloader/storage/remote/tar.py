"""Tar shards read in place on object storage: the manifest and offset indexes fetched once per
process, samples by ranged GETs — coalesced, concurrent, each checked against its tar header
exactly like a local read — with read-ahead along the plan and an optional node-local cache.

Three ways a sample's bytes arrive, cheapest first:

1. **The shard cache** (``cache_dir=``): a whole shard copied to local disk, read with ``pread``
   as a local shard is. A shard is downloaded in the background the first time the plan touches
   it (and the next shard with it); until it is there, the other two ways serve it.
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
never wrong bytes, whatever a server or a cache returned.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any, Iterator, Sequence

import numpy as np

from ...errors import FormatError, RandomAccessError
from ..tar.index import MANIFEST
from ..tar.layout import sha256_file
from ..tar.stages import group_samples, tar_members
from ..tar.store import TarStore, prepare_manifest
from . import Location, Policy, RemoteError, RemoteUnavailableError, coalesce, join
from .read_ahead import ReadAhead
from .shard_cache import DEFAULT_CACHE_DIR, ShardCache, parse_limit

log = logging.getLogger("mmloader")

MAX_INDEXES = 4096  # offset tables kept per process (16 bytes per sample and field each)


def offsets_from_bytes(data: bytes, where: str) -> np.ndarray:
    try:
        table = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as e:
        raise FormatError(f"{where}: unreadable offset index: {e}") from None
    if table.dtype != np.int64 or table.ndim != 3 or table.shape[2] != 2:
        raise FormatError(f"{where}: not an offset index (dtype {table.dtype}, shape {table.shape})")
    table.flags.writeable = False
    return table


class RemoteTarStore(TarStore):
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

    def _reset_remote(self) -> None:
        """Per-process state: descriptors of cached shards, read-ahead, background downloads.
        Index tables are plain memory and survive fork."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._closing = None
        self._cache_obj: ShardCache | None = None
        self._cache_state: dict[int, float] = {}  # shard -> when to look for it in the cache again
        self._cached: dict[int, str] = {}
        self._downloads: concurrent.futures.ThreadPoolExecutor | None = None
        on = self.readahead if self.readahead is not None else (not self.cache_dir and os.getpid() == self._owner)
        self._ra = ReadAhead(self, self.readahead_bytes, self.chunk_bytes) if on else None
        self.bytes_fetched = 0  # by per-sample ranged reads in this process

    @property
    def _cache(self) -> ShardCache | None:
        """The node-local shard cache, keyed by the endpoint and the manifest's content too:
        another server's bucket of the same name, or a dataset rewritten under the same URL,
        never shares cached shards."""
        if not self.cache_dir:
            return None
        if self._cache_obj is None:
            tag = f"{self.location.identity()}|{self.metadata['_digest']}"
            self._cache_obj = ShardCache(self.cache_dir, self.url, self.cache_limit, tag=tag)
        return self._cache_obj

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

    def _manifest_path(self) -> str:
        return self._index_path(MANIFEST)

    def _index_path(self, name: str) -> str:
        """Where the index file ``name`` lies: in ``index_dir``, else beside the shards."""
        return os.path.join(self.index_dir, name) if self.index_dir is not None else join(self.url, name)

    def _index_files(self, names: list[str]) -> list[bytes]:
        """The manifest's key and offset files: from ``index_dir``, else beside the shards."""
        if self.index_dir is None:
            return self.location.get_many(names, purpose="meta")
        out = []
        for name in names:
            try:
                with open(self._index_path(name), "rb") as f:
                    out.append(f.read())
            except FileNotFoundError:
                raise FileNotFoundError(f"{self._index_path(name)}: no such file") from None
        return out

    def _local_index_metadata(self) -> dict:
        """The manifest of an index kept in ``index_dir``, every shard pinned to the version it
        was indexed at (the ETag the manifest records; a Hub dataset's commit is in its URL): a
        shard replaced since is an ObjectChangedError, never bytes at another file's offsets."""
        assert self.index_dir is not None
        with open(self.manifest_path, "rb") as f:
            text = f.read()
        meta = prepare_manifest(text, self.manifest_path)
        for shard in meta["shards"]:
            if shard.get("etag"):
                self.location.pin(shard["file"], shard["etag"])
        meta["_digest"] = hashlib.sha256(text).hexdigest()[:16]
        return meta

    # -- metadata and indexes ------------------------------------------------------------------------
    @property
    def metadata(self) -> dict:
        if self._meta is None and self.index_dir is not None:
            self._meta = self._local_index_metadata()
        if self._meta is None:
            # Pin every object's version first (one listing per 1,000 objects), then read the
            # manifest as that version: the indexes and shards read later, in this process or
            # in workers (the pins travel with the store), are the ones the manifest describes,
            # or the read fails with ObjectChangedError — never a mixture of two datasets.
            try:
                versions = self.location.versions()
            except RemoteUnavailableError:
                # no answer for the whole retry_deadline: asking for the manifest now would wait
                # as long again (an open takes one deadline at most)
                raise
            except (FileNotFoundError, RemoteError, OSError) as e:
                log.debug("%s: no listing (%s); versions are pinned as objects are first read", self.url, e)
                versions = {}
            for name, etag in versions.items():
                self.location.pin(name, etag)
            try:
                text = self.location.get(MANIFEST, purpose="meta")
            except FileNotFoundError:
                raise FormatError(f"{self.url} has no {MANIFEST}{self._tar_hint()}") from None
            self._meta = prepare_manifest(text, self.manifest_path)
            if not versions:
                self._pin_by_head()
            self._meta["_digest"] = hashlib.sha256(text if isinstance(text, bytes) else text.encode()).hexdigest()[:16]
        return self._meta

    #: Above this many shards, a store that cannot list pins lazily (each process at its first
    #: answer) instead of asking for every shard's version when it opens.
    MAX_HEAD_PINS = 4096

    def _pin_by_head(self) -> None:
        """Where there is no listing (plain HTTP), pin each shard's version with a HEAD request,
        concurrently, so that worker processes share one set of versions. A Hub dataset needs
        none: its commit is pinned, and its files never change."""
        assert self._meta is not None  # called by metadata, once it is read
        if self.location.hub is not None:
            return
        names = [sh["file"] for sh in self._meta["shards"]]
        if not names or len(names) > self.MAX_HEAD_PINS:
            return
        from .runtime import _background

        try:
            answers = list(_background().map(lambda n: self.location.head(n, purpose="meta"), names))
        except (RemoteError, OSError) as e:
            log.debug("%s: versions not pinned at open (%s)", self.url, e)
            return
        for name, (_size, etag) in zip(names, answers):
            self.location.pin(name, etag)

    def _tar_hint(self) -> str:
        try:
            names = [n for n, _ in self.location.list(purpose="meta")]
        except Exception:
            return ""
        if any(n.endswith((".tar", ".tgz", ".tar.gz")) for n in names) and self.location.hub is not None:
            return (
                f" (it holds tar files but no {MANIFEST}: index them once into a local folder, "
                f"`mmloader index {self.url} -o DIR`, and open DIR: the shards stay on the Hub, read in place)"
            )
        if any(n.endswith((".tar", ".tgz", ".tar.gz")) for n in names):
            return (
                f" (it holds tar files but no manifest: a writer killed before publishing leaves its shards "
                f"without {MANIFEST}, and indexing those would publish half a dataset; if they are complete "
                f"shards written by another tool, run `mmloader index {self.url}` (the index beside them), or "
                f"`mmloader index {self.url} -o DIR` and open DIR (the index in a local folder))"
            )
        if any(n.endswith("data.mdb") for n in names):
            return " (it holds an LMDB data.mdb: name the dataset by its .lmdb folder)"
        if not names:
            where = "the path in the repository (and its revision)" if self.location.hub else "the bucket and the path"
            return f" (nothing is stored under this prefix: check {where})"
        return ""

    def shard_path(self, s: int) -> str:
        return join(self.url, self.shards[s]["file"])

    def _key_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # into locals: another thread may have set _keys and not yet _order (then both load here)
        keys, order = self._keys, self._order
        if keys is None or order is None:
            meta = self.metadata
            raw = self._index_files([meta["keys"], meta["key_order"]])
            keys = np.load(io.BytesIO(raw[0]), allow_pickle=False)
            order = np.load(io.BytesIO(raw[1]), allow_pickle=False)
            self._keys, self._order = keys, order
        return keys, order

    def _shard_index(self, s: int) -> np.ndarray:
        table = self._idx.get(s)
        if table is None:
            self.fetch_indexes([s])
            table = self._idx[s]
        return table

    def fetch_indexes(self, shards: Sequence[int]) -> None:
        """Fetch the offset tables of ``shards`` not held yet, concurrently."""
        missing = sorted({int(s) for s in shards if int(s) not in self._idx})
        if not missing:
            return
        meta = self.metadata
        for s in missing:
            if meta["shards"][s]["compressed"]:
                raise RandomAccessError(
                    f"shard {self.shard_path(s)} is compressed: it can only be read sequentially "
                    "(store.iter_samples()). For random access, shuffling and DDP splitting, decompress it "
                    "and run `mmloader index` again."
                )
        names = [meta["shards"][s]["index"] for s in missing]
        try:
            raw = self._index_files(names)
        except FileNotFoundError as e:
            raise FormatError(f"{e}: an offset index listed in {self.manifest_path} is missing") from None
        with self._lock:
            for s, name, data in zip(missing, names, raw):
                table = offsets_from_bytes(data, self._index_path(name))
                if table.shape[0] != meta["shards"][s]["count"]:
                    raise FormatError(
                        f"{name}: {table.shape[0]} rows but the manifest lists "
                        f"{meta['shards'][s]['count']} samples for {meta['shards'][s]['file']}"
                    )
                self._idx[s] = table
                while len(self._idx) > MAX_INDEXES:
                    self._idx.popitem(last=False)

    # -- the shard cache --------------------------------------------------------------------------------
    def _cached_fd(self, s: int) -> int | None:
        """A descriptor of shard ``s``'s cached copy, or None (a download is started if none runs)."""
        cache = self._cache
        assert cache is not None  # called only where there is a cache
        fd = self._fds.get(s)
        if fd is not None:
            cache.touch(self.shards[s]["file"])
            return fd
        now = time.monotonic()
        if self._cache_state.get(s, 0.0) > now:
            return None
        shard = self.shards[s]
        path = cache.lookup(shard["file"], shard["bytes"])
        if path is None:
            self._cache_state[s] = now + 0.5
            self._schedule(s)
            if s + 1 < len(self.shards):
                self._schedule(s + 1)
            return None
        with self._lock:
            fd = self._fds.get(s)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:  # evicted between the lookup and the open
                    self._cache_state[s] = now + 0.5
                    return None
                self._fds[s] = fd
                while len(self._fds) > 64:
                    _old, old_fd = self._fds.popitem(last=False)
                    if self._closing is not None:
                        os.close(self._closing)
                    self._closing = old_fd
        cache.touch(shard["file"], every=0)
        return fd

    def _schedule(self, s: int) -> None:
        if s in self._cached or self.shards[s]["compressed"]:
            return
        with self._lock:
            if s in self._cached:
                return
            self._cached[s] = "pending"
            if self._downloads is None:
                self._downloads = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mmloader-cache")
        self._downloads.submit(self._download_to_cache, s)

    def _download_to_cache(self, s: int) -> None:
        again = 0.0
        try:
            if self.cache_shard(s, wait=False) is None:
                cache = self._cache
                assert cache is not None  # cache_shard raises without one
                again = 1.0 if cache.refused == "busy" else 30.0
        except Exception as e:  # reads go on remotely; a later touch tries again
            log.warning("cache: could not download %s: %s", self.shard_path(s), e)
            again = 30.0
        finally:
            with self._lock:
                self._cached.pop(s, None)
            self._cache_state[s] = time.monotonic() + again

    def wait_for_cache(self) -> None:
        """Wait for the background shard downloads this process started."""
        with self._lock:
            pool, self._downloads = self._downloads, None
        if pool is not None:
            pool.shutdown(wait=True)

    def cache_shard(self, s: int, wait: bool = True, progress=None):
        """Copy shard ``s`` into the cache (once per node); its path, or None if not cached."""
        if self._cache is None:
            raise ValueError(f"{self.url}: no cache_dir was given")
        shard = self.shards[s]
        name, size = shard["file"], shard["bytes"]

        def download(fd: int, prog) -> None:
            self.location.download(name, fd, size, progress=prog)
            if self.verify_checksums:
                self._check_sha(fd, s)

        return self._cache.fetch(name, size, download, wait=wait, progress=progress)

    def prefetch(self, shards: Sequence[int] | None = None, progress: bool = True) -> int:
        """Fill the cache with ``shards`` (default: all) ahead of training, with a progress bar;
        returns how many are cached."""
        from tqdm import tqdm

        todo = list(range(len(self.shards))) if shards is None else list(shards)
        total = sum(self.shards[s]["bytes"] for s in todo)
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"caching {self.url}", disable=not progress) as bar:
            for s in todo:
                self.cache_shard(s, wait=True, progress=bar.update)
        # counted at the end: under a small cache_limit, later shards may have evicted earlier ones
        cache = self._cache
        if cache is None:  # only with no shards to cache: cache_shard raises without a cache
            return 0
        return sum(cache.lookup(self.shards[s]["file"], self.shards[s]["bytes"]) is not None for s in todo)

    def _check_sha(self, fd: int, s: int) -> None:
        digest = sha256_file(fd)
        if digest != self.shards[s]["sha256"]:
            raise FormatError(
                f"shard {self.shard_path(s)}: sha256 {digest[:12]}... does not match the "
                f"manifest's {self.shards[s]['sha256'][:12]}...: the object changed since it was written"
            )

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

    # -- whole shards -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def local_shard(self, s: int, progress: bool = False) -> Iterator[str]:
        """A local file holding shard ``s``: its cached copy, or a temporary download."""
        if self._cache is not None:
            path = self.cache_shard(s, wait=True)
            if path is not None:
                yield str(path)
                return
        shard = self.shards[s]
        from tqdm import tqdm

        fd, path = tempfile.mkstemp(prefix=".mmloader-shard-", suffix=".tar")
        unlinked = os.path.isdir("/proc/self/fd")
        try:
            if unlinked:  # removed at once: a killed process leaves no file behind
                os.unlink(path)
            with tqdm(
                total=shard["bytes"],
                unit="B",
                unit_scale=True,
                desc=f"fetching {shard['file']}",
                disable=not progress,
                leave=False,
            ) as bar:
                self.location.download(shard["file"], fd, shard["bytes"], progress=bar.update)
            yield f"/proc/self/fd/{fd}" if unlinked else path
        finally:
            os.close(fd)
            if not unlinked:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def iter_samples(self, shards: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
        for s in range(len(self.shards)) if shards is None else shards:
            with self.local_shard(s) as path:
                for sample in group_samples(tar_members(path), where=self.shard_path(s)):
                    sample.pop("__offsets__")
                    yield sample

    def stats(self) -> dict:
        """Bytes fetched in this process: by per-sample ranged reads and as read-ahead chunks."""
        return {"ranged": self.bytes_fetched, "readahead": self._ra.fetched if self._ra is not None else 0}


def default_cache_dir() -> str:
    return os.environ.get("MMLOADER_CACHE_DIR") or DEFAULT_CACHE_DIR
