"""Packing(balance=...) (mmloader/loading/packing.py and planning/balance.py in a stream): each
global step's rows dealt to the ranks by cost, every sample still once per epoch on worlds 1-4,
the ledger and resumes exact, and the ranks' costs evened out, measured on what they received."""

from __future__ import annotations

import io
import json
from collections import Counter

import numpy as np
import pytest

import mmloader

N, CAPACITY = 160, 128


def _lengths() -> list[int]:
    rng = np.random.default_rng(7)  # long-tailed: a few long documents among many short captions
    return [int(rng.integers(70, 129)) if rng.random() < 0.15 else int(rng.integers(2, 9)) for _ in range(N)]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("balance") / "tokens.lmdb"
    with mmloader.writer_for(path) as w:
        for i, n in enumerate(_lengths()):
            buf = io.BytesIO()
            np.save(buf, np.full(n, i % 50 + 1, dtype=np.int64))
            w.write({"__key__": f"t{i:04d}", "ids.npy": buf.getvalue()})
    return path


def _stream(path, balance, rank=0, world=1):
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    s = mmloader.Stream(ds, batch_size=2, seed=4, lengths=mmloader.Packing(CAPACITY, length_by="ids", balance=balance))
    s.set_world(rank, world)
    return s


def _attention(batch) -> int:
    return int(sum(n * n for row in batch["seq_lens"].tolist() for n in row if n))


def _run(path, balance, world, state=None, limit=None):
    out = []
    for rank in range(world):
        loader = mmloader.loader(_stream(path, balance, rank, world), num_workers=1, backend="thread")
        if state is not None:
            loader.load_state_dict(state)
        got = []
        for batch in loader:
            got.append(batch)
            if limit is not None and len(got) == limit:
                break
        out.append((got, json.loads(json.dumps(loader.state_dict()))))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_balanced_rows_deliver_every_sample_once_with_the_ranks_costs_evened(tokens, world):
    runs = {b: _run(tokens, b, world) for b in (None, "attention")}
    for balance, ranks in runs.items():
        steps = {len(got) for got, _state in ranks}
        assert len(steps) == 1, balance  # equal batches per rank
        keys = Counter(k for got, _ in ranks for b in got for row in b["__key__"] for k in row)
        assert set(keys) == {f"t{i:04d}" for i in range(N)}, balance  # every sample (repeats only as padding)
        ledger = _stream(tokens, balance, 0, world)
        for step in range(len(ranks[0][0])):
            assert ledger.keys_at(step) == [got[step]["__key__"] for got, _ in ranks]
    if world > 1:  # the slowest rank over the mean, per step, measured on what each rank received
        ratio = {
            b: np.mean(
                [
                    max(costs) / np.mean(costs)
                    for costs in zip(*[[_attention(batch) for batch in got] for got, _ in runs[b]])
                    if np.mean(costs)
                ]
            )
            for b in runs
        }
        assert ratio["attention"] < ratio[None], ratio
        assert ratio["attention"] < 1.25, ratio
        # the same rows each step, only dealt otherwise
        for step in range(len(runs[None][0][0])):
            plain = sorted(tuple(r) for got, _ in runs[None] for r in got[step]["__key__"])
            dealt = sorted(tuple(r) for got, _ in runs["attention"] for r in got[step]["__key__"])
            assert plain == dealt, step


@pytest.mark.parametrize(("saved", "resumed"), [(2, 2), (3, 2), (2, 4)])
def test_a_balanced_epoch_resumed_onto_any_world_delivers_the_rest(tokens, saved, resumed):
    before = _run(tokens, "attention", saved, limit=1)
    state = before[0][1]
    after = _run(tokens, "attention", resumed, state=state)
    if saved == resumed:  # the very batches of an uninterrupted epoch
        whole = _run(tokens, "attention", saved)
        for (got, _), (all_of_it, _) in zip(after, whole):
            assert [b["__key__"] for b in got] == [b["__key__"] for b in all_of_it[1:]]
    counts = Counter(k for run in (before, after) for got, _ in run for b in got for row in b["__key__"] for k in row)
    assert set(counts) == {f"t{i:04d}" for i in range(N)}  # every sample; twice only as a last step's padding
    assert max(counts.values()) <= 2
    ledger = _stream(tokens, "attention", 0, resumed)
    ledger.resume(state)
    assert ledger.keys_at(0) == [got[0]["__key__"] for got, _ in before]
    assert ledger.keys_at(1) == [got[0]["__key__"] for got, _ in after]


def test_balance_is_part_of_the_plan_and_checked():
    with pytest.raises(ValueError, match="Packing\\(balance='flops'\\): expected one of tokens, attention"):
        mmloader.Packing(64, balance="flops")
