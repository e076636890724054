"""Live sources (mmloader.live): real producers (a loopback HTTP server, a producer process
writing into a multiprocessing queue, generators), both backends, real 2-rank DDP on gloo."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse
from urllib.request import urlopen

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from conftest import jpeg_bytes

import mmloader
from mmloader.errors import LiveSourceError, PlanChangedError, ResumeError
from mmloader.live_sources.agree import ENDED, FAILED, READY, agree
from mmloader.live_sources.fetch import Fetcher

BACKENDS = ["thread", "process"]


def _loader(stream, backend: str, workers: int = 2, **kw):
    if backend == "process":
        kw.setdefault("multiprocessing_context", "fork")
    return mmloader.loader(stream, workers, backend=backend, **kw)


def _numbered(rank: int, world: int, worker: int, workers: int, count: int = 10_000):
    """A slice's own samples: keys say which slice made them."""
    for i in range(count):
        yield {"__key__": f"r{rank}w{worker}of{workers}-{i}", "x": torch.tensor([i])}


class Offsets:
    """A partitioned source that can say where it is (as a queue consumer's offset)."""

    def __init__(self, rank: int, world: int, worker: int, workers: int, count: int = 10_000):
        self.part, self.offset, self.count = rank * workers + worker, 0, count

    def __iter__(self):
        while self.offset < self.count:
            i = self.offset
            self.offset += 1
            yield {"__key__": f"p{self.part}-{i}", "x": torch.tensor([i])}

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]


def _keys(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


# -- a live source alone ---------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_steps_bound_a_pass_and_each_slice_is_read_once(backend):
    stream = mmloader.LiveStream(mmloader.live(_numbered), batch_size=8, steps=12)
    loader = _loader(stream, backend)
    batches = list(loader)
    assert len(batches) == 12 == len(loader)
    keys = _keys(batches)
    assert len(keys) == 96 and len(set(keys)) == 96
    slices = Counter(k.split("-")[0] for k in keys)
    # process backend: each worker's own slice; thread backend: one reader per rank
    assert set(slices) == {"r0w0of2", "r0w1of2"}  # num_workers readers on either backend
    assert loader.epoch_done and loader.state_dict()["epoch"] == 1
    stats = loader.stats()  # the live readers' batches are timed where they are built, as stored ones
    assert stats["read_ms_per_batch"] >= 0 and stats["decode_ms_per_batch"] >= 0 and stats["builders"] >= 1


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_finite_source_ends_the_pass_with_its_last_short_batch(backend):
    stream = mmloader.LiveStream(mmloader.live(lambda *s: _numbered(*s, count=21)), batch_size=8, steps=100)
    batches = list(_loader(stream, backend))
    # each reader's last batch is short; the pass ends at the first step no reader has
    assert [len(b["__key__"]) for b in batches] == [8] * 4 + [5, 5]
    assert len(set(_keys(batches))) == len(_keys(batches))
    assert "ran out of samples at batch 6 of the pass, before steps=100" in stream.ended
    dropped = mmloader.LiveStream(
        mmloader.live(lambda *s: _numbered(*s, count=21)), batch_size=8, steps=100, drop_last=True
    )
    assert [len(b["__key__"]) for b in _loader(dropped, backend)] == [8] * 4


@pytest.mark.process
def test_split_deal_gives_each_reader_every_nth_sample_of_one_stream():
    def one_stream(rank, world, worker, workers):
        assert (rank, world, worker, workers) == (0, 1, 0, 1)
        return _numbered(0, 1, 0, 1, count=40)

    stream = mmloader.LiveStream(mmloader.live(one_stream, split="deal"), batch_size=5, steps=100)
    keys = _keys(_loader(stream, "process"))
    assert sorted(keys, key=lambda k: int(k.rsplit("-", 1)[1])) == [f"r0w0of1-{i}" for i in range(40)]


def test_live_sources_validate_their_options():
    with pytest.raises(TypeError, match="factory"):
        mmloader.live(42)
    with pytest.raises(ValueError, match="split="):
        mmloader.live(_numbered, split="round")
    with pytest.raises(ValueError, match="timeout="):
        mmloader.live(_numbered, timeout=0)
    with pytest.raises(ValueError, match="batch_size"):
        mmloader.LiveStream(mmloader.live(_numbered))
    with pytest.raises(ValueError, match="steps="):
        mmloader.LiveStream(mmloader.live(_numbered), batch_size=4, steps=0)
    with pytest.raises(TypeError, match="no length"):
        len(mmloader.LiveStream(mmloader.live(_numbered), batch_size=4))
    with pytest.raises(ValueError, match="persistent_workers"):
        mmloader.loader(
            mmloader.LiveStream(mmloader.live(_numbered), batch_size=4, steps=2), 2, persistent_workers=True
        )
    with pytest.raises(TypeError, match="has no length"):
        mmloader.Mix([mmloader.live(_numbered)])


# -- a real producer on loopback: JSON lines with base64 images --------------------------------


class _JsonLines(BaseHTTPRequestHandler):
    count = 30

    def do_GET(self):  # /stream?part=P: that partition's samples, one JSON object a line
        part = int(parse_qs(urlparse(self.path).query)["part"][0])
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for i in range(self.count):
            sample = {
                "__key__": f"p{part}-{i:03d}",
                "jpg": base64.b64encode(jpeg_bytes(part * 1000 + i)).decode(),
                "txt": f"caption {part}-{i:03d}",
            }
            self.wfile.write(json.dumps(sample).encode() + b"\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def jsonl_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JsonLines)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _http_factory(url: str):
    def factory(rank, world, worker, workers):
        with urlopen(f"{url}/stream?part={rank * workers + worker}") as response:
            for line in response:
                sample = json.loads(line)
                yield {
                    "__key__": sample["__key__"],
                    "jpg": base64.b64decode(sample["jpg"]),
                    "txt": sample["txt"].encode(),
                }

    return factory


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_samples_from_a_loopback_server_are_decoded_by_the_stored_readers(jsonl_server, backend):
    source = mmloader.live(
        _http_factory(jsonl_server),
        name="captioner",
        decode={"image": mmloader.ImageReader(None, "jpg", size=(24, 16)), "caption": mmloader.TextReader(None, "txt")},
    )
    batches = list(_loader(mmloader.LiveStream(source, batch_size=7, steps=50), backend))
    keys = _keys(batches)
    assert len(keys) == 30 * 2 == len(set(keys))
    for batch in batches:
        assert batch["image"].shape[1:] == (3, 24, 16) and batch["image"].dtype == torch.uint8
        for key, caption in zip(batch["__key__"], batch["caption"]):
            assert caption == f"caption {key[1:]}"
    # the pixels are the producer's image, decoded as a stored one would be
    first = batches[0]["__key__"][0]
    part, i = (int(x) for x in first[1:].split("-"))
    stored_way = mmloader.ImageReader(None, "jpg", size=(24, 16)).from_record(
        {"__key__": first, "jpg": jpeg_bytes(part * 1000 + i)}
    )
    assert torch.equal(batches[0]["image"][0], stored_way)


def test_a_corrupt_live_image_is_named_by_key_and_source_or_skipped_and_counted(jsonl_server):
    def factory(rank, world, worker, workers):
        for i in range(12):
            yield {"__key__": f"k{i}", "jpg": b"not a jpeg" if i == 3 else jpeg_bytes(i)}

    decode = {"image": mmloader.ImageReader(None, "jpg", size=(8, 8))}
    with pytest.raises(mmloader.DecodeError, match=r"key='k3'.*live source 'cams'"):
        list(
            _loader(
                mmloader.LiveStream(mmloader.live(factory, name="cams", decode=decode), batch_size=4, steps=3),
                "thread",
                workers=1,
            )
        )
    stream = mmloader.LiveStream(
        mmloader.live(factory, name="cams", decode=decode), batch_size=4, steps=2, errors="skip"
    )
    batches = list(_loader(stream, "thread", workers=1))
    # left out of its batch (a replacement would come from later in the source, out of order
    # and outside the batch's checkpointed position), counted and logged
    assert [b["__key__"] for b in batches] == [["k0", "k1", "k2"], ["k4", "k5", "k6", "k7"]]
    assert stream.skipped == 1


# -- mixed with stored data ---------------------------------------------------------------------


def _stored(path: Path, n: int) -> str:
    with mmloader.LMDBWriter(path) as w:
        for i in range(n):
            w.write({"__key__": f"st{i:03d}", "txt": f"stored {i}"})
    return str(path)


def _text_live(rank, world, worker, workers):
    for i in range(100_000):
        yield {"__key__": f"live{rank}.{worker}.{i}", "txt": f"live {i}".encode()}


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_to_three_live_stored_mix_keeps_the_stored_part_exactly_once(tmp_path, backend):
    stored = mmloader.zip(text=mmloader.TextReader(_stored(tmp_path / "s.lmdb", 150)))
    live = mmloader.live(_text_live, name="gen", decode={"text": mmloader.TextReader(None, "txt")})
    stream = mmloader.LiveStream(mmloader.mix([stored, live], weights=[3, 1]), batch_size=8, seed=3)
    loader = _loader(stream, backend)
    orders = []
    for epoch in range(2):
        batches = list(loader)
        assert stream.epoch == epoch
        orders.append([k for k in _keys(batches) if k.startswith("st")])
        keys = _keys(batches)
        stored_keys = [k for k in keys if k.startswith("st")]
        assert sorted(stored_keys)[:150] == [f"st{i:03d}" for i in range(150)]  # every stored sample
        assert len(stored_keys) - len(set(stored_keys)) < 6  # repeats only to fill the last batch
        assert len(batches) == len(stream) == 25
        for start in range(0, len(keys) - 100, 100):  # the share, per 100 samples
            assert abs(sum(k.startswith("live") for k in keys[start : start + 100]) - 25) <= 2
        assert all(b["__source__"].count("gen") == 2 for b in batches)
        assert all(
            t == f"stored {int(k[2:])}" for b in batches for k, t in zip(b["__key__"], b["text"]) if k[:2] == "st"
        )
    assert orders[0] != orders[1]  # a new order each epoch


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mix_by_share_of_steps_alternates_whole_batches(tmp_path, backend):
    stored = mmloader.zip(text=mmloader.TextReader(_stored(tmp_path / "s.lmdb", 64)))
    live = mmloader.live(_text_live, name="gen", decode={"text": mmloader.TextReader(None, "txt")})
    stream = mmloader.LiveStream(mmloader.mix([stored, live], [3, 1], batch_composition="source"), batch_size=4)
    batches = list(_loader(stream, backend))
    kinds = ["live" if b["__key__"][0].startswith("live") else "stored" for b in batches]
    assert kinds.count("stored") == 16 and kinds.count("live") == 5 == len(batches) - 16
    assert all(len({k[:2] for k in b["__key__"]}) == 1 for b in batches)  # whole batches
    assert sorted(k for k in _keys(batches) if k.startswith("st")) == [f"st{i:03d}" for i in range(64)]


def test_mix_validates_the_live_share(tmp_path):
    stored = mmloader.zip(text=mmloader.TextReader(_stored(tmp_path / "s.lmdb", 10)))
    live = mmloader.live(_text_live)
    with pytest.raises(ValueError, match="one live source"):
        mmloader.mix([stored, live, mmloader.live(_text_live)])
    with pytest.raises(ValueError, match="shares"):
        mmloader.mix([stored, live], mode="repeat")
    with pytest.raises(ValueError, match="0 live samples"):
        mmloader.LiveStream(mmloader.mix([stored, live], [99, 1]), batch_size=8)


# -- checkpoints ----------------------------------------------------------------------------------


def _run(stream_fn, backend, stop_after=None, state=None):
    loader = _loader(stream_fn(), backend)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch in loader:
        out.append(batch)
        if stop_after is not None and len(out) == stop_after:
            return out, loader.state_dict()
    return out, loader.state_dict()


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_stored", [False, True])
def test_a_checkpointed_offset_resumes_exactly(tmp_path, backend, with_stored):
    path = _stored(tmp_path / "s.lmdb", 60) if with_stored else None

    def stream_fn():
        source = mmloader.live(Offsets, name="q")
        if path is None:
            return mmloader.LiveStream(source, batch_size=6, steps=10)
        return mmloader.LiveStream(
            mmloader.mix([mmloader.zip(text=mmloader.TextReader(path)), source], [2, 1]), batch_size=6
        )

    full, end_state = _run(stream_fn, backend)
    for k in (1, 4, 7):
        head, state = _run(stream_fn, backend, stop_after=k)
        state = json.loads(json.dumps(state))  # plain data, as a checkpoint keeps it
        tail, _ = _run(stream_fn, backend, state=state)
        assert _keys(head) + _keys(tail) == _keys(full)
        assert state["live"]["checkpointable"]
    # the next epoch goes on from the source's position after the last delivered batch
    nxt, _ = _run(stream_fn, backend, state=end_state)
    assert not set(_keys(nxt)) & set(k for k in _keys(full) if k.startswith("p"))
    assert any(k.startswith("p") for k in _keys(nxt))


def test_a_source_that_cannot_say_where_it_is_resumes_with_one_log_line(caplog):
    def fn():
        return mmloader.LiveStream(mmloader.live(_numbered, name="gen"), batch_size=4, steps=6)

    _, state = _run(fn, "thread", stop_after=2)
    assert not state["live"]["checkpointable"]
    with caplog.at_level(logging.WARNING, logger="mmloader"):
        tail, _ = _run(fn, "thread", state=state)
    lines = [r.getMessage() for r in caplog.records if "cannot say where it is" in r.getMessage()]
    assert len(lines) == 1 and "'gen'" in lines[0] and "at-most-once" in lines[0]
    assert len(tail) == 4  # the rest of the pass's steps


def test_a_state_of_another_plan_or_kind_is_refused(tmp_path):
    _, state = _run(lambda: mmloader.LiveStream(mmloader.live(Offsets, name="q"), batch_size=4, steps=6), "thread", 2)
    other = mmloader.loader(
        mmloader.LiveStream(mmloader.live(Offsets, name="q"), batch_size=5, steps=6), 1, backend="thread"
    )
    with pytest.raises(PlanChangedError, match="batch_size: 4 -> 5"):
        other.load_state_dict(state)
    stored = mmloader.zip(text=mmloader.TextReader(_stored(tmp_path / "s.lmdb", 10)))
    plain = mmloader.loader(mmloader.Stream(stored, batch_size=2), 1, backend="thread")
    with pytest.raises(ResumeError):
        _loader(mmloader.LiveStream(mmloader.live(Offsets, name="q"), batch_size=4, steps=6), "thread").load_state_dict(
            plain.state_dict()
        )


# -- faults ---------------------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_that_raises_is_an_error_naming_it(backend):
    def factory(rank, world, worker, workers):
        yield from _numbered(rank, world, worker, workers, count=5)
        raise ConnectionError("the captioning service went away")

    with pytest.raises(LiveSourceError, match=r"live source 'captions'.*ConnectionError.*went away"):
        list(_loader(mmloader.LiveStream(mmloader.live(factory, name="captions"), batch_size=4, steps=10), backend))


_RELEASE = threading.Event()  # what stuck producers wait for: set after each test


@pytest.fixture(autouse=True)
def _no_reader_thread_outlives_its_test():
    """Stuck producers are released and their reader threads gone before the next test: a thread
    that ends while a later test forks its DataLoader workers can crash or hang the child
    (CPython 3.11, gh-112275), so none is left to end then."""
    yield
    _RELEASE.set()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(t.name.startswith("mmloader-live") for t in threading.enumerate()):
        time.sleep(0.02)
    _RELEASE.clear()


def _stalls_after(n: int):
    def factory(rank, world, worker, workers):
        yield from _numbered(rank, world, worker, workers, count=n)
        _RELEASE.wait()  # stuck until the test is over

    return factory


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stalled_source_ends_the_pass_within_its_timeout_or_raises(backend, caplog):
    stream = mmloader.LiveStream(mmloader.live(_stalls_after(8), timeout=0.5), batch_size=4, steps=100)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mmloader"):
        batches = list(_loader(stream, backend))
    assert time.monotonic() - began < 8  # 0.5 s of waiting, plus starting workers
    assert len(_keys(batches)) == 8 * 2
    said = " ".join(r.getMessage() for r in caplog.records)
    # what happened, where, and what to do, in words (not "its reader 0/1 stalled at step 4")
    assert "every rank ends this pass after 4 of 100 batches" in said
    assert "got no sample for 0.5 s at batch 5 of the pass" in said and "timeout=" in said
    assert "reader for rank=0, worker=" in said and "on_stall='raise'" in said
    raising = mmloader.LiveStream(
        mmloader.live(_stalls_after(8), timeout=0.5, on_stall="raise"), batch_size=4, steps=100
    )
    with pytest.raises(LiveSourceError, match=r"no sample for 0.5 s"):
        list(_loader(raising, backend))


def _produce(q, n: int, then_die: bool):
    # bytes, not tensors: a tensor put in a torch queue is fetched from its producer when read,
    # which is gone by then
    for i in range(n):
        q.put({"__key__": f"q{i}", "x": i.to_bytes(4, "little")})
    if then_die:
        os.kill(os.getpid(), signal.SIGKILL)
    q.put(None)


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_producer_process_that_dies_is_a_named_error_within_seconds(backend):
    ctx = torch.multiprocessing.get_context("fork")
    q = ctx.Queue(maxsize=16)
    producer = ctx.Process(target=_produce, args=(q, 10, True), daemon=True)
    producer.start()
    source = mmloader.live(lambda *_: mmloader.from_queue(q, producer=producer), name="queue")
    began = time.monotonic()
    with pytest.raises(LiveSourceError, match=rf"producer process \(pid {producer.pid}\).*(killed by signal 9|exited)"):
        list(_loader(mmloader.LiveStream(source, batch_size=4, steps=100), backend, workers=1))
    assert time.monotonic() - began < 10
    producer.join(5)


@pytest.mark.process
def test_a_queue_producer_that_finishes_ends_the_stream():
    ctx = torch.multiprocessing.get_context("fork")
    q = ctx.Queue(maxsize=4)
    producer = ctx.Process(target=_produce, args=(q, 10, False), daemon=True)
    producer.start()
    stream = mmloader.LiveStream(mmloader.live(lambda *_: mmloader.from_queue(q, producer=producer)), batch_size=4)
    assert _keys(_loader(stream, "thread")) == [f"q{i}" for i in range(10)]
    producer.join(5)


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_stays_bounded_with_a_fast_producer_and_a_slow_consumer(backend):
    produced = torch.zeros(2, dtype=torch.int64).share_memory_()  # slices' counts, seen across fork

    def factory(rank, world, worker, workers):
        for i in range(10_000):
            produced[worker] += 1
            yield {"__key__": f"w{worker}-{i}", "x": torch.full((16_384,), i, dtype=torch.float32)}  # 64 KiB

    stream = mmloader.LiveStream(mmloader.live(factory, buffer=32), batch_size=10, steps=1000)
    loader = _loader(stream, backend, prefetch_factor=2)
    lag = 0
    for n, batch in enumerate(loader, 1):
        time.sleep(0.0005)
        lag = max(lag, int(produced.sum()) - 10 * n)
    assert n == 1000
    readers = 2
    # read ahead at most: each reader's buffer, the sample in its hand, and the batches in flight
    assert lag <= readers * (32 + 1) + 10 * (2 * readers + 2) + 10, lag


# -- the pieces ----------------------------------------------------------------------------------


def test_a_fetcher_waits_boundedly_and_reports_ends_and_errors():
    fetcher = Fetcher(lambda: iter(range(5)), "test", buffer=2)
    assert fetcher.take(3, 1.0) == ([0, 1, 2], None, None)
    assert fetcher.take(5, 1.0) == ([3, 4], None, "ended")
    assert fetcher.take(1, 1.0).short == "ended" and fetcher.finished

    def bad():
        yield 1
        raise KeyError("gone")

    failing = Fetcher(bad, "src", buffer=2)
    with pytest.raises(LiveSourceError, match="src raised KeyError"):
        failing.take(2, 1.0)
    slow = Fetcher(lambda: _stalls_after(0)(0, 1, 0, 1), "slow", buffer=2)
    began = time.monotonic()
    assert slow.take(1, 0.2).short == "stalled"
    assert 0.15 < time.monotonic() - began < 2
    slow.close()


def test_a_fetcher_bounds_the_factory_call_and_names_its_errors():
    def connects_slowly():
        _RELEASE.wait(5)
        return iter(range(3))

    began = time.monotonic()
    slow = Fetcher(connects_slowly, "svc", buffer=2)
    with pytest.raises(LiveSourceError, match="no sample for 0.3 s"):
        slow.take(1, 0.3, "raise")
    assert time.monotonic() - began < 2
    slow.close()

    def refuses():
        raise ConnectionRefusedError("no captioner on port 9")

    with pytest.raises(LiveSourceError, match="svc raised ConnectionRefusedError: no captioner"):
        Fetcher(refuses, "svc", buffer=2).take(1, 1.0)


def test_a_source_that_cannot_say_where_it_is_is_read_only_on_demand():
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    fetcher = Fetcher(source, "q", buffer=50)
    assert fetcher.take(3, 1.0).samples == [0, 1, 2]
    time.sleep(0.3)  # time to read ahead, if it did
    assert pulled == [0, 1, 2]  # nothing taken from the source that no batch asked for
    ahead = Fetcher(lambda: Offsets(0, 1, 0, 1, count=100), "log", buffer=5)  # can be put back: reads ahead
    assert len(ahead.take(2, 1.0).samples) == 2
    time.sleep(0.3)
    assert len(ahead._items) == 5
    fetcher.close()
    ahead.close()


def test_batches_take_their_samples_in_planning_order_whichever_thread_builds_them():
    fetcher = Fetcher(lambda: iter(range(40)), "t", buffer=4)
    got: dict[int, list] = {}

    def build(ticket):
        got[ticket] = fetcher.take(4, 2.0, ticket=ticket).samples

    threads = [threading.Thread(target=build, args=(t,)) for t in reversed(range(10))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert [got[t] for t in range(10)] == [list(range(4 * t, 4 * t + 4)) for t in range(10)]
    fetcher.close()


def test_agreement_on_one_rank_is_the_rank_own_code():
    assert [agree(c, None, 1) for c in (READY, ENDED, FAILED)] == [(READY, 0), (ENDED, 0), (FAILED, 0)]


@pytest.mark.process
def test_both_backends_read_the_same_slices_in_the_same_order():
    def stream_fn():
        return mmloader.LiveStream(mmloader.live(Offsets, name="q"), batch_size=4, steps=9)

    thread, thread_state = _run(stream_fn, "thread")
    process, _ = _run(stream_fn, "process")
    assert _keys(thread) == _keys(process)
    assert {k.split("-")[0] for k in _keys(thread)} == {"p0", "p1"}
    # so a state of one resumes on the other
    head, state = _run(stream_fn, "thread", stop_after=4)
    tail, _ = _run(stream_fn, "process", state=state)
    assert _keys(head) + _keys(tail) == _keys(thread)


# -- 2-rank DDP ------------------------------------------------------------------------------------


def _rank_main(rank: int, init: str, out: str, cases: list[str]) -> None:
    """Each case in turn in one process group, as passes of one training process would."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        for case in cases:
            _rank_case(rank, out, case)
    finally:
        dist.destroy_process_group()


def _rank_case(rank: int, out: str, case: str) -> None:
    if case == "ends_early":  # rank 1's source holds 30% fewer samples
        count = 40 if rank == 0 else 28
        source = mmloader.live(lambda r, w, k, K: _numbered(r, w, k, K, count=count), name="gen")
    elif case == "leaves":  # rank 0 leaves its loop early (a break): rank 1 must not wait for it
        source = mmloader.live(_numbered, name="gen")
    else:  # rank 1's source stalls after a few batches, and raises
        count = 400 if rank == 0 else 12
        source = mmloader.live(_stalls_after(count), name="gen", timeout=0.5, on_stall="raise")
    loader = mmloader.loader(
        mmloader.LiveStream(source, batch_size=4, steps=1000), 2, backend="process", multiprocessing_context="fork"
    )
    keys, error = [], None
    try:
        for batch in loader:
            step = torch.ones(1)
            dist.all_reduce(step)  # a training step's collective: hangs if ranks' batch counts differ
            keys += batch["__key__"]
            if case == "leaves" and rank == 0 and len(keys) == 12:
                break
    except LiveSourceError as e:
        error = str(e)
    after = torch.tensor([float(rank + 1)])
    dist.all_reduce(after)  # the loader's own agreement never pairs with the training's collectives
    assert after.item() == 3.0
    Path(out, f"rank{rank}-{case}.json").write_text(json.dumps({"keys": keys, "error": error}))
    dist.barrier()


DDP_CASES = ["ends_early", "leaves", "fails"]


@pytest.fixture(scope="module")
def ddp_cases(tmp_path_factory):
    """Two ranks run every case in turn: one launch for the three."""
    out = tmp_path_factory.mktemp("live-ddp")
    tmp.spawn(_rank_main, args=(str(out / "init"), str(out), DDP_CASES), nprocs=2, join=True)
    return out


@pytest.mark.process
@pytest.mark.parametrize("case", DDP_CASES)
def test_two_rank_ddp_ranks_end_together(ddp_cases, case):
    results = [json.loads((ddp_cases / f"rank{r}-{case}.json").read_text()) for r in range(2)]
    for r in results:
        assert len(r["keys"]) == len(set(r["keys"]))
    if case == "ends_early":
        # rank 1's two readers hold 28 samples each: 7 batches each, 14 steps; every rank stops there
        assert [len(r["keys"]) for r in results] == [56, 56]
        assert all(r["error"] is None for r in results)
    elif case == "leaves":  # rank 1 ended at the step rank 0 left at
        assert [len(r["keys"]) for r in results] == [12, 12]
    else:
        assert "no sample for 0.5 s" in results[1]["error"]
        assert "the loader of rank 1 failed" in results[0]["error"]
        assert len(results[0]["keys"]) == len(results[1]["keys"]) == 24


# -- what a first review found ----------------------------------------------------------------------


class CorruptAt(Offsets):
    """A checkpointable partition whose sample 5 does not decode."""

    def __iter__(self):
        while self.offset < self.count:
            i = self.offset
            self.offset += 1
            yield {"__key__": f"p{self.part}-{i}", "jpg": b"bad" if i == 5 else jpeg_bytes(i)}


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_skipping_a_bad_live_sample_keeps_resumes_exact(backend):
    def stream_fn():
        source = mmloader.live(CorruptAt, name="q", decode={"image": mmloader.ImageReader(None, "jpg", size=(8, 8))})
        return mmloader.LiveStream(source, batch_size=4, steps=8, errors="skip")

    full, _ = _run(stream_fn, backend)
    assert all("-5" not in k for k in _keys(full))
    for k in (1, 2, 5):
        head, state = _run(stream_fn, backend, stop_after=k)
        tail, _ = _run(stream_fn, backend, state=json.loads(json.dumps(state)))
        assert _keys(head) + _keys(tail) == _keys(full)


class Counter_(Offsets):
    """One deterministic stream (every reader sees the same), resumable: for split="deal"."""

    def __init__(self, *_):
        super().__init__(0, 1, 0, 1, count=1_000)


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dealt_source_is_read_once_across_passes_and_resumes(backend):
    def stream_fn():
        return mmloader.LiveStream(mmloader.live(Counter_, split="deal"), batch_size=3, steps=6)

    loader = _loader(stream_fn(), backend)
    seen = [k for _ in range(3) for b in loader for k in b["__key__"]]
    assert sorted(seen, key=lambda k: int(k.split("-")[1])) == [f"p0-{i}" for i in range(54)]
    full, _ = _run(stream_fn, backend)
    head, state = _run(stream_fn, backend, stop_after=1)
    tail, _ = _run(stream_fn, backend, state=state)
    assert _keys(head) + _keys(tail) == _keys(full)


def _produce_numbers(q, n: int, ends: int):
    for i in range(n):
        q.put({"__key__": f"q{i:04d}", "value": i})
    for _ in range(ends):
        q.put(None)


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_queue_read_over_many_passes_loses_and_repeats_nothing(backend):
    ctx = torch.multiprocessing.get_context("fork")
    q = ctx.Queue(maxsize=8)
    producer = ctx.Process(target=_produce_numbers, args=(q, 200, 1), daemon=True)  # one end for every reader
    producer.start()
    stream = mmloader.LiveStream(
        mmloader.live(lambda *_: mmloader.from_queue(q, producer=producer), name="queue"), batch_size=4, steps=5
    )
    loader = _loader(stream, backend)
    keys = []
    for _ in range(20):  # 20 passes of up to 5 batches
        keys += _keys(loader)
    assert sorted(keys) == [f"q{i:04d}" for i in range(200)]
    producer.join(5)


def test_steps_that_cut_the_stored_epoch_are_said_once(tmp_path, caplog):
    stored = mmloader.zip(text=mmloader.TextReader(_stored(tmp_path / "s.lmdb", 60)))
    stream = mmloader.LiveStream(mmloader.mix([stored, mmloader.live(_text_live)], [2, 1]), batch_size=6, steps=3)
    loader = _loader(stream, "thread")
    with caplog.at_level(logging.WARNING, logger="mmloader"):
        for _ in range(2):
            assert len(list(loader)) == 3
    assert sum("cuts each pass short" in r.getMessage() for r in caplog.records) == 1


def test_a_generator_that_starts_over_each_pass_is_said(caplog):
    loader = _loader(mmloader.LiveStream(mmloader.live(_numbered, name="gen"), batch_size=4, steps=2), "thread")
    with caplog.at_level(logging.WARNING, logger="mmloader"):
        first, second = _keys(loader), _keys(loader)
    assert first == second  # what it warns about
    assert any("starts it over" in r.getMessage() for r in caplog.records)


def _mesh_rank(rank: int, init: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dp = mesh["dp"].get_local_rank()
        count = 40 if dp == 0 else 20  # data-parallel rank 1's source ends early
        source = mmloader.live(lambda r, w, k, K: _numbered(r, w, k, K, count=count), name="gen")
        stream = mmloader.LiveStream(source, batch_size=4, steps=100, group=mesh["dp"])
        keys = []
        for batch in mmloader.loader(stream, 1, backend="thread"):
            step = torch.ones(1)
            dist.all_reduce(step)  # the whole world's collective, every step
            keys += batch["__key__"]
        Path(out, f"mesh{rank}.json").write_text(json.dumps({"dp": dp, "keys": keys}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.process
def test_a_dp_by_tp_mesh_ends_every_data_parallel_rank_together(tmp_path):
    tmp.spawn(_mesh_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=4, join=True)
    results = [json.loads((tmp_path / f"mesh{r}.json").read_text()) for r in range(4)]
    by_dp = {}
    for r in results:
        by_dp.setdefault(r["dp"], []).append(r["keys"])
    # the tensor-parallel peers of a data-parallel rank get the same batches; every rank the same count
    assert all(peers[0] == peers[1] for peers in by_dp.values())
    assert {len(r["keys"]) for r in results} == {20}
    assert by_dp[0][0] != by_dp[1][0]


def test_a_pass_without_steps_ends_with_its_source_quietly_and_deal_names_the_one_stream(caplog):
    """Without steps= a pass runs until the source ends: no warning, no advice; a dealt source
    is one stream, so it (not 'every reader') needs more samples."""
    with caplog.at_level(logging.INFO, logger="mmloader"):
        list(_loader(mmloader.LiveStream(mmloader.live(lambda *s: _numbered(*s, count=21)), batch_size=8), "thread"))
    ends = [r for r in caplog.records if "ends this pass" in r.getMessage()]
    assert ends and all(r.levelno == logging.INFO for r in ends) and "steps=" not in ends[0].getMessage()
    caplog.clear()
    dealt = mmloader.live(lambda *a: _numbered(0, 1, 0, 1, count=21), split="deal")
    with caplog.at_level(logging.WARNING, logger="mmloader"):
        list(_loader(mmloader.LiveStream(dealt, batch_size=8, steps=100), "thread"))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the source's one stream" in said and "give the stream enough samples" in said


def test_each_kind_of_stream_names_the_other_for_the_other_kind_of_data(lmdb_ds):
    """Stored data streams by epochs (Stream), live sources by steps (LiveStream); the loaders
    take either through one protocol, and neither constructor turns into the other."""
    from mmloader.loading.protocol import StreamLike

    live = mmloader.live(_numbered)
    for options in ({}, {"steps": 10}):  # steps= is a LiveStream's: still told of LiveStream
        with pytest.raises(TypeError, match=r"is live, streamed by steps: mmloader.LiveStream\(source"):
            mmloader.Stream(live, batch_size=4, **options)
    with pytest.raises(TypeError, match="a stored dataset streams with mmloader.Stream"):
        mmloader.LiveStream(mmloader.zip(txt=mmloader.TextReader(lmdb_ds)), batch_size=4)
    stored = mmloader.Stream(mmloader.zip(txt=mmloader.TextReader(lmdb_ds)), batch_size=4)
    live_stream = mmloader.LiveStream(live, batch_size=4, steps=2)
    assert type(stored) is mmloader.Stream and type(live_stream) is mmloader.LiveStream
    assert isinstance(stored, StreamLike) and isinstance(live_stream, StreamLike)
    assert (stored.restarts_each_pass, live_stream.restarts_each_pass) == (False, True)
    with pytest.raises(TypeError, match="needs an mmloader.Stream or LiveStream, got list"):
        mmloader.loader([1, 2, 3])
