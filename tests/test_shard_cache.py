"""The node-local shard cache (mmloader.storage.shard_cache) on real files: one download per
file, nothing partial visible, bounded by its limit, and never deleting a file it did not write.
(The cache under a RemoteTarStore over S3, across processes and kill -9, is in test_remote.py.)"""

from __future__ import annotations

import fcntl
import os
import pickle

import pytest

from mmloader.storage.shard_cache import MARKER, ShardCache, parse_limit


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
