"""The data ledger (mmloader/loading/ledger.py): the keys of any step, by arithmetic, equal to
what the loader delivered, for every kind of stored stream over worlds 1-4, after a resume and
an elastic resume; and the steps that hold a key."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import rank_streams

import mmloader

N = 60


def _write(path, prefix, n, tokens=False):
    with mmloader.writer_for(path) as w:
        for i in range(n):
            sample = {"__key__": f"{prefix}{i:03d}", "txt": f"{prefix} {i}"}
            if tokens:
                buf = io.BytesIO()
                np.save(buf, np.arange(1 + (7 * i) % 19, dtype=np.int64))
                sample["ids.npy"] = buf.getvalue()
            w.write(sample)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger")
    return {
        "a": _write(root / "a.lmdb", "a", N, tokens=True),
        "b": _write(root / "b.lmdb", "b", 40, tokens=True),
        "root": root,
    }


def _text(path):
    return mmloader.zip(t=mmloader.TextReader(path))


def _length(i):
    return i % 9


KINDS = {
    "plain": lambda d: mmloader.Stream(_text(d["a"]), batch_size=4, seed=3),
    "masked": lambda d: mmloader.Stream(_text(d["a"]), batching=mmloader.Batching(7, padding="mask"), seed=3),
    "drop_last": lambda d: mmloader.Stream(_text(d["a"]), batch_size=7, seed=3, drop_last=True),
    "mixed": lambda d: mmloader.Stream(
        mmloader.mix([_text(d["a"]), _text(d["b"])], [2, 1], epoch_size=75, names=["a", "b"]), batch_size=5, seed=3
    ),
    "scheduled": lambda d: mmloader.Stream(
        mmloader.mix(
            [_text(d["a"]), _text(d["b"])],
            None,
            epoch_size=60,
            names=["a", "b"],
            schedule={"interpolate": "linear", "points": [{"at": 0, "weights": [1, 0]}, {"at": 2, "weights": [0, 1]}]},
        ),
        batch_size=4,
        seed=3,
    ),
    "filtered": lambda d: mmloader.Stream(
        mmloader.select(_text(d["a"]), keys=[f"a{i:03d}" for i in range(0, N, 3)]), batch_size=3, seed=3
    ),
    "bucketed": lambda d: mmloader.Stream(
        _text(d["a"]), batch_size=4, seed=3, lengths=mmloader.Bucketing(_length, window=4)
    ),
    "packed": lambda d: mmloader.Stream(
        mmloader.zip(ids=mmloader.ArrayReader(d["a"], "ids.npy")),
        batch_size=2,
        seed=3,
        lengths=mmloader.Packing(40, length_by="ids"),
    ),
    "packed_mix": lambda d: mmloader.Stream(  # a row's samples from both sources: __source__ per sample
        mmloader.mix([mmloader.zip(ids=mmloader.ArrayReader(d[n], "ids.npy")) for n in "ab"], [1, 1], names=["a", "b"]),
        batch_size=2,
        seed=3,
        lengths=mmloader.Packing(40, length_by="ids"),
    ),
}


def _delivered(stream, state=None, epoch=None, limit=None):
    loader = mmloader.loader(stream, num_workers=1, backend="thread")
    if state is not None:
        loader.load_state_dict(state)
    if epoch is not None:
        loader.set_epoch(epoch)
    out = []
    for batch in loader:
        out.append((batch["__key__"], batch.get("__source__")))
        if limit is not None and len(out) == limit:
            break
    return out, json.loads(json.dumps(loader.state_dict()))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_keys_of_every_step_are_those_delivered_on_worlds_1_to_4(data, kind):
    make = lambda: KINDS[kind](data)  # noqa: E731
    for world in (1, 2, 3, 4):
        for epoch in (0, 1):
            ranks = rank_streams(make, world)
            delivered = [_delivered(s, epoch=epoch)[0] for s in ranks]
            ledger = make()  # another stream, this rank's place unknown to it: asks for all ranks
            ledger.set_world(0, world)
            for step in range(len(delivered[0])):
                assert ledger.keys_at(step, epoch=epoch) == [d[step][0] for d in delivered], (world, epoch, step)
                sources = ledger.sources_at(step, rank=world - 1, epoch=epoch)
                if delivered[-1][step][1] is not None:
                    assert sources == delivered[-1][step][1]
            with pytest.raises(IndexError, match=f"step {len(delivered[0])} of epoch {epoch}"):
                ledger.keys_at(len(delivered[0]), rank=0, epoch=epoch)


@pytest.mark.parametrize("kind", ["plain", "mixed", "packed", "masked"])
@pytest.mark.parametrize(("saved", "resumed"), [(2, 2), (2, 1), (1, 3), (4, 2)])
def test_after_a_resume_onto_any_world_each_step_is_what_was_delivered(data, kind, saved, resumed):
    make = lambda: KINDS[kind](data)  # noqa: E731
    before = [_delivered(s, limit=1) for s in rank_streams(make, saved)]
    state = before[0][1]
    assert state["epoch"] == 0 and state["steps"] == 1  # mid-epoch
    after = [_delivered(s, state=state)[0] for s in rank_streams(make, resumed)]
    ledger = make()
    ledger.set_world(0, resumed)
    ledger.resume(state)
    assert ledger.keys_at(0) == [b[0][0][0] for b in before]  # delivered before the checkpoint, by the saved world
    for j in range(len(after[0])):  # the resumed pass continues the epoch's step count
        assert ledger.keys_at(1 + j) == [a[j][0] for a in after]


def test_steps_of_a_key_are_where_it_came(data):
    stream = KINDS["mixed"](data)
    stream.set_world(0, 3)
    found = {}
    for rank, s in enumerate(rank_streams(lambda: KINDS["mixed"](data), 3)):
        for step, (keys, _sources) in enumerate(_delivered(s)[0]):
            for key in keys:
                found.setdefault(key, []).append((rank, step))
    for key in ["a000", "a017", "b003", "b039"]:
        assert stream.steps_of(key) == sorted(found.get(key, [])), key
    assert stream.steps_of("no-such-key") == []
    packed = KINDS["packed"](data)
    rows = {
        k: (0, step)
        for step, (keys, _s) in enumerate(_delivered(KINDS["packed"](data))[0])
        for row in keys
        for k in row
    }
    assert all(packed.steps_of(k) == [rows[k]] for k in ["a000", "a031", "a059"])


def test_a_dataset_without_keys_and_a_step_before_the_resumed_state_are_said(data):
    stream = mmloader.Stream(list(range(10)), batch_size=2)
    with pytest.raises(TypeError, match="names none"):
        stream.keys_at(0)
    make = lambda: KINDS["plain"](data)  # noqa: E731
    _batches, first_state = _delivered(make(), limit=2)
    resumed = make()
    loader = mmloader.loader(resumed, num_workers=1, backend="thread")
    loader.load_state_dict(first_state)
    it = iter(loader)
    next(it), next(it)
    second_state = loader.state_dict()  # 4 steps in: 2 before the first resume, 2 after it
    del it
    again = make()
    again.resume(second_state)
    assert again.keys_at(3) and again.keys_at(2)  # taken in the pass the state was saved in
    with pytest.raises(ValueError, match="before the state this stream resumed from"):
        again.keys_at(1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    paths = []
    for name, n in (("x", 400), ("y", 200)):
        with mmloader.ShardWriter(root / name, shard_size=20) as w:
            for i in range(n):
                w.write({"__key__": f"{name}{i:04d}", "txt": f"{name} {i}"})
        paths.append(root / name)
    return paths


def test_plan_quality_tells_a_well_mixed_plan_from_badly_built_ones(shards):
    x, y = (_text(p) for p in shards)
    shuffled = mmloader.Stream(x, batch_size=8, order=mmloader.Order(seed=1, block_size=4, window_blocks=25))
    good = shuffled.quality()
    assert good.verdict() == "good: mixes as configured" and good.spread > 0.8 and good.runs < 2
    in_order = mmloader.Stream(x, batch_size=8, order=mmloader.Order(shuffle=False)).quality()
    assert in_order.spread < 0.1 and in_order.runs > 10, in_order  # each shard one clump, read in a row
    assert "a shard's samples clump together" in in_order.verdict() and "as often as by chance" in in_order.verdict()
    # blocks of 4 shuffled, nothing shuffled within them: a shard's blocks spread, neighbours alike
    blocks = mmloader.Stream(x, batch_size=8, order=mmloader.Order(seed=1, block_size=4, window_blocks=1))
    q = blocks.quality()
    assert q.spread > 0.5 and q.runs > 10 and q.verdict().startswith("poor: consecutive samples share a shard")
    mixed = mmloader.Stream(mmloader.mix([x, y], [3, 1], epoch_size=400), batch_size=8, seed=2).quality(
        window_batches=8
    )
    assert mixed.drift_p99 <= mixed.drift_limit and mixed.verdict() == "good: mixes as configured"
    sources_apart = mmloader.Stream(
        mmloader.mix([x, y], [3, 1], epoch_size=400, batch_composition="source"), batch_size=8, seed=2
    ).quality(window_batches=1)  # each batch one source: a one-batch window is all of one
    assert sources_apart.drift_max > 0.7 and "source shares stray" in sources_apart.verdict()  # 1 or 0 against ~0.75


@pytest.mark.parametrize("kind", ["plain", "mixed"])
@pytest.mark.parametrize(("saved", "resumed"), [(4, 1), (1, 2), (2, 3)])
def test_a_resumed_epoch_is_answered_as_delivered_after_the_loader_moved_on(data, kind, saved, resumed):
    """The next epoch drops the resume; the ledger keeps how the resumed epoch was delivered
    (it answered as if that epoch had run whole on the new world: wrong keys, or an IndexError)."""
    make = lambda: KINDS[kind](data)  # noqa: E731
    state = _delivered(rank_streams(make, saved)[0], limit=2)[1]
    stream = rank_streams(make, resumed)[0]
    loader = mmloader.loader(stream, num_workers=1, backend="thread")
    loader.load_state_dict(state)
    resumed_pass = [b["__key__"] for b in loader]
    next_epoch = [b["__key__"] for b in loader]  # epoch 1, whole
    assert loader.epoch == 1 and next_epoch
    for j, keys in enumerate(resumed_pass):
        assert stream.keys_at(2 + j, rank=0, epoch=0) == keys
    assert [stream.keys_at(j, rank=0, epoch=1) for j in range(len(next_epoch))] == next_epoch
    loader.set_epoch(0)  # epoch 0 again, from its start: no longer as it was resumed
    assert [b["__key__"] for b in loader] == [stream.keys_at(j, rank=0, epoch=0) for j in range(len(stream))]


def test_an_epoch_after_an_end_of_epoch_state_counts_its_steps_from_0(data):
    """A state taken after an epoch's last batch on 4 ranks, resumed on 1: the loader counts the
    saved epoch's steps on (for Lightning), the ledger still numbers the new epoch from 0."""
    make = lambda: KINDS["plain"](data)  # noqa: E731
    state = _delivered(rank_streams(make, 4)[0])[1]
    assert state["epoch"] == 1 and state.get("ended_after_steps")
    stream = rank_streams(make, 1)[0]
    delivered, _ = _delivered(stream, state=state)
    assert [stream.keys_at(j, rank=0, epoch=1) for j in range(len(delivered))] == [k for k, _s in delivered]


def test_a_world_that_drop_last_leaves_empty_is_said(data):
    stream = mmloader.Stream(_text(data["b"]), batch_size=7, seed=3, drop_last=True)
    stream.set_world(0, 8)
    with pytest.raises(IndexError, match="the epoch has no step on 8 rank"):
        stream.keys_at(0)
