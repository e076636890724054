"""Whole shards of a :class:`~.tar.RemoteTarStore` on local disk: the node-local shard cache
(downloads in the background as the plan touches shards, ``prefetch``, descriptors kept open) and
temporary downloads for sequential reads. Apart from :mod:`.tar`, which reads samples by ranged
GETs wherever a shard is not (yet) cached here."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import tempfile
import time
from collections import OrderedDict
from typing import Any, Iterator, Sequence

from ...errors import FormatError
from ..tar.layout import sha256_file
from ..tar.stages import group_samples, tar_members
from .shard_cache import ShardCache
from .tar_index import _RemoteIndex

log = logging.getLogger("mmloader")


class _CachedShards(_RemoteIndex):
    """The shard cache and whole-shard downloads of :class:`~.tar.RemoteTarStore`, which sets
    ``cache_dir`` and ``cache_limit`` and calls :meth:`_reset_cache` in each process."""

    cache_dir: str | None
    cache_limit: int | None

    def _reset_cache(self) -> None:
        """Per-process state: descriptors of cached shards, background downloads."""
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._closing = None
        self._cache_obj: ShardCache | None = None
        self._cache_state: dict[int, float] = {}  # shard -> when to look for it in the cache again
        self._cached: dict[int, str] = {}
        self._downloads: concurrent.futures.ThreadPoolExecutor | None = None
        self._verified: set[int] = set()  # shards whose cached copy this process hashed

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
                if not self._cached_copy_is_whole(s, fd, path):
                    os.close(fd)
                    fd = None
                else:
                    self._fds[s] = fd
                while len(self._fds) > 64:
                    _old, old_fd = self._fds.popitem(last=False)
                    if self._closing is not None:
                        os.close(self._closing)
                    self._closing = old_fd
        if fd is None:  # a changed copy, removed: fetched again, reads go to the object store meanwhile
            self._cache_state[s] = now + 0.5
            self._schedule(s)
            return None
        cache.touch(shard["file"], every=0)
        return fd

    def _cached_copy_is_whole(self, s: int, fd: int, path) -> bool:
        """Whether the cached copy of shard ``s`` holds the bytes the manifest names (its sha256),
        checked the first time this process opens it: a copy changed on disk since it was
        downloaded is removed (and said), never served. Shards another tool indexed have no
        checksum: their size was checked by the lookup."""
        want = self.shards[s].get("sha256")
        if not want or s in self._verified:
            return True
        got = sha256_file(fd)
        if got == want:
            self._verified.add(s)
            return True
        log.warning(
            "cache: the cached copy %s of %s does not hold the bytes the manifest names (sha256 %s..., "
            "expected %s...): removed, fetched again",
            path,
            self.shard_path(s),
            got[:12],
            want[:12],
        )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return False

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
