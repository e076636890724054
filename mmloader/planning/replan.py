"""Going on after the plan changed mid-epoch (``on_change="continue"``): pure arithmetic.

The samples a saved state had delivered are found in the old plan (rebuilt from the
identity the state records); the new plan's epoch is then visited without them. Samples
are compared as integer ids (source and row in that source's unselected dataset), so a
sample that moved to another position, or into another selection of the same dataset, is
still recognised.
"""

from __future__ import annotations

import numpy as np

from .partition import RangeList, rank_positions


def delivered_positions(ranges: list, world: int, per_rank: int, consumed: int) -> np.ndarray:
    """Plan positions the ranks had delivered after each consumed ``consumed`` of its ``per_rank``
    samples of the visit ``ranges`` (padding repeats included: those samples were delivered too).

    >>> delivered_positions([[0, 10]], world=2, per_rank=5, consumed=2).tolist()
    [0, 1, 5, 6]
    """
    visit = RangeList(ranges)
    consumed = min(max(int(consumed), 0), int(per_rank))
    parts = [rank_positions(len(visit), world, r, per_rank, 0, consumed) for r in range(world)]
    flat = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return visit.take(flat) if len(visit) else flat


def kept_ranges(plan_ids: np.ndarray, delivered_ids: np.ndarray) -> list[tuple[int, int]]:
    """Ranges of plan positions left once the delivered samples are taken out.

    ``plan_ids[p]``: the sample at position ``p`` of the new plan. A sample delivered ``k``
    times is taken out at its first ``k`` positions (an upsampled source keeps its further
    repeats); samples the new plan does not hold are ignored.

    >>> kept_ranges(np.array([5, 6, 7, 5, 8]), np.array([5, 7]))
    [(1, 2), (3, 5)]
    """
    ids = np.asarray(plan_ids, dtype=np.int64)
    done, times = np.unique(np.asarray(delivered_ids, dtype=np.int64), return_counts=True)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    # occurrence number of each position's sample among the plan's positions of that sample, in plan order
    starts = np.searchsorted(sorted_ids, sorted_ids, side="left")
    occurrence = np.empty_like(ids)
    occurrence[order] = np.arange(len(ids)) - starts
    taken_out = np.zeros(len(ids), np.int64)  # how many of each position's sample were delivered
    if len(done):
        where = np.minimum(np.searchsorted(done, ids), len(done) - 1)
        taken_out = np.where(done[where] == ids, times[where], 0)
    keep = np.flatnonzero(occurrence >= taken_out)
    if not len(keep):
        return []
    cuts = np.flatnonzero(np.diff(keep) != 1) + 1
    runs = np.split(keep, cuts)
    return [(int(r[0]), int(r[-1]) + 1) for r in runs]


def sample_ids(slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One integer per (source slot, row): the ids :func:`kept_ranges` compares."""
    return np.asarray(slots, dtype=np.int64) * (1 << 40) + np.asarray(rows, dtype=np.int64)
