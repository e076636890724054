"""Going on after the plan changed mid-epoch (``on_change="continue"``): pure arithmetic.

The samples a saved state had delivered are found in the old plan (rebuilt from the
identity the state records); the new plan's epoch is then visited without them. Samples
are compared as integer ids (source and row in that source's unselected dataset), so a
sample that moved to another position, or into another selection of the same dataset, is
still recognised.
"""

from __future__ import annotations

import numpy as np


def delivered_positions(plan_len: int, remaining: list) -> np.ndarray:
    """Positions of a plan of ``plan_len`` that are not in the ``remaining`` ranges of its epoch:
    what was delivered (by this run, and by every run before it in this epoch: a visit that
    already left out samples delivered earlier counts them as delivered too).

    >>> delivered_positions(10, [(2, 5), (7, 10)]).tolist()
    [0, 1, 5, 6]
    """
    left = np.zeros(int(plan_len), dtype=bool)
    for a, b in remaining:
        left[int(a) : int(b)] = True
    return np.flatnonzero(~left)


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


def carried_over(plan_ids: np.ndarray, delivered_ids: np.ndarray) -> np.ndarray:
    """The delivered samples :func:`kept_ranges` cannot take out of a plan (it holds them fewer
    times than they were delivered, or not at all), each as often as it is left over: what a
    later plan of the same epoch must still leave out.

    >>> carried_over(np.array([5, 6, 5]), np.array([5, 7, 7, 6])).tolist()
    [7, 7]
    """
    done, times = np.unique(np.asarray(delivered_ids, dtype=np.int64), return_counts=True)
    ids, held = np.unique(np.asarray(plan_ids, dtype=np.int64), return_counts=True)
    inside = np.zeros(len(done), dtype=np.int64)  # how often the plan holds each delivered sample
    if len(ids):
        where = np.minimum(np.searchsorted(ids, done), len(ids) - 1)
        inside = np.where(ids[where] == done, held[where], 0)
    return np.repeat(done, np.maximum(times - inside, 0))


def sample_ids(slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One integer per (source slot, row): the ids :func:`kept_ranges` compares."""
    return np.asarray(slots, dtype=np.int64) * (1 << 40) + np.asarray(rows, dtype=np.int64)


def whole_units(ranges: list[tuple[int, int]], plan_len: int, unit: int) -> list[tuple[int, int]]:
    """The ranges cut back to the runs of ``unit`` positions they hold whole (a plan of
    single-source batches keeps its batches single-source; a run partly delivered is left out).

    >>> whole_units([(0, 3), (5, 12)], 12, 4)
    [(8, 12)]
    """
    if unit <= 1:
        return ranges
    kept = np.zeros(int(plan_len), dtype=bool)
    for a, b in ranges:
        kept[a:b] = True
    units = kept[: len(kept) // unit * unit].reshape(-1, unit).all(axis=1)
    out: list[tuple[int, int]] = []
    for u in np.flatnonzero(units).tolist():
        if out and out[-1][1] == u * unit:
            out[-1] = (out[-1][0], (u + 1) * unit)
        else:
            out.append((u * unit, (u + 1) * unit))
    return out
