"""Dealing a global step's rows by cost (mmloader/planning/balance.py): a permutation that keeps
each rank's count, never worse than the plan's own split, and deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mmloader.planning.balance import deal_step, row_costs, step_imbalance


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("per", [1, 2, 3])
def test_a_deal_is_a_permutation_never_worse_than_the_plan_and_the_same_every_time(world, per):
    rng = np.random.default_rng(world * 10 + per)
    for _ in range(200):
        costs = rng.choice([1, 1, 1, 2, 5, 40, 400], size=world * per)
        dealt = deal_step(costs, world)
        assert sorted(dealt.tolist()) == list(range(world * per))  # every row once
        for r in range(world):  # each rank's rows in plan order
            mine = dealt[r * per : (r + 1) * per]
            assert (np.diff(mine) > 0).all()
        assert step_imbalance(costs[dealt], world) <= step_imbalance(costs, world) + 1e-12
        assert deal_step(costs, world).tolist() == dealt.tolist()


def test_the_deal_is_within_lpts_bound_of_the_best_one():
    """Against every split of small steps, exhaustively: the slowest rank is within 4/3 of the
    best possible slowest rank (LPT's classic bound; with equal counts a little looser here)."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        costs = rng.integers(1, 50, size=6)
        best = min(
            max(costs[list(a)].sum(), costs[[i for i in range(6) if i not in a]].sum())
            for a in itertools.combinations(range(6), 3)
        )
        dealt = costs[deal_step(costs, 2)]
        assert max(dealt[:3].sum(), dealt[3:].sum()) <= best * 4 / 3


def test_row_costs_and_errors():
    assert row_costs(np.array([2, 3, 4]), np.array([0, 1, 3]), "tokens").tolist() == [2, 7]
    assert row_costs(np.array([2, 3, 4]), np.array([0, 1, 3]), "attention").tolist() == [4, 25]
    with pytest.raises(ValueError, match="balance='flops': expected one of tokens, attention"):
        row_costs(np.array([1]), np.array([0, 1]), "flops")
    with pytest.raises(ValueError, match="cannot be dealt to 2 ranks evenly"):
        deal_step(np.array([1, 2, 3]), 2)
