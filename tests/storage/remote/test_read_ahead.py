"""Read-ahead (mmloader.storage.remote.read_ahead): chunks of consecutive samples fetched ahead of the
plan within a byte budget. The unit tests run a ReadAhead over real local tar shards, fetching
its chunks by ranged reads of the shard files on a thread; the last one reads through a
RemoteTarStore on moto's S3."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import types

import pytest
from conftest import write_dataset
from remote_servers import own_cache, s3  # noqa: F401  (fixtures)

import mmloader
from mmloader.storage.remote.read_ahead import ReadAhead
from mmloader.storage.remote.tar import RemoteTarStore

N = 24


class LocalShards:
    """The location a ReadAhead fetches its chunks through: ranged reads of local shard files, in
    the background. ``hold`` keeps every fetch waiting until it is set; ``fail`` makes them fail."""

    def __init__(self, root):
        self.root = root
        self.requests: list[tuple[str, int, int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail = False
        self.pool = concurrent.futures.ThreadPoolExecutor(16)
        self.lock = threading.Lock()
        self.running = self.most_running = 0

    def start_range(self, name: str, start: int, end: int) -> concurrent.futures.Future:
        self.requests.append((name, start, end))
        return self.pool.submit(self._read, name, start, end)

    def _read(self, name: str, start: int, end: int) -> bytes:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            self.hold.wait(30)
            if self.fail:
                raise ConnectionResetError("reset by the test")
            with open(os.path.join(self.root, name), "rb") as f:
                return os.pread(f.fileno(), end - start, start)
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ra") / "shards", N, "tar", shard_size=12)


@pytest.fixture
def store(shards):
    """What ReadAhead needs of its store: shards, their offset tables, a location."""
    local = mmloader.open(shards)
    return types.SimpleNamespace(
        shards=local.shards, _shard_index=local._shard_index, location=LocalShards(shards), local=local
    )


def _span(store, s: int, row: int) -> tuple[int, int]:
    """Bytes of sample ``row`` of shard ``s``: its first header to its last member's end."""
    table = store._shard_index(s)[row]
    present = table[:, 0] >= 0
    return int(table[present, 0].min()) - 512, int((table[present, 0] + table[present, 1]).max())


def _file_bytes(store, s: int, a: int, b: int) -> bytes:
    with open(store.local.shard_path(s), "rb") as f:
        return os.pread(f.fileno(), b - a, a)


def _wait(ra: ReadAhead) -> None:
    for _s, chunk in list(ra.queue) + [(None, c) for c in ra.chunks.values()]:
        if chunk.future is not None:
            chunk.future.result(30)


def test_the_first_touch_plans_a_chunk_and_the_rest_of_it_is_sliced_from_it(store):
    ra = ReadAhead(store, budget=1 << 30, chunk_bytes=store.shards[0]["bytes"] // 2)
    rows = ra._rows(0)
    assert 1 < rows < store.shards[0]["count"]
    assert ra.serve(0, 0, *_span(store, 0, 0)) is None  # read directly; the chunk is only planned
    assert len(ra.planned) == 1 and not store.location.requests
    ra.start()
    _wait(ra)
    assert len(store.location.requests) == 1
    for row in range(1, rows):
        a, b = _span(store, 0, row)
        buf, base = ra.serve(0, row, a, b)
        assert buf[a - base : b - base] == _file_bytes(store, 0, a, b)
    assert not ra.chunks and ra.held == 0  # every sample served once: the chunk's memory went back
    assert ra.fetched == store.location.requests[0][2] - store.location.requests[0][1]
    assert ra.serve(0, rows, *_span(store, 0, rows)) is None  # the next region: a new chunk planned
    assert len(ra.planned) == 1


def test_chunks_never_exceed_the_budget_and_one_larger_than_it_is_never_fetched(store):
    chunk = store.shards[0]["bytes"] // 4
    ra = ReadAhead(store, budget=2 * chunk, chunk_bytes=chunk)
    held, sliced = [], 0
    for s in range(len(store.shards)):
        for row in range(store.shards[s]["count"]):  # a sequential pass, a sample a batch
            a, b = _span(store, s, row)
            hit = ra.serve(s, row, a, b)
            if hit is not None:
                sliced += 1
                assert hit[0][a - hit[1] : b - hit[1]] == _file_bytes(store, s, a, b)
            ra.start()
            _wait(ra)
            held.append(ra.held)
    assert max(held) <= 2 * chunk and ra.fetched > 0 and sliced > N // 2
    small = ReadAhead(store, budget=100, chunk_bytes=chunk)
    assert small.serve(0, 0, *_span(store, 0, 0)) is None
    small.start()
    assert not small.planned and not small.chunks and small.held == 0 and small.fetched == 0


def test_a_chunk_still_on_its_way_is_not_waited_for_and_is_never_fetched_once_all_served(store):
    store.location.hold.clear()  # every fetch waits
    ra = ReadAhead(store, budget=1 << 30, chunk_bytes=store.shards[0]["bytes"] // 3)
    rows = ra._rows(0)
    ra.serve(0, 0, *_span(store, 0, 0))
    ra.start()
    for row in range(1, rows):
        assert ra.serve(0, row, *_span(store, 0, row)) is None  # read directly, not behind the chunk
    assert not ra.chunks and ra.held == 0  # all served directly: dropped
    ra.serve(1, 0, *_span(store, 1, 0))  # plan one more, then drop it before it is launched
    for row in range(1, min(rows, store.shards[1]["count"])):
        ra.serve(1, row, *_span(store, 1, row))
    n = len(store.location.requests)
    ra.start()
    assert len(store.location.requests) == n  # a dropped chunk is skipped, not fetched
    store.location.hold.set()


def test_at_most_max_in_flight_chunks_are_fetched_at_once(store):
    store.location.hold.clear()
    ra = ReadAhead(store, budget=1 << 30, chunk_bytes=1)  # one sample a chunk: many chunks
    for s in range(len(store.shards)):
        for row in range(store.shards[s]["count"]):
            ra.serve(s, row, *_span(store, s, row))
    ra.start()
    assert ra.inflight == len(store.location.requests) == ReadAhead.MAX_IN_FLIGHT < N
    store.location.hold.set()  # each chunk that lands launches the next
    for _ in range(600):
        if len(store.location.requests) == N and ra.inflight == 0:
            break
        threading.Event().wait(0.05)
    assert len(store.location.requests) == N and ra.inflight == 0
    assert store.location.most_running <= ReadAhead.MAX_IN_FLIGHT


def test_a_failed_chunk_is_dropped_and_the_read_goes_its_own_way(store):
    store.location.fail = True
    ra = ReadAhead(store, budget=1 << 30, chunk_bytes=store.shards[0]["bytes"] // 2)
    ra.serve(0, 0, *_span(store, 0, 0))
    ra.start()
    concurrent.futures.wait([c.future for c in ra.chunks.values()], 30)
    assert ra.serve(0, 1, *_span(store, 0, 1)) is None
    assert not ra.chunks and ra.held == 0
    ra.clear()
    assert ra.held == 0


# -- through a RemoteTarStore on S3 ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory, s3):
    pytest.importorskip("obstore")
    tar = write_dataset(tmp_path_factory.mktemp("ra-remote") / "shards", N, "tar", shard_size=5)
    return {"local": {"tar": tar}, "s3": {"tar": s3.upload(tar, "ra-shards")}}


def test_readahead_fetches_each_byte_once_within_its_budget(data):
    local = mmloader.open(data["local"]["tar"])
    total = sum(s["bytes"] for s in local.shards)
    store = RemoteTarStore(data["s3"]["tar"], readahead=True, chunk_bytes=4096, readahead_bytes=3 * 4096)
    held = []
    for start in range(0, N, 4):  # a sequential pass
        assert (
            store.read_many(list(range(start, start + 4)), ["jpg", "txt"])[1]
            == local.read_many(list(range(start, start + 4)), ["jpg", "txt"])[1]
        )
        held.append(store._ra.held)
    assert max(held) <= 3 * 4096
    stats = store.stats()
    assert stats["readahead"] > 0
    assert stats["readahead"] + stats["ranged"] <= 1.5 * total  # no read amplification beyond the first touches


def test_readahead_is_off_in_worker_processes_and_with_a_cache(data, tmp_path):
    store = RemoteTarStore(data["s3"]["tar"])
    assert isinstance(store._ra, ReadAhead)  # the opening process: on by default
    store._owner = -1  # as in a worker process (another pid than the one that opened it)
    store._reset_remote()
    assert store._ra is None
    assert RemoteTarStore(data["s3"]["tar"], cache_dir=str(tmp_path))._ra is None
    assert store.read_many([0, 1], ["cls"])[1] == mmloader.open(data["local"]["tar"]).read_many([0, 1], ["cls"])[1]
