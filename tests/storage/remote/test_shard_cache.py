"""The node-local shard cache (mmloader.storage.remote.shard_cache) on real files: one download per
file, nothing partial visible, bounded by its limit (locks and parts included: nothing grows with
the files cached over time), and never deleting a file it did not write.
(The cache under a RemoteTarStore over S3, across processes and kill -9, is in test_remote.py.)"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import threading
import time

import pytest

from mmloader.storage.remote import shard_cache
from mmloader.storage.remote.shard_cache import MARKER, ShardCache, parse_limit


def _writer(data: bytes, calls: list):
    def download(fd: int, progress) -> None:
        calls.append(len(data))
        os.pwrite(fd, data, 0)
        if progress is not None:
            progress(len(data))

    return download


def test_a_file_is_downloaded_once_then_served_from_disk(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds")
    calls, seen = [], []
    path = cache.fetch("shards/a.tar", 1000, _writer(b"a" * 1000, calls), progress=seen.append)
    assert path.read_bytes() == b"a" * 1000 and path.parent == cache.dir and path.name == "shards__a.tar"
    assert (cache.dir / MARKER).is_file() and seen == [1000]
    assert cache.fetch("shards/a.tar", 1000, _writer(b"x" * 1000, calls)) == path
    assert calls == [1000] and cache.lookup("shards/a.tar", 1000) == path
    assert cache.lookup("shards/a.tar", 999) is None  # another size: another version of the file
    again = cache.fetch("shards/a.tar", 5, _writer(b"new!!", calls))  # a stale copy is replaced
    assert again.read_bytes() == b"new!!" and calls == [1000, 5]
    assert cache.size() == 5


def test_a_failed_or_short_download_leaves_nothing_visible(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds")

    def broken(fd: int, progress) -> None:
        os.pwrite(fd, b"half", 0)
        raise ConnectionResetError("cut")

    with pytest.raises(ConnectionResetError):
        cache.fetch("a.tar", 100, broken)
    assert cache.lookup("a.tar") is None and not list(cache.dir.glob(".*.part-*"))

    def grows(fd: int, progress) -> None:
        os.pwrite(fd, b"z" * 150, 0)  # more than the manifest says

    with pytest.raises(OSError, match="downloaded 150 bytes, expected 100"):
        cache.fetch("a.tar", 100, grows)
    assert cache.lookup("a.tar") is None and not list(cache.dir.glob(".*.part-*")) and cache.size() == 0


def test_the_limit_evicts_least_recently_used_cached_files_only(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.tar").write_bytes(b"n" * 400)  # the user's: never counted nor evicted
    (tmp_path / "mmloader-lookalike").mkdir()
    (tmp_path / "mmloader-lookalike" / "x.tar").write_bytes(b"l" * 400)  # no marker: not the cache's
    cache = ShardCache(tmp_path, "s3://b/ds", limit=1000)
    calls: list = []
    a = cache.fetch("a.tar", 400, _writer(b"a" * 400, calls))
    b = cache.fetch("b.tar", 400, _writer(b"b" * 400, calls))
    os.utime(a, (1, 1))
    os.utime(b, (2, 2))  # a is the least recently used
    cache.touch("a.tar", every=0)  # ... until it is used again
    c = cache.fetch("c.tar", 400, _writer(b"c" * 400, calls))
    assert c.exists() and a.exists() and not b.exists()
    assert cache.size() == 800 <= cache.limit
    assert (tmp_path / "mine" / "notes.tar").stat().st_size == 400
    assert (tmp_path / "mmloader-lookalike" / "x.tar").stat().st_size == 400
    assert cache.fetch("huge.tar", 1001, _writer(b"h" * 1001, calls)) is None  # cannot fit: not cached
    assert cache.refused == "full" and a.exists() and c.exists()


def test_another_download_of_the_same_file_is_waited_for_or_skipped(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds")
    cache._ensure_dir()
    # flock locks belong to the open file: this descriptor stands for another process downloading
    fd = os.open(cache.dir / ".a.tar.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    calls: list = []
    try:
        assert cache.fetch("a.tar", 10, _writer(b"0123456789", calls), wait=False) is None
        assert cache.refused == "busy" and calls == []
    finally:
        os.close(fd)  # the other download is gone (as when its process dies): the lock with it
    assert cache.fetch("a.tar", 10, _writer(b"0123456789", calls), wait=False).read_bytes() == b"0123456789"


def test_parts_of_live_downloads_count_and_parts_of_dead_ones_are_removed(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds", limit=1000)
    cache._ensure_dir()
    dead = cache.dir / ".gone.tar.part-1-abc"
    dead.write_bytes(b"d" * 300)  # no process holds its lock
    live = cache.dir / ".busy.tar.part-2-def"
    live.write_bytes(b"l" * 300)
    fd = os.open(cache.dir / ".busy.tar.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        finals, held = cache.usage()
        assert finals == [] and held == 300
        assert not dead.exists() and live.exists()
        calls: list = []
        assert cache.fetch("big.tar", 800, _writer(b"b" * 800, calls)) is None  # 300 held + 800 > 1000
        assert cache.refused == "full" and calls == []
    finally:
        os.close(fd)


def test_datasets_endpoints_and_versions_get_their_own_folders_and_caches_pickle(tmp_path):
    a = ShardCache(tmp_path, "s3://b/ds", tag="http://one|v1")
    assert a.dir != ShardCache(tmp_path, "s3://b/ds", tag="http://two|v1").dir
    assert a.dir != ShardCache(tmp_path, "s3://b/ds", tag="http://one|v2").dir
    assert a.dir != ShardCache(tmp_path, "s3://b/other", tag="http://one|v1").dir
    b = pickle.loads(pickle.dumps(a))
    assert (b.dir, b.limit, b.url, b.tag) == (a.dir, a.limit, a.url, a.tag)


def test_cache_limits_parse():
    assert parse_limit("20G") == 20 << 30 and parse_limit("512MiB") == 512 << 20 and parse_limit("1.5k") == 1536
    assert parse_limit(1000) == 1000 and parse_limit(None) is None and parse_limit("500000000") == 500000000
    for bad in ("lots", 0, -5, "0G"):
        with pytest.raises(ValueError, match="cache_limit"):
            parse_limit(bad)


def _files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_many_files_through_a_small_cache_leave_only_the_cached_files_and_the_marker(tmp_path):
    """Issue #34: a lock file per file ever downloaded stayed behind, so the folder grew in
    files forever; locks and parts now go with their downloads, and only what fits is kept."""
    cache = ShardCache(tmp_path, "s3://b/ds", limit=10 << 10)
    calls: list = []
    for i in range(300):
        assert cache.fetch(f"shards/s{i:04d}.tar", 1024, _writer(bytes([i % 256]) * 1024, calls)) is not None
    finals, held = cache.usage()
    assert len(calls) == 300 and held == 0 and cache.size() <= 10 << 10
    assert _files(cache.dir) == sorted([MARKER, *(p.name for _m, _s, p in finals)]) and len(finals) == 10
    assert _files(tmp_path) == [".mmloader-cache.lock", cache.dir.name]  # the cache-wide lock: one file


def test_a_failed_download_leaves_no_lock_or_part(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds")

    def broken(fd: int, progress) -> None:
        raise ConnectionResetError("cut")

    with pytest.raises(ConnectionResetError):
        cache.fetch("a.tar", 100, broken)
    assert _files(cache.dir) == [MARKER]


@contextlib.contextmanager
def _dead_and_busy_downloads(cache: ShardCache):
    """In the cache's folder: the files a killed download left (a part and a free lock), and a
    download under way in another process (its lock held for the block, and its part)."""
    (cache.dir / ".dead.tar.part-7-abc123").write_bytes(b"d" * 10)
    (cache.dir / ".dead.tar.lock").touch()
    fd = os.open(cache.dir / ".busy.tar.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live download in another process
    (cache.dir / ".busy.tar.part-8-def456").write_bytes(b"b" * 20)
    try:
        yield
    finally:
        os.close(fd)


def test_lock_files_of_dead_downloads_and_earlier_versions_are_removed_held_ones_kept(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds", limit=1000)
    cache._ensure_dir()
    for i in range(50):  # what earlier versions left: one lock file per file ever downloaded
        (cache.dir / f".old{i}.tar.lock").touch()
    with _dead_and_busy_downloads(cache):
        assert cache.usage() == ([], 20)
        assert _files(cache.dir) == sorted([MARKER, ".busy.tar.lock", ".busy.tar.part-8-def456"])


def test_a_waiter_whose_lock_file_was_removed_locks_the_file_the_name_is_now(tmp_path, monkeypatch):
    """The holder of a lock removes its file when done: a process that was waiting then holds a
    lock on a removed file, which locks nothing, and must take the name's lock again."""
    path = tmp_path / ".a.tar.lock"
    real, calls = shard_cache._flock, []

    def removed_while_waiting(fd: int, blocking: bool) -> bool:
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(path)  # as the holder does when its download ends
        return real(fd, blocking)

    monkeypatch.setattr(shard_cache, "_flock", removed_while_waiting)
    fd = shard_cache._lock(path, blocking=True)
    try:
        assert len(calls) == 2 and os.fstat(fd).st_ino == os.stat(path).st_ino
    finally:
        shard_cache._unlock(path, fd)
    assert not path.exists()


def test_two_downloads_of_one_file_at_once_download_it_once_and_leave_no_lock(tmp_path):
    cache = ShardCache(tmp_path, "s3://b/ds")
    started, release = threading.Event(), threading.Event()
    calls: list = []

    def slow(fd: int, progress) -> None:
        started.set()
        assert release.wait(30)
        _writer(b"x" * 100, calls)(fd, progress)

    got: dict = {}
    first = threading.Thread(target=lambda: got.setdefault("first", cache.fetch("a.tar", 100, slow)))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=lambda: got.setdefault("second", cache.fetch("a.tar", 100, slow, wait=True)))
    second.start()
    _wait_for_a_blocked_flock(cache.dir / ".a.tar.lock")
    release.set()
    first.join(30)
    second.join(30)
    assert got["first"] == got["second"] == cache.path("a.tar") and calls == [100]
    assert _files(cache.dir) == [MARKER, "a.tar"]


def _wait_for_a_blocked_flock(path, timeout: float = 30.0) -> None:
    """Until the kernel lists a process waiting for the lock of ``path`` (``/proc/locks``: Linux)."""
    if not os.path.exists("/proc/locks"):
        return
    ino = os.stat(path).st_ino
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/locks") as f:
            if any("->" in line and f":{ino} " in line for line in f):
                return
        time.sleep(0.005)
    raise AssertionError(f"nobody waited for {path}")


def test_without_a_limit_a_download_removes_the_parts_and_locks_of_killed_downloads(tmp_path):
    """Without cache_limit nothing scanned the cache: a killed download's lock and its part, of
    the shard's full size, stayed through every later download of other files."""
    cache = ShardCache(tmp_path, "s3://b/ds")
    cache._ensure_dir()
    with _dead_and_busy_downloads(cache):
        assert cache.fetch("a.tar", 100, _writer(b"a" * 100, [])) == cache.path("a.tar")
        assert _files(cache.dir) == sorted([MARKER, "a.tar", ".busy.tar.lock", ".busy.tar.part-8-def456"])
        (cache.dir / ".dead2.tar.lock").touch()  # killed since: swept at most once a minute per cache
        cache.fetch("b.tar", 100, _writer(b"b" * 100, []))
        assert ".dead2.tar.lock" in _files(cache.dir)
        assert ShardCache(tmp_path, "s3://b/ds").fetch("c.tar", 1, _writer(b"c", [])) is not None  # a new one sweeps
        assert ".dead2.tar.lock" not in _files(cache.dir)
