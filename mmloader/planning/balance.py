"""Compute-balanced global steps: the rows of one step handed to the data-parallel ranks so that
their costs are as even as they can be, each rank keeping its number of rows.

A packed row of one 4,096-token document costs attention far more than a row of thirty short
captions with the same tokens, and every rank waits for the slowest. The rows of a global step
(``world`` ranks x ``per`` rows, as the plan splits them) are dealt again, longest-processing-time
first: the costliest row to the rank with the least cost so far (among those with room), ties to
the lower rank. It is a pure function of the costs, so every rank computes the same deal for
itself, and a step holds the same rows as before: which rows the first ``s`` steps delivered
does not change, so resume arithmetic (and every sample once per epoch) is untouched.

>>> costs = np.array([9, 9, 1, 1, 1, 1, 1, 1])         # both costly rows planned for rank 0
>>> step_imbalance(costs, world=2)
1.6666666666666667
>>> dealt = deal_step(costs, world=2); dealt.tolist()
[0, 2, 4, 6, 1, 3, 5, 7]
>>> step_imbalance(costs[dealt], world=2)
1.0
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

import numpy as np

from .partition import RangeList, rank_positions

#: What a row costs, from the token counts of the samples it holds.
COSTS = ("tokens", "attention")


def row_costs(lengths: np.ndarray, offsets: np.ndarray, cost: str) -> np.ndarray:
    """Each row's cost: its tokens, or (``"attention"``) the sum of its samples' squared lengths
    (attention within each sample of a packed row is quadratic in that sample's length).

    >>> row_costs(np.array([3, 1, 4]), np.array([0, 2, 3]), "attention").tolist()
    [10, 16]
    """
    if cost not in COSTS:
        raise ValueError(f"balance={cost!r}: expected one of {', '.join(COSTS)}")
    values = np.asarray(lengths, dtype=np.int64)
    if cost == "attention":
        values = values * values
    sums = np.concatenate([[0], np.cumsum(values)])
    return sums[np.asarray(offsets[1:])] - sums[np.asarray(offsets[:-1])]


def deal_step(costs: np.ndarray, world: int) -> np.ndarray:
    """The rows of one global step (``world * per`` costs, rank after rank as planned) reordered so
    that rows ``r * per : (r + 1) * per`` go to rank ``r``, balanced; each rank's rows keep their
    plan order.

    >>> deal_step(np.array([5, 5, 1, 1]), world=2).tolist()
    [0, 2, 1, 3]
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if world <= 1 or n == 0:
        return np.arange(n)
    if n % world:
        raise ValueError(f"a global step of {n} rows cannot be dealt to {world} ranks evenly")
    per = n // world
    heap = [(0.0, r) for r in range(world)]  # (cost so far, rank): ties to the lower rank
    taken: list[list[int]] = [[] for _ in range(world)]
    for row in np.argsort(-costs, kind="stable").tolist():  # costliest first, ties by position
        total, rank = heapq.heappop(heap)
        taken[rank].append(row)
        if len(taken[rank]) < per:
            heapq.heappush(heap, (total + costs[row], rank))
    return np.concatenate([np.sort(np.asarray(rows, dtype=np.int64)) for rows in taken])


def step_imbalance(costs: np.ndarray, world: int) -> float:
    """The slowest rank's cost over the mean rank's, for one global step dealt rank after rank
    (1.0: perfectly even; what the fastest ranks wait for).

    >>> step_imbalance(np.array([9, 9, 1, 1]), 2)
    1.8
    """
    per_rank = np.asarray(costs, dtype=np.float64).reshape(world, -1).sum(axis=1)
    mean = per_rank.mean()
    return float(per_rank.max() / mean) if mean else 1.0


def balanced_batches(
    spans: Iterable[tuple[int, int]], visit: RangeList, plan, rank: int, world: int, per_rank: int, cost: str
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """What :func:`~mmloader.planning.partition.planned_batches` gives, with the rows of each
    global step dealt by cost (``plan``: packed rows, with ``samples`` and ``lengths``).

    >>> from mmloader.planning.mixing import SingleOrder
    >>> from mmloader.planning.packing import PackedOrder
    >>> rows = PackedOrder(SingleOrder(12, shuffle=False), lambda s, i: np.where(i < 2, 8, 1), capacity=8, shuffle=False)
    >>> [len(rows.samples(np.array([r]))[0]) for r in range(len(rows))]     # two 8-token rows, then 1s
    [1, 1, 8, 2]
    >>> one_step = [(0, 2)]                                                  # 2 rows a rank: rank 0 planned both 8s
    >>> [p.tolist() for p, _s, _i in balanced_batches(one_step, RangeList([(0, 4)]), rows, 0, 2, 2, "attention")]
    [[0, 2]]
    """
    for a, b in spans:
        virtual = np.concatenate([rank_positions(len(visit), world, r, per_rank, a, b) for r in range(world)])
        positions = visit.take(virtual)
        _sources, _indices, members, offsets = plan.samples(positions)
        dealt = positions[deal_step(row_costs(plan.lengths[members], offsets, cost), world)]
        mine = dealt[rank * (b - a) : (rank + 1) * (b - a)]
        sources, indices = plan.lookup(mine)
        yield mine, sources, indices
