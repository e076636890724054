"""A node-local cache of whole files from object storage (tar shards, LMDB data files).

``cache_dir`` may be shared by every process and rank of a node:

* **One download per file per node.** A download holds an exclusive ``flock`` on a hidden
  ``.NAME.lock``; a second process wanting the same file either waits for it (``wait=True``)
  or reads remotely meanwhile. The kernel drops a lock when its holder dies, SIGKILL included,
  so no lock outlives its process. The lock file lives as long as the download: its holder
  removes it when done (a waiter that then holds a lock on the removed file sees that the name
  is another file, or none, and takes the lock again), and the lock file of a killed download is
  removed with its part.
* **Nothing partial is ever visible.** A download goes into a hidden ``.NAME.part-PID-TOKEN``
  (allocated at its full size, so it counts against the limit from the start), is synced and
  renamed into place when complete. A part whose lock is free belongs to a dead process and is
  removed: by the scan before each download under a ``cache_limit``, and without a limit by the
  first download of each cache object (and one a minute after).
* **Bounded.** Before a download, least-recently-used cached files are evicted until the new one
  fits under ``cache_limit`` bytes (counting files being downloaded); if it cannot fit, it is not
  cached (the reader keeps reading remotely). Eviction only ever deletes files that this cache
  wrote: regular files inside ``mmloader-*`` folders that carry the cache's marker file, never
  anything else under ``cache_dir``. A file evicted while a reader has it open stays readable
  through that reader's descriptor. So the folder holds the cached files, its marker, and a
  lock and a part per download in progress: nothing grows with the number of files cached over
  time.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Callable

from ..sizes import parse_size
from .redaction import redact_text, redact_url

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # optional module; uses check for None


log = logging.getLogger("mmloader")

MARKER = ".mmloader-cache"
GLOBAL_LOCK = ".mmloader-cache.lock"
#: A download in progress: ``.NAME.part-PID-TOKEN`` (see :meth:`ShardCache._reserve`).
_PART = re.compile(r"\.(.+)\.part-\d+-[0-9a-f]+")
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "mmloader")


def default_cache_dir() -> str:
    return os.environ.get("MMLOADER_CACHE_DIR") or DEFAULT_CACHE_DIR


def parse_limit(limit: int | str | None) -> int | None:
    """``cache_limit`` in bytes: an integer, or a size such as ``"20G"`` (20 GiB) or ``"500MB"``
    (:func:`mmloader.storage.sizes.parse_size`: the same units as the CLI's).

    >>> parse_limit("2G"), parse_limit("2GB"), parse_limit(1000), parse_limit(None)
    (2147483648, 2000000000, 1000, None)
    """
    if limit is None:
        return None
    try:
        value = parse_size(limit)
    except ValueError:
        raise ValueError(f"cache_limit={limit!r}: expected bytes, e.g. 20G, 500MB or 500000000") from None
    if value < 1:
        raise ValueError(f"cache_limit={limit!r}: expected a positive number of bytes")
    return value


def _flock(fd: int, blocking: bool) -> bool:
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise


def _lock(path: Path, blocking: bool, create: bool = True) -> int | None:
    """An open descriptor holding the exclusive lock of the file at ``path``; None when another
    process holds it (``blocking=False``) or, without ``create``, when there is no such file.

    Lock files are removed by their holders (:func:`_unlock`), so the lock taken may be on a file
    that was removed, or replaced by another, while this process waited: then the name is tried
    again. A descriptor returned is the lock of the file the name is now."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return None
        try:
            if not _flock(fd, blocking):
                os.close(fd)
                return None
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        except BaseException:
            os.close(fd)
            raise
        held = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # the holder before us removed it: the name is another file now, or none
        if not create:
            return None


def _unlock(path: Path, fd: int) -> None:
    """Remove the lock file at ``path`` whose lock ``fd`` holds, then release it: removed under
    the lock, so no other process holds a lock on the file that name leads to (see :func:`_lock`)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


class ShardCache:
    """Whole files of one dataset URL under ``cache_dir/mmloader-HASH/``.

    >>> cache = ShardCache("/scratch/cache", "s3://bucket/ds", limit=20 << 30)   # doctest: +SKIP
    >>> cache.fetch("data-000000.tar", size, location)                            # doctest: +SKIP
    """

    def __init__(self, cache_dir: str | os.PathLike, url: str, limit: int | None = None, tag: str = ""):
        self.root = Path(cache_dir).expanduser().absolute()
        self.url, self.limit, self.tag = url, limit, tag
        digest = hashlib.sha256(f"{url}\0{tag}".encode()).hexdigest()[:16]
        self.dir = self.root / f"mmloader-{digest}"
        self._touched: dict[str, float] = {}
        self._swept: float | None = None  # when this object last swept its folder (see _sweep)
        self.refused = ""  # why the last fetch returned None: "busy" (another download) or "full"

    def __getstate__(self) -> dict:
        return {"root": str(self.root), "url": self.url, "limit": self.limit, "tag": self.tag}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["root"], state["url"], state["limit"], state["tag"])

    def _ensure_dir(self) -> None:
        if not (self.dir / MARKER).is_file():
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f"{MARKER}.{os.getpid()}.{secrets.token_hex(3)}"
            # what a person finds here: the dataset, never credentials of its URL or endpoint
            tmp.write_text(json.dumps({"url": redact_url(self.url), "tag": redact_text(self.tag)}))
            os.replace(tmp, self.dir / MARKER)

    @staticmethod
    def local_name(name: str) -> str:
        return name.replace("/", "__")

    def path(self, name: str) -> Path:
        return self.dir / self.local_name(name)

    def _lock_path(self, name: str) -> Path:
        return self.dir / f".{self.local_name(name)}.lock"

    def lookup(self, name: str, size: int | None = None) -> Path | None:
        """The cached copy of ``name`` if there is one (of ``size`` bytes when given)."""
        p = self.path(name)
        try:
            st = p.stat()
        except OSError:
            return None
        if size is not None and st.st_size != size:
            return None
        return p

    def touch(self, name: str, every: float = 5.0) -> None:
        """Record a use (the file's mtime orders eviction), at most once per ``every`` seconds."""
        now = time.monotonic()
        if now - self._touched.get(name, -every) >= every:
            self._touched[name] = now
            try:
                os.utime(self.path(name))
            except OSError:
                pass

    # -- download ----------------------------------------------------------------------------------
    def fetch(
        self,
        name: str,
        size: int,
        download: Callable[[int, Callable[[int], None] | None], None],
        wait: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> Path | None:
        """The cached copy of ``name``, downloading it first if needed: ``download(fd, progress)``
        writes the ``size`` bytes into ``fd``. Returns None when the file is not cached: another
        process is downloading it and ``wait`` is False, or it cannot fit under the limit."""
        hit = self.lookup(name, size)
        if hit is not None:
            self.touch(name, every=0)
            return hit
        self._ensure_dir()
        if self.limit is None:  # with a limit, each download scans the whole cache first
            self._sweep()
        lock_path = self._lock_path(name)
        lock_fd = _lock(lock_path, blocking=False)
        if lock_fd is None:
            if not wait:
                self.refused = "busy"
                return None
            lock_fd = _lock(lock_path, blocking=True)  # another process downloads it: wait for that
            assert lock_fd is not None  # a blocking lock that may create the file is always taken
        try:
            hit = self.lookup(name, size)
            if hit is not None:
                self.touch(name, every=0)
                return hit
            final = self.path(name)
            if final.exists():  # wrong size: a stale copy of an older version
                final.unlink()
            for stale in self.dir.glob(f".{self.local_name(name)}.part-*"):
                stale.unlink(missing_ok=True)  # we hold the lock: no live writer owns these
            part = self._reserve(name, size)
            if part is None:
                self.refused = "full"
                return None
            try:
                fd = os.open(part, os.O_RDWR)  # read back too: verify_checksums hashes it before publishing
                try:
                    download(fd, progress)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if os.path.getsize(part) != size:
                    raise OSError(f"{self.url}/{name}: downloaded {os.path.getsize(part)} bytes, expected {size}")
                with self._global_lock():  # renames and usage scans never interleave
                    os.replace(part, final)
            except BaseException:
                try:
                    os.unlink(part)
                except OSError:
                    pass
                raise
            log.info("cached %s/%s (%d bytes) in %s", redact_url(self.url), name, size, final)
            return final
        finally:
            _unlock(lock_path, lock_fd)  # the lock file goes with the download

    @contextlib.contextmanager
    def _global_lock(self):
        """The cache-wide lock: admissions, evictions, renames into place and size scans."""
        self.root.mkdir(parents=True, exist_ok=True)
        gfd = os.open(self.root / GLOBAL_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock(gfd, blocking=True)
            yield
        finally:
            os.close(gfd)

    def _reserve(self, name: str, size: int) -> Path | None:
        """Make room for ``size`` bytes (evicting least-recently-used cached files) and create the
        part file at its full size, all under the cache-wide lock; None if it cannot fit."""
        with self._global_lock():
            if self.limit is not None:
                finals, held = self.usage()
                used = sum(s for _m, s, _p in finals) + held
                if size > self.limit:
                    log.info(
                        "%s/%s (%d bytes) is larger than cache_limit=%d: not cached",
                        redact_url(self.url),
                        name,
                        size,
                        self.limit,
                    )
                    return None
                for _mtime, fsize, p in sorted(finals):
                    if used + size <= self.limit:
                        break
                    try:
                        p.unlink()
                        used -= fsize
                        log.info("cache: evicted %s (%d bytes)", p, fsize)
                    except FileNotFoundError:
                        used -= fsize
                    except OSError as e:
                        log.warning("cache: cannot evict %s: %s", p, e)
                if used + size > self.limit:
                    return None  # the rest is held by downloads in progress
            part = self.dir / f".{self.local_name(name)}.part-{os.getpid()}-{secrets.token_hex(3)}"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            return part

    def usage(self) -> tuple[list[tuple[float, int, Path]], int]:
        """(cached files as (mtime, size, path), bytes held by live downloads) over the whole
        ``cache_dir``; parts and lock files of dead downloads are removed on the way (lock files
        that earlier versions left, one per file ever downloaded, too)."""
        finals: list[tuple[float, int, Path]] = []
        held = 0
        try:
            dirs = [d for d in self.root.iterdir() if d.name.startswith("mmloader-") and (d / MARKER).is_file()]
        except OSError:
            return finals, held
        for d in dirs:
            found, in_progress = self._scan(d)
            finals += found
            held += in_progress
        return finals, held

    def _scan(self, d: Path) -> tuple[list[tuple[float, int, Path]], int]:
        """(cached files, bytes held by live downloads) of one dataset's folder ``d``; the parts
        and lock files of dead downloads are removed on the way."""
        finals: list[tuple[float, int, Path]] = []
        held = 0
        try:
            entries = list(os.scandir(d))
        except OSError:
            return finals, held
        for e in entries:
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                if not e.name.startswith("."):
                    st = e.stat(follow_symlinks=False)
                    finals.append((st.st_mtime, st.st_size, Path(e.path)))
                elif (part := _PART.fullmatch(e.name)) is not None:
                    base = part.group(1)
                    if self._owner_alive(d, base):
                        held += e.stat(follow_symlinks=False).st_size
                    else:
                        os.unlink(e.path)
                elif e.name.endswith(".lock") and e.name != GLOBAL_LOCK:
                    self._owner_alive(d, e.name[1 : -len(".lock")])  # removes it unless it is held
            except OSError:  # gone meanwhile (renamed into place, evicted, removed by another scan)
                continue
        return finals, held

    #: Without a limit (no scan before each download), a dataset's folder is swept of dead
    #: downloads' parts and locks at most this often per cache object (seconds).
    SWEEP_EVERY = 60.0

    def _sweep(self) -> None:
        """Without ``cache_limit`` nothing scans the cache before a download; so the first
        download of this cache object, and one every :data:`SWEEP_EVERY` seconds after, removes
        the part and lock files of killed downloads from this dataset's folder (one directory
        listing; a lock is tried only for the hidden files, a handful)."""
        now = time.monotonic()
        if self._swept is not None and now - self._swept < self.SWEEP_EVERY:
            return
        self._swept = now
        with self._global_lock():
            self._scan(self.dir)

    @staticmethod
    def _owner_alive(d: Path, base: str) -> bool:
        """Whether some process holds the download lock of ``base`` (so its part is live). A
        free lock file belongs to no download: it is removed."""
        path = d / f".{base}.lock"
        fd = _lock(path, blocking=False, create=False)
        if fd is None:
            return path.exists()  # held by a live download (or gone: then no download runs)
        _unlock(path, fd)
        return False

    def size(self) -> int:
        """Bytes cached over the whole ``cache_dir`` (all datasets), downloads in progress included."""
        with self._global_lock():
            finals, held = self.usage()
        return sum(s for _m, s, _p in finals) + held
