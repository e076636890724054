"""What each pass of a loader delivers (mmloader.loading.resumable): epochs that advance by themselves,
explicit set_epoch, a resume for one pass, a pass left early, on both backends, with persistent
workers and under GPUDecode (its CPU path); len() during a resumed pass; stats(); a Stream's
control private to each training process."""

from __future__ import annotations

import itertools
import time
import warnings

import pytest
import torch
import torch.multiprocessing as tmp
from conftest import jpeg_bytes

import mmloader

N, BATCH = 40, 4
PER_EPOCH = N // BATCH


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("epochs") / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(N):
            w.write({"__key__": f"k{i:03d}", "txt": f"t{i}", "jpg": jpeg_bytes(i, size=(16, 16))})
    return path


def _stream(path, images: bool = False):
    readers = {"caption": mmloader.TextReader(str(path))}
    if images:
        readers["image"] = mmloader.ImageReader(str(path), output="raw")
    return mmloader.Stream(
        mmloader.zip(**readers), batch_size=BATCH, order=mmloader.Order(seed=5, block_size=4, window_blocks=2)
    )


LOADERS = {
    "thread": lambda p: mmloader.loader(_stream(p), num_workers=2, backend="thread"),
    "process": lambda p: mmloader.loader(_stream(p), num_workers=2, backend="process", persistent_workers=False),
    "persistent": lambda p: mmloader.loader(_stream(p), num_workers=2, backend="process", persistent_workers=True),
    "gpudecode": lambda p: mmloader.GPUDecode(
        mmloader.loader(_stream(p, images=True), num_workers=2, backend="thread"), device="cpu"
    ),
}


def _pass(loader, limit: int | None = None) -> list[list[str]]:
    """One pass; with ``limit``, take that many batches the way Lightning does: never asking for more."""
    it = iter(loader)
    return [list(b["__key__"]) for b in (itertools.islice(it, limit) if limit is not None else it)]


def _flat(batches):
    return [k for b in batches for k in b]


@pytest.mark.process
@pytest.mark.parametrize("kind", LOADERS)
def test_a_loop_without_set_epoch_gets_a_new_complete_order_each_epoch(path, kind):
    loader = LOADERS[kind](path)
    reference = mmloader.loader(_stream(path), num_workers=0)
    epochs = [_pass(loader) for _ in range(3)]
    for e, batches in enumerate(epochs):
        assert sorted(_flat(batches)) == [f"k{i:03d}" for i in range(N)]
        reference.set_epoch(e)
        assert batches == _pass(reference), e  # the epoch's plan, as set_epoch(e) gives it
    assert len({tuple(_flat(b)) for b in epochs}) == 3
    assert loader.epoch == 2


@pytest.mark.process
@pytest.mark.parametrize("kind", LOADERS)
def test_a_pass_taking_exactly_len_batches_then_the_next_pass_is_the_next_epoch(path, kind):
    """Lightning stops at len(loader) and never sees StopIteration; the next epoch must be whole."""
    loader = LOADERS[kind](path)
    first = _pass(loader, limit=len(loader))
    second = _pass(loader, limit=len(loader))
    assert len(first) == len(second) == PER_EPOCH and first != second
    assert sorted(_flat(second)) == sorted(_flat(first))


@pytest.mark.process
@pytest.mark.parametrize("kind", LOADERS)
def test_a_pass_left_early_continues_at_the_next_unseen_batch(path, kind):
    loader = LOADERS[kind](path)
    full = _pass(LOADERS[kind](path))
    head = _pass(loader, limit=3)
    rest = _pass(loader)  # no set_epoch: the rest of epoch 0
    assert head + rest == full
    assert loader.epoch == 0 and loader.state_dict()["epoch"] == 1
    assert sorted(_flat(_pass(loader))) == sorted(_flat(full)) and loader.epoch == 1


@pytest.mark.process
@pytest.mark.parametrize("kind", LOADERS)
def test_set_epoch_wins_and_a_resume_applies_to_one_pass(path, kind):
    loader = LOADERS[kind](path)
    epoch0 = _pass(loader)
    loader.set_epoch(0)
    assert _pass(loader) == epoch0  # explicit: epoch 0 again, not 1
    loader.set_epoch(0)
    head = _pass(loader, limit=4)
    state = loader.state_dict()
    resumed = LOADERS[kind](path)
    resumed.load_state_dict(state)
    assert len(resumed) == PER_EPOCH  # the whole epoch's count, as frameworks expect
    rest = _pass(resumed, limit=len(resumed) - state["steps"])  # stopped at the count, as Lightning does
    assert head + rest == epoch0
    assert resumed.state_dict()["epoch"] == 1
    epoch1 = _pass(resumed)  # the next epoch, whole: not the resumed tail again
    assert len(epoch1) == PER_EPOCH and sorted(_flat(epoch1)) == sorted(_flat(epoch0)) and epoch1 != epoch0


def test_state_records_steps_across_resumes(path):
    loader = LOADERS["thread"](path)
    _pass(loader, limit=3)
    s1 = loader.state_dict()
    again = LOADERS["thread"](path)
    again.load_state_dict(s1)
    _pass(again, limit=2)
    s2 = again.state_dict()
    assert (s1["steps"], s2["steps"], s2["epoch"]) == (3, 5, 0)
    third = LOADERS["thread"](path)
    third.load_state_dict(s2)
    assert len(third) == PER_EPOCH and len(_pass(third)) == PER_EPOCH - 5


def test_stats_measure_wait_and_compute(path):
    loader = LOADERS["thread"](path)
    for _ in loader:
        time.sleep(0.01)
    s = loader.stats(reset=True)
    assert s["batches"] == PER_EPOCH and s["samples"] == N
    assert s["compute_s"] >= 0.01 * (PER_EPOCH - 1) and s["compute_ms_per_batch"] >= 10
    assert 0 <= s["wait_fraction"] < 1 and s["first_batch_wait_s"] > 0
    assert loader.stats()["batches"] == 0


def _slow_caption(text: str) -> str:
    time.sleep(0.002)  # 2 ms of "decoding" per sample
    return text


def _slow_collate(rows: list) -> list:
    time.sleep(0.02)
    return rows


@pytest.mark.parametrize("backend", ["thread", pytest.param("process", marks=pytest.mark.process)])
def test_stats_say_where_building_a_batch_goes(path, backend):
    """Read, decode (with transforms) and collate, per batch, measured where the batches are
    built: threads of this process, or DataLoader workers (shared counters)."""
    ds = mmloader.zip(caption=mmloader.TextReader(str(path)), transforms={"caption": _slow_caption})
    stream = mmloader.Stream(ds, batching=mmloader.Batching(BATCH, collate_fn=_slow_collate), seed=1)
    kw = {"multiprocessing_context": "fork"} if backend == "process" else {}
    loader = mmloader.loader(stream, 2, backend=backend, **kw)
    assert len(list(loader)) == PER_EPOCH
    s = loader.stats(reset=True)
    assert s["collate_ms_per_batch"] >= 20 and s["decode_ms_per_batch"] >= 2 * BATCH
    assert s["decode_ms_per_batch"] < s["collate_ms_per_batch"]  # (each stage its own)
    assert 0 <= s["read_ms_per_batch"] < 20 and 0 <= s["ready_fraction"] <= 1
    assert "collate_ms_per_batch" not in loader.stats()  # counted afresh after the reset: none built since
    again = list(loader)  # a second pass counts only its own batches
    assert len(again) == PER_EPOCH and 20 <= loader.stats()["collate_ms_per_batch"] < 200


def test_group_needs_an_initialised_process_group(path):
    stream = mmloader.Stream(mmloader.zip(caption=mmloader.TextReader(str(path))), batch_size=4, group=object())
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        len(stream)


def _child(stream, queue) -> None:
    import os

    os.environ.update(RANK="1", WORLD_SIZE="2")
    stream.set_epoch(7)
    queue.put((stream.where(), stream.epoch))


@pytest.mark.process
def test_a_stream_sent_to_another_training_process_gets_its_own_control(path):
    """Lightning's ddp_spawn pickles the module (and its Stream) into each rank: the shared
    control must not make every rank take the first one's place, or its epoch."""
    stream = _stream(path)
    stream.set_world(0, 2)
    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(stream, queue))
    child.start()
    where, epoch = queue.get(timeout=120)
    child.join(60)
    assert where == (1, 2) and epoch == 7
    assert stream.where() == (0, 2) and stream.epoch == 0


def test_frameworks_find_set_epoch_on_the_sampler(path):
    loader = LOADERS["process"](path)
    loader.sampler.set_epoch(3)
    assert loader.epoch == 3 and not isinstance(loader, torch.utils.data.DataLoader)
    assert loader.num_workers == 2  # the DataLoader's settings read through
    with pytest.raises(AttributeError):
        loader.dataset  # noqa: B018 (a framework must not take it for a DataLoader to rebuild)


@pytest.mark.process
@pytest.mark.parametrize("kind", ["thread", "process", "persistent"])
def test_set_epoch_after_iter_applies_to_that_pass_as_lightning_calls_it(path, kind):
    """Lightning makes the iterator first, then sets the epoch (also right after a resume)."""
    reference = mmloader.loader(_stream(path), num_workers=0)
    reference.set_epoch(1)
    epoch1 = _pass(reference)
    loader = LOADERS[kind](path)
    iter(loader)  # an iterator never used is no pass (Lightning makes one at start-up)
    _pass(loader, limit=6)
    state = loader.state_dict()
    resumed = LOADERS[kind](path)
    resumed.load_state_dict(state)
    it = iter(resumed)
    with pytest.warns(UserWarning, match="drops the pending resume of epoch 0"):
        resumed.sampler.set_epoch(1)  # epoch 0 ended early (limit_train_batches): epoch 1 now
    assert [list(b["__key__"]) for b in it] == epoch1
    fresh = LOADERS[kind](path)
    it = iter(fresh)
    fresh.sampler.set_epoch(1)
    assert [list(b["__key__"]) for b in it] == epoch1


@pytest.mark.process
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_set_epoch_during_a_pass_applies_to_the_next_one(path, kind):
    loader = LOADERS[kind](path)
    full = _pass(LOADERS[kind](path))
    it = iter(loader)
    head = [list(next(it)["__key__"]) for _ in range(3)]
    loader.set_epoch(1)
    assert loader.epoch == 0 and loader.state_dict()["steps"] == 3  # still this pass's position
    rest = [list(b["__key__"]) for b in it]
    assert head + rest == full
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)  # the epoch set, from its start
    resumed = LOADERS[kind](path)
    resumed.load_state_dict(state)
    assert len(_pass(resumed)) == PER_EPOCH
    assert _pass(loader) == _pass(_one_epoch(path, 1))


def _one_epoch(path, epoch):
    loader = mmloader.loader(_stream(path), num_workers=0)
    loader.set_epoch(epoch)
    return loader


def test_stats_count_a_short_last_batch_as_it_is(tmp_path):
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(42):
            w.write({"__key__": f"k{i:03d}", "txt": f"t{i}"})
    loader = mmloader.loader(_stream(path), num_workers=1, backend="thread")
    list(loader)
    assert loader.stats()["samples"] == 42 and loader.stats()["batches"] == 11


@pytest.mark.process
@pytest.mark.parametrize("kind", LOADERS)
def test_set_epoch_reaches_the_next_pass_while_an_old_iterator_is_still_referenced(path, kind):
    loader = LOADERS[kind](path)
    old = iter(loader)
    next(old), next(old)
    loader.set_epoch(1)
    assert _pass(loader) == _pass(_one_epoch(path, 1)) and loader.epoch == 1
    del old


@pytest.mark.process
@pytest.mark.parametrize("kind", ["thread", "process", "persistent"])
def test_two_passes_of_one_loader_at_once_is_a_clear_error(path, kind):
    loader = LOADERS[kind](path)
    with pytest.raises(RuntimeError, match="superseded by a newer one"):
        for _a, _b in zip(loader, loader):
            pass
    assert len(_pass(loader)) == PER_EPOCH - 2  # each pass delivered one batch; the next goes on after them


@pytest.mark.process
@pytest.mark.parametrize("kind", ["thread", "process", "persistent"])
def test_load_state_dict_during_a_pass_applies_when_it_ends(path, kind):
    loader = LOADERS[kind](path)
    full = _pass(LOADERS[kind](path))
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    next(it), next(it)
    loader.load_state_dict(saved)
    assert loader.state_dict()["steps"] == 3  # this pass still delivers its own plan
    assert [list(b["__key__"]) for b in it] == full[3:]
    assert _pass(loader) == full[1:]  # then the loaded state: after batch 1
    with pytest.raises(mmloader.errors.ResumeError):  # a state that cannot fit fails at once
        it = iter(loader)
        next(it)
        loader.load_state_dict({**saved, "plan_len": 7})


def test_states_follow_a_set_epoch_made_during_a_pass(path):
    gpu = LOADERS["gpudecode"](path)
    it = iter(gpu)
    next(it), next(it)
    gpu.set_epoch(1)
    assert (gpu.state_dict()["epoch"], gpu.state_dict()["steps"]) == (0, 2)  # what the caller received
    del it
    assert gpu.state_dict()["epoch"] == 1 and gpu.state_dict()["consumed"] == 0  # the pass ended: epoch 1
    loader = LOADERS["thread"](path)
    it = iter(loader)
    next(it)
    loader.set_epoch(1)
    del it  # a break
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    resumed = LOADERS["thread"](path)
    resumed.load_state_dict(state)
    assert _pass(resumed) == _pass(loader) == _pass(_one_epoch(path, 1))


@pytest.mark.process
def test_a_finished_pass_leaves_no_queue_feeder_thread_for_the_next_fork(path):
    """A fork while a multiprocessing feeder thread ends can hang the child on CPython 3.11 (a
    2-rank DDP test hung 1 run in N with loaders made one after another): a pass that ended has
    joined its index queues' feeders."""
    import threading

    for _ in range(3):
        loader = mmloader.loader(
            _stream(path), num_workers=2, backend="process", persistent_workers=False, multiprocessing_context="fork"
        )
        assert len(_pass(loader)) == PER_EPOCH
        assert not [t.name for t in threading.enumerate() if t.name.startswith("QueueFeederThread")]


@pytest.fixture(scope="module")
def path48(tmp_path_factory):
    """48 samples: whole batches of 4 on 1, 2, 3 and 4 ranks."""
    path = tmp_path_factory.mktemp("epochs48") / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(48):
            w.write({"__key__": f"k{i:03d}", "txt": f"t{i}"})
    return path


@pytest.mark.parametrize("saved, resumed", [(2, 1), (1, 2), (2, 3), (3, 2), (2, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("step", [1, 2])
def test_len_after_a_resume_lets_a_framework_train_every_epoch(path48, saved, resumed, step):
    """A framework that reads len() once as the epoch's length and counts the steps taken before
    the state was saved (Lightning): the resumed epoch delivers every unseen sample, and each
    later epoch all 48 exactly once, on any change of world size."""
    trained: dict[int, list[str]] = {}
    states = []
    for rank in range(saved):
        stream = _stream(path48)
        stream.set_world(rank, saved)
        loader = mmloader.loader(stream, num_workers=0)
        trained.setdefault(0, []).extend(_flat(_pass(loader, limit=step)))
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)  # the ranks step together: one state serves all
    fresh = {}
    for rank in range(resumed):
        stream = _stream(path48)
        stream.set_world(rank, resumed)
        loader = mmloader.loader(stream, num_workers=0)
        fresh[rank] = len(loader)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            loader.load_state_dict(states[0])
        length = len(loader)  # read once per fit, after the state was loaded
        assert length >= fresh[rank]
        # the length read before the load is too short exactly when the resumed epoch needs more
        assert bool([w for w in said if "ends the epoch" in str(w.message)]) == (length > fresh[rank])
        trained[0].extend(_flat(_pass(loader, limit=length - step)))  # the framework counts from `step`
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            batches = _pass(loader, limit=length)
            assert len(batches) == fresh[rank], (epoch, rank)
            trained.setdefault(epoch, []).extend(_flat(batches))
    everything = [f"k{i:03d}" for i in range(48)]
    assert set(trained[0]) == set(everything)  # the resumed epoch: nothing left out
    assert sorted(trained[1]) == sorted(trained[2]) == everything  # later epochs: each sample once


@pytest.mark.parametrize("saved, resumed", [(2, 1), (4, 1), (3, 2), (1, 2), (2, 2)])
def test_a_state_taken_at_an_epochs_end_resumes_whole_in_a_framework_that_keeps_counting(path48, saved, resumed):
    """Saved after epoch 0's last batch: Lightning restores its step counter (epoch 0's steps in the
    saved world) and starts again at 0 only when that reaches the new length; either way the next
    epoch is delivered whole, and the one after it too."""
    state = None
    for rank in range(saved):
        stream = _stream(path48)
        stream.set_world(rank, saved)
        loader = mmloader.loader(stream, num_workers=0)
        _pass(loader)
        state = loader.state_dict()
    assert state is not None and state["epoch"] == 1
    counted = 48 // (4 * saved)  # the framework's steps of epoch 0
    trained: dict[int, list[str]] = {1: [], 2: []}
    for rank in range(resumed):
        stream = _stream(path48)
        stream.set_world(rank, resumed)
        loader = mmloader.loader(stream, num_workers=0)
        loader.load_state_dict(state)
        length = len(loader)
        start = counted if counted < length else 0  # Lightning's restart: reset only at the length
        trained[1].extend(_flat(_pass(loader, limit=length - start)))
        loader.set_epoch(2)
        trained[2].extend(_flat(_pass(loader, limit=length)))
    everything = [f"k{i:03d}" for i in range(48)]
    assert sorted(trained[1]) == sorted(trained[2]) == everything


def test_set_epoch_of_the_epoch_a_state_finished_delivers_nothing(path48):
    """A framework that asks again for the epoch the state was taken at the end of (its counters
    say it is not over) gets an empty pass, not that epoch a second time; then the next epoch."""
    loader = mmloader.loader(_stream(path48), num_workers=0)
    whole = _pass(loader)
    state = loader.state_dict()
    resumed = mmloader.loader(_stream(path48), num_workers=0)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 'drops the pending resume' warning: nothing is dropped
        resumed.set_epoch(0)
    assert _pass(resumed) == []
    nxt = _pass(resumed)
    assert resumed.epoch == 1 and sorted(_flat(nxt)) == sorted(_flat(whole)) and nxt != whole
