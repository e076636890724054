"""Token-budget packing: which whole samples share each row of at most ``capacity`` tokens.

The plan's positions are cut into windows of ``window`` positions (in plan order, so
after the epoch's shuffle). Inside a window, samples are placed best-fit decreasing:
longest first, each into the open row whose room left is the smallest that still holds
it, a new row when none does. Samples of one length are placed as a block (the rows with
the least room that holds them, each filled with as many as fit: the rows that placing them
one at a time gives), so a window costs about one step per distinct length, not one per
sample: a 10 M-sample epoch packs in seconds.
The rows of a window are then shuffled (seeded from seed, epoch and window), and the
samples of a row keep their plan order.

The result is a pure function of (lengths, capacity, window, seed, epoch): the rows
are decided before the rank split, so the split, padding and resume arithmetic of
:mod:`mmloader.planning.partition` apply to rows exactly as they do to samples.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Callable

import numpy as np

from .order import epoch_rng

#: Samples packed together (best-fit within this many plan positions). Larger fills rows
#: better at the end of each window; rows then mix samples from further apart in the plan.
PACK_WINDOW = 65536


class OverBudgetError(ValueError):
    """A sample's token count is outside ``0..capacity``: ``position`` (its plan position),
    ``tokens``, ``capacity`` and ``count`` (how many samples are)."""

    def __init__(self, position: int, tokens: int, capacity: int, count: int):
        super().__init__(f"plan position {position} has {tokens} tokens, outside 0..{capacity}")
        self.position, self.tokens, self.capacity, self.count = position, tokens, capacity, count


def _stable_argsort(keys: np.ndarray, largest: int) -> np.ndarray:
    """A stable argsort of non-negative ``keys`` up to ``largest``: numpy sorts 16-bit keys by
    radix, in O(n), several times faster than its merge sort of wider ones."""
    if largest < 1 << 16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def best_fit_rows(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """The row of each item when items of ``lengths`` are packed best-fit decreasing.

    Args:
        lengths: token counts, each in ``[0, capacity]``.
        capacity: tokens a row holds.

    Returns:
        ``(row of each item, number of rows)``; rows are numbered in the order they open.

    >>> rows, n = best_fit_rows(np.array([3, 5, 2, 4]), 7); rows.tolist(), n
    ([1, 0, 0, 1], 2)
    """
    n = len(lengths)
    row_of = np.empty(n, dtype=np.int64)
    if n == 0:
        return row_of, 0
    order = _stable_argsort(
        capacity - np.asarray(lengths, dtype=np.int64), capacity
    )  # longest first; ties in plan order
    ordered = lengths[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    stops = np.r_[starts[1:], n]
    # bins[c]: the rows with exactly c tokens of room; ``rooms``: the c of every bin not empty, in
    # order, so the smallest room >= s is one bisection away. Which rows take the items, in
    # longest-first order, is collected as plain lists of (row, how many): no numpy call per step.
    bins: dict[int, list[int]] = {}
    rooms: list[int] = []
    rows = 0
    taking: list[int] = []  # rows, in the order they take items
    times: list[int] = []  # how many consecutive items each of them takes

    for a, b, s in zip(starts.tolist(), stops.tolist(), ordered[starts].tolist()):
        while a < b:
            i = bisect_left(rooms, s)
            if i < len(rooms):
                # The best fit: the rows with the least room that still holds s. Each takes as
                # many of these as fit before the next row is used (what placing them one by one
                # does: a row that took one is then the best fit for the next, if it still fits).
                room = rooms[i]
                pool = bins[room]
                per_row = room // s if s else b - a
                m = min(b - a, len(pool) * per_row)
                k = -(-m // per_row)
                taken = pool[len(pool) - k :][::-1]
                del pool[len(pool) - k :]
                if not pool:
                    del rooms[i]
                last = m - (k - 1) * per_row
                base = room
            else:  # no open row holds s: new rows, each filled with as many of these as fit
                m = b - a
                per_row = capacity // s if s else m
                k = -(-m // per_row)
                taken = list(range(rows, rows + k))
                rows += k
                last = m - (k - 1) * per_row
                base = capacity
            taking += taken
            times += [per_row] * (k - 1)
            times.append(last)
            for room_left, ids in ((base - per_row * s, taken[:-1]), (base - last * s, taken[-1:])):
                if not ids:
                    continue
                into = bins.get(room_left)
                if into is None:
                    bins[room_left] = into = []
                if not into:
                    insort(rooms, room_left)
                into.extend(ids)
            a += m
    row_of[order] = np.repeat(np.asarray(taking, dtype=np.int64), np.asarray(times, dtype=np.int64))
    return row_of, rows


def pack_rows(
    lengths: np.ndarray,
    capacity: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    window: int = PACK_WINDOW,
    shuffle: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of whole samples, each holding at most ``capacity`` tokens.

    Args:
        lengths: the token count of each plan position, in plan order (each ``<= capacity``).
        capacity: tokens per row.
        seed: the stream's seed.
        epoch: the epoch (rows are shuffled within each window from seed, epoch, window).
        window: plan positions packed together.
        shuffle: shuffle the rows of each window; False keeps them in the order of their first
            sample (the same rows in the same order every epoch).

    Returns:
        ``(members, offsets)``: row ``r`` holds plan positions ``members[offsets[r]:offsets[r+1]]``,
        in plan order; every position is in exactly one row.

    >>> members, offsets = pack_rows(np.array([3, 5, 2, 4]), 7, seed=0)
    >>> sorted(members.tolist()), len(offsets) - 1
    ([0, 1, 2, 3], 2)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if capacity < 1:
        raise ValueError(f"capacity={capacity!r}: expected a token count >= 1")
    if window < 1:
        raise ValueError(f"window={window!r}: expected >= 1")
    bad = np.flatnonzero((lengths < 0) | (lengths > capacity))
    if len(bad):
        raise OverBudgetError(int(bad[0]), int(lengths[bad[0]]), capacity, len(bad))
    members, row_sizes = [], []
    for w, a in enumerate(range(0, len(lengths), window)):
        part = lengths[a : a + window]
        row_of, rows = best_fit_rows(part, capacity)
        if shuffle:
            shuffled = epoch_rng(seed, epoch, 0x7061636B, w).permutation(rows)[row_of]  # a row's new place
        else:  # in the order of each row's first sample
            first = np.full(rows, len(part), dtype=np.int64)
            np.minimum.at(first, row_of, np.arange(len(part)))
            shuffled = np.argsort(np.argsort(first, kind="stable"), kind="stable")[row_of]
        by_row = _stable_argsort(shuffled, rows)  # stable: a row's samples stay in plan order
        members.append(by_row + a)
        row_sizes.append(np.bincount(shuffled, minlength=rows))
    if not members:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    sizes = np.concatenate(row_sizes)
    return np.concatenate(members), np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class PackedOrder:
    """A plan of rows: position ``r`` is a row of whole samples of ``plan`` (``len`` is the rows).

    Args:
        plan: the sample plan (``len``, ``lookup``, ``unit == 1``).
        lengths: ``(sources, indices) -> token counts`` of plan samples.
        capacity: tokens per row.
        seed: the stream's seed.
        epoch: the epoch.
        window: plan positions packed together.
        shuffle: shuffle the rows (see :func:`pack_rows`).

    >>> from mmloader.planning.mixing import SingleOrder
    >>> rows = PackedOrder(SingleOrder(10, seed=0), lambda s, i: i % 4 + 1, capacity=6)
    >>> sorted(rows.samples(np.arange(len(rows)))[1].tolist()) == list(range(10))  # every sample once
    True
    """

    unit = 1

    def __init__(
        self,
        plan,
        lengths: Callable[[np.ndarray, np.ndarray], np.ndarray],
        capacity: int,
        seed: int = 0,
        epoch: int = 0,
        window: int = PACK_WINDOW,
        shuffle: bool = True,
    ):
        if plan.unit != 1:
            raise ValueError("packing needs a plan of single samples (not batch_composition='source')")
        self.plan, self.capacity = plan, int(capacity)
        positions = np.arange(len(plan), dtype=np.int64)
        self.sources, self.indices = plan.lookup(positions)
        self.lengths = np.asarray(lengths(self.sources, self.indices), dtype=np.int64)
        self.members, self.offsets = pack_rows(
            self.lengths, self.capacity, seed=seed, epoch=epoch, window=window, shuffle=shuffle
        )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def samples(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(sources, indices, plan positions, offsets)`` of the samples of ``rows``, row after
        row: row ``j`` of ``rows`` is samples ``offsets[j]:offsets[j+1]``."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, stops = self.offsets[rows], self.offsets[rows + 1]
        counts = stops - starts
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
        members = self.members[np.repeat(starts, counts) + within]
        return self.sources[members], self.indices[members], members, offsets

    def lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first sample of each row (what names a row in messages)."""
        first = self.members[self.offsets[np.asarray(rows, dtype=np.int64)]]
        return self.sources[first], self.indices[first]

    def utilisation(self) -> float:
        """Tokens the rows hold over rows x capacity."""
        return float(self.lengths.sum()) / max(len(self) * self.capacity, 1)
