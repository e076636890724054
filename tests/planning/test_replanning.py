"""Pure planning for plans that change: plan identities compared, the rest of an epoch after a
change (kept_ranges), unrepeated evaluation splits, and weight schedules — exhaustive, no file."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from mmloader.errors import PlanChangedError, ResumeError
from mmloader.planning import RangeList
from mmloader.planning.mixing import MixOrder
from mmloader.planning.partition import (
    rank_positions,
    remaining_ranges,
    samples_per_rank,
    unrepeated_positions,
    unrepeated_remaining,
    unrepeated_share,
)
from mmloader.planning.replan import delivered_positions, kept_ranges, whole_units
from mmloader.planning.resume import check_state, plan_changes, progress_state
from mmloader.planning.schedule import PhasedMixOrder, WeightSchedule, phase_quotas

SUBSET = {
    "base": "fb",
    "steps": [
        {"where": "a > 1", "keys": None, "fraction": None, "limit": None, "seed": 0},
        {"where": None, "keys": None, "fraction": None, "limit": 90, "seed": 0},
    ],
}
IDENTITY = {
    "sources": [{"name": "a", "size": 100, "fingerprint": "fa"}, {"name": "b", "size": 100, "fingerprint": "fb"}],
    "mix": {"names": ["a", "b"], "weights": [0.5, 0.5], "mode": "proportion", "epoch_size": 100, "quotas": [50, 50]},
    "batch_size": 10,
    "drop_last": False,
}


def _with(**changes):
    out = {**IDENTITY, **{k: v for k, v in changes.items() if k not in ("mix", "sources")}}
    if "mix" in changes:
        out["mix"] = {**IDENTITY["mix"], **changes["mix"]}
    if "sources" in changes:
        out["sources"] = changes["sources"]
    return out


@pytest.mark.parametrize(
    "current,expected",
    [
        (_with(mix={"weights": [0.8, 0.2], "quotas": [80, 20]}), ["mix weights: [0.5, 0.5] -> [0.8, 0.2]"]),
        (_with(mix={"quotas": [60, 40]}), ["mix quotas: [50, 50] -> [60, 40]"]),
        (_with(batch_size=8), ["batch_size: 10 -> 8"]),
        (
            _with(sources=[IDENTITY["sources"][0], {"name": "b", "size": 100, "fingerprint": "other"}]),
            ["source 'b': other samples, same count (100): another dataset or selection"],
        ),
        (_with(sources=[IDENTITY["sources"][0]]), ["source 'b' removed"]),
        (
            _with(sources=[*IDENTITY["sources"], {"name": "c", "size": 5, "fingerprint": "fc"}]),
            ["source 'c' added"],
        ),
        (
            _with(sources=[IDENTITY["sources"][0], {"name": "b", "size": 90, "fingerprint": "fb2", "subset": SUBSET}]),
            [
                "source 'b': selection none (all samples) -> (where 'a > 1', then limit 90)",
                "source 'b': 100 samples -> 90",
            ],
        ),
        (_with(sources=IDENTITY["sources"][::-1]), ["sources reordered: ['a', 'b'] -> ['b', 'a']"]),
        (dict(IDENTITY), []),
    ],
)
def test_plan_changes_names_what_changed(current, expected):
    assert plan_changes(IDENTITY, current) == expected


def _state(plan_len: int, consumed: int, batch_size: int, plan: dict | None = None) -> dict:
    """One rank's state ``consumed`` samples into epoch 0 of a plan of ``plan_len``."""
    return progress_state(
        seed=0,
        epoch=0,
        world=1,
        plan_len=plan_len,
        ranges=[[0, plan_len]],
        samples_per_rank=plan_len,
        consumed=consumed,
        batch_size=batch_size,
        drop_last=False,
        plan=plan,
    )


def test_a_state_of_another_plan_raises_listing_the_changes():
    state = _state(plan_len=100, consumed=50, batch_size=10, plan=IDENTITY)
    check_state(state, seed=0, plan=IDENTITY)  # the same plan passes
    with pytest.raises(PlanChangedError) as e:
        check_state(state, seed=0, plan=_with(batch_size=3))
    assert e.value.changes == ["batch_size: 10 -> 3"] and "on_change" in str(e.value)
    with pytest.raises(PlanChangedError, match="seed: 0 -> 1"):  # a plan change like any other
        check_state({**state, "plan": {**IDENTITY, "seed": 0}}, seed=1, plan={**IDENTITY, "seed": 1})
    with pytest.raises(ResumeError, match="seed"):  # a state without a plan identity
        check_state({**state, "plan": None}, seed=1, plan=IDENTITY)
    with pytest.raises(ResumeError, match="version"):
        check_state({**state, "version": 99}, seed=0, plan=IDENTITY)


def test_an_old_state_without_a_plan_is_resumed_with_a_warning():
    state = {**_state(plan_len=10, consumed=2, batch_size=2), "version": 1}
    state.pop("plan")
    with pytest.warns(UserWarning, match="records no plan identity"):
        check_state(state, seed=0, plan=IDENTITY)


# -- the rest of an epoch after a change ---------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_kept_ranges_takes_out_each_delivered_sample_as_often_as_delivered(seed):
    rng = np.random.default_rng(seed)
    plan = rng.integers(0, 12, size=rng.integers(0, 40))
    delivered = rng.integers(0, 15, size=rng.integers(0, 20))
    kept = np.concatenate([plan[a:b] for a, b in kept_ranges(plan, delivered)] or [np.empty(0, np.int64)])
    plan_c, done_c, kept_c = Counter(plan.tolist()), Counter(delivered.tolist()), Counter(kept.tolist())
    for sample, times in plan_c.items():
        assert kept_c[sample] == max(times - done_c[sample], 0)
    positions = [p for a, b in kept_ranges(plan, delivered) for p in range(a, b)]
    assert positions == sorted(positions)  # the new plan's order is kept
    dropped = sorted(set(range(len(plan))) - set(positions))
    for p in dropped:  # a sample is taken out at its first positions, not later ones
        assert all(plan[q] != plan[p] or q in dropped for q in range(p))


@pytest.mark.parametrize("total,world,batch", list(itertools.product((1, 7, 20, 33), (1, 2, 3, 4), (1, 4))))
def test_delivered_positions_are_what_the_ranks_delivered(total, world, batch):
    per = samples_per_rank(total, world, batch)
    for consumed in range(0, per + 1, batch):
        rest = remaining_ranges([(0, total)], world, per, consumed, keep_padding=False)
        got = set(delivered_positions(total, rest).tolist())
        seen = set()
        for rank in range(world):
            seen |= set(rank_positions(total, world, rank, per, 0, consumed).tolist())
        assert got == seen  # what the ranks delivered, padding repeats once each
        # a visit that had left samples out already (an earlier change): those count as delivered
        half = total // 2
        per2 = samples_per_rank(half, world, batch)
        rest2 = remaining_ranges([(0, half)], world, per2, min(consumed, per2), keep_padding=False)
        assert set(delivered_positions(total, rest2).tolist()) >= set(range(half, total))


@pytest.mark.parametrize("plan_len,unit", [(12, 4), (16, 4), (10, 1), (24, 8)])
def test_whole_units_keeps_only_runs_kept_whole(plan_len, unit):
    rng = np.random.default_rng(plan_len)
    for _ in range(20):
        kept = sorted(set(rng.integers(0, plan_len, plan_len).tolist()))
        out = whole_units([(p, p + 1) for p in kept], plan_len, unit)
        positions = {p for a, b in out for p in range(a, b)}
        assert positions <= set(kept)
        if unit > 1:
            for u in range(plan_len // unit):
                block = set(range(u * unit, (u + 1) * unit))
                assert (block <= positions) == (block <= set(kept))


# -- evaluation: no repeats ----------------------------------------------------------------


@pytest.mark.parametrize("total,world,batch", list(itertools.product(range(1, 30), range(1, 5), (None, 1, 2, 3, 4))))
def test_unrepeated_split_every_sample_once_equal_batches(total, world, batch):
    b = batch or 1
    seen, counts = [], set()
    for rank in range(world):
        start, share, rows = unrepeated_share(total, world, rank, batch)
        counts.add(-(-rows // b))
        positions, valid = unrepeated_positions(start, share, 0, rows)
        seen += positions[valid].tolist()
        assert (~valid).sum() <= 1  # at most one padding row, flagged
    assert len(counts) == 1  # the same number of batches on every rank: no DDP hang
    assert sorted(seen) == list(range(total))


@pytest.mark.parametrize("total,world,batch", list(itertools.product((5, 9, 16, 23), (1, 2, 3, 4), (1, 2, 4))))
def test_unrepeated_resume_at_every_step_onto_other_worlds(total, world, batch):
    rows = unrepeated_share(total, world, 0, batch)[2]
    for consumed in range(0, rows + 1, batch):
        before = []
        for rank in range(world):
            start, share, _ = unrepeated_share(total, world, rank, batch)
            p, v = unrepeated_positions(start, share, 0, consumed)
            before += p[v].tolist()
        rest = unrepeated_remaining([(0, total)], world, consumed)
        visit = RangeList(rest)
        for world2 in (1, 2, 3, 4):
            after = []
            for rank in range(world2):
                start, share, rows2 = unrepeated_share(len(visit), world2, rank, batch)
                p, v = unrepeated_positions(start, share, 0, rows2)
                after += visit.take(p[v]).tolist() if len(visit) else []
            assert sorted(before + after) == list(range(total))


# -- schedules -------------------------------------------------------------------------------


def test_schedule_weights_step_and_linear():
    step = WeightSchedule([(0, [1, 0]), (2, [0, 1])])
    assert step.weights_at(1.99).tolist() == [1, 0] and step.weights_at(2).tolist() == [0, 1]
    line = WeightSchedule([(0, [1, 0]), (2, [0, 1])], interpolate="linear")
    assert line.weights_at(0.5).tolist() == [0.75, 0.25] and line.weights_at(9).tolist() == [0, 1]
    assert WeightSchedule.from_dict(line.as_dict()).as_dict() == line.as_dict()
    for bad in ([(1, [1]), (0, [1])], [(0, [0, 0])], [(0, [-1, 1])], []):
        with pytest.raises(ValueError):
            WeightSchedule(bad)


@pytest.mark.parametrize("epoch_size,unit", [(100, 1), (97, 1), (120, 4)])
def test_phase_quotas_cover_the_epoch_and_follow_the_weights(epoch_size, unit):
    s = WeightSchedule([(0, [0.5, 0.5]), (0.9, [0.5, 0.5]), (1.0, [0.0, 1.0])], interpolate="linear")
    for epoch in (0, 1):
        q = phase_quotas(s, epoch, epoch_size, unit)
        assert q.sum() == epoch_size // unit * unit and (q % unit == 0).all()
    q = phase_quotas(s, 0, epoch_size, unit)
    starts = np.concatenate([[0], np.cumsum(q.sum(axis=1))])[:-1]
    ramp = q[starts >= 0.9 * epoch_size // unit * unit].sum(axis=0)
    assert ramp[1] > 2 * ramp[0]  # annealing into source 1 over the last tenth of epoch 0
    assert abs(q[starts < 0.9 * epoch_size].sum(axis=0)[0] - q[starts < 0.9 * epoch_size].sum() / 2) <= unit
    assert (phase_quotas(s, 1, epoch_size, unit)[:, 0] == 0).all()  # after the last point: its weights


def test_samples_schedule_anneals_the_last_tenth_of_a_one_epoch_run():
    s = WeightSchedule([(0, [0.9, 0.1]), (900, [0.9, 0.1]), (1000, [0.2, 0.8])], by="samples", interpolate="linear")
    q = phase_quotas(s, 0, 1000)
    lengths = q.sum(axis=1)
    first = q[: np.searchsorted(np.cumsum(lengths), 900, side="right")]
    assert abs(first[:, 1].sum() / first.sum() - 0.1) < 0.01  # 10% source 1 until sample 900
    assert q[-1, 1] / q[-1].sum() > 0.7  # then rising to 80%


@pytest.mark.parametrize(
    "sizes,seed,unit", [((100, 30), 0, 1), ((50, 50, 20), 1, 1), ((64, 64), 2, 8), ((7, 200), 3, 1)]
)
def test_phased_order_draws_each_source_once_per_epoch_while_it_fits(sizes, seed, unit):
    s = WeightSchedule(
        [(0, [1.0] + [0.0] * (len(sizes) - 1)), (0.5, [1.0] * len(sizes)), (1.5, [0.0] * (len(sizes) - 1) + [1.0])]
    )
    epoch_size = 96
    for epoch in range(3):
        q = phase_quotas(s, epoch, epoch_size, unit)
        order = PhasedMixOrder(list(sizes), q, unit=unit, seed=seed, epoch=epoch)
        assert len(order) == q.sum()
        src, idx = order.lookup(np.arange(len(order)))
        for j, size in enumerate(sizes):
            mine = idx[src == j]
            assert len(mine) == q[:, j].sum()
            assert (mine < size).all()
            if len(mine) <= size:
                assert len(set(mine.tolist())) == len(mine)  # no repeat while the quota fits
            else:
                assert set(mine.tolist()) == set(range(size))  # upsampled: every sample
        starts = np.concatenate([[0], np.cumsum(q.sum(axis=1))])
        for p in range(len(q)):  # each phase holds its own quotas
            counts = np.bincount(src[starts[p] : starts[p + 1]], minlength=len(sizes))
            assert counts.tolist() == q[p].tolist()
        if unit > 1:  # whole single-source units
            assert all(len(set(src[a : a + unit].tolist())) == 1 for a in range(0, len(src), unit))
        lookup_again = order.lookup(np.arange(len(order))[::-1])[1][::-1]
        assert lookup_again.tolist() == idx.tolist()  # any order of lookups, same answers


def test_a_phased_order_with_one_phase_is_the_fixed_mix():
    fixed = MixOrder([100, 30], np.array([60, 30]), seed=4, epoch=2)
    phased = PhasedMixOrder([100, 30], np.array([[60, 30]]), seed=4, epoch=2)
    a, b = fixed.lookup(np.arange(90)), phased.lookup(np.arange(90))
    assert sorted(zip(*map(np.ndarray.tolist, a))) == sorted(zip(*map(np.ndarray.tolist, b)))
