"""Splitting an epoch across ranks and DataLoader workers, at sample granularity.

Terms: the *plan* is the epoch's sequence of positions; a *visit* is the part of
the plan this pass covers (all of it, or what a resumed run has not yet seen),
written as a list of ``(start, stop)`` ranges of plan positions (a
:class:`RangeList`). Rank ``r`` gets the contiguous virtual positions
``[r * per_rank, (r + 1) * per_rank)`` of the visit; positions past its end are
padding that wraps to its start, so every rank gets the same count. Within a
rank, batch ``j`` goes to worker ``j % workers``: the DataLoader collects
batches round-robin, so a rank delivers its batches in plan order whatever the
worker count, which makes mid-epoch resume pure arithmetic.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Sequence

import numpy as np


class RangeList:
    """Virtual positions ``0..len-1`` laid over a list of ``(start, stop)`` ranges.

    >>> RangeList([(10, 12), (20, 23)]).take(np.arange(5)).tolist()
    [10, 11, 20, 21, 22]
    """

    def __init__(self, ranges: Iterable[Sequence[int]]):
        rs = [(int(a), int(b)) for a, b in ranges if int(b) > int(a)]
        self.ranges = np.array(rs, dtype=np.int64).reshape(-1, 2)
        lengths = self.ranges[:, 1] - self.ranges[:, 0]
        self.cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.cum[-1])

    def take(self, virtual: np.ndarray) -> np.ndarray:
        v = np.asarray(virtual, dtype=np.int64)
        i = np.searchsorted(self.cum, v, side="right") - 1
        return self.ranges[i, 0] + (v - self.cum[i])

    def sub(self, a: int, b: int) -> list[tuple[int, int]]:
        """The underlying ranges that virtual ``[a, b)`` covers."""
        out: list[tuple[int, int]] = []
        if b <= a:
            return out
        i = int(np.searchsorted(self.cum, a, side="right") - 1)
        while a < b and i < len(self.ranges):
            start = int(self.ranges[i, 0] + a - self.cum[i])
            take = min(b, int(self.cum[i + 1])) - a
            out.append((start, start + take))
            a += take
            i += 1
        return out

    def as_list(self) -> list[list[int]]:
        return self.ranges.tolist()


def samples_per_rank(total: int, world: int, batch_size: int | None = None, drop_last: bool = False) -> int:
    """Samples each rank yields: equal on every rank, always.

    Padding (default) rounds up; ``drop_last`` rounds down, to whole batches when batching.

    >>> samples_per_rank(10, 4), samples_per_rank(10, 4, drop_last=True)
    (3, 2)
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if drop_last:
        per = total // world
        if batch_size:
            per = per // batch_size * batch_size
        return per
    return -(-total // world)


def rank_positions(
    visit_len: int, world: int, rank: int, per_rank: int, start: int = 0, stop: int | None = None
) -> np.ndarray:
    """Virtual visit positions of ``rank`` (offsets ``start:stop`` of its ``per_rank``);
    padding wraps to the start of the visit. Only the slice asked for is built, so a
    worker never holds a per-sample array of the whole rank.

    >>> rank_positions(10, 4, 3, 3).tolist(), rank_positions(10, 4, 3, 3, 1, 3).tolist()
    ([9, 0, 1], [0, 1])
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    stop = per_rank if stop is None else min(stop, per_rank)
    v = np.arange(rank * per_rank + start, rank * per_rank + max(start, stop), dtype=np.int64)
    if visit_len == 0:
        return v[:0]
    pad = v >= visit_len
    v[pad] = (v[pad] - visit_len) % visit_len
    return v


def batches_per_rank(per_rank: int, batch_size: int | None) -> int:
    return -(-per_rank // batch_size) if batch_size else per_rank


def worker_batches(per_rank: int, batch_size: int | None, workers: int, worker: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` offsets within the rank of the batches ``worker`` produces (j % workers == worker),
    generated lazily: nothing is built per batch of the epoch up front.

    >>> list(worker_batches(10, 4, 2, 1))
    [(4, 8)]
    """
    b = batch_size or 1
    n = batches_per_rank(per_rank, b)
    return ((j * b, min((j + 1) * b, per_rank)) for j in range(worker, n, workers))


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out


def remaining_ranges(
    ranges: Iterable[Sequence[int]], world: int, per_rank: int, consumed: int, keep_padding: bool
) -> list[tuple[int, int]]:
    """Plan ranges not yet seen after every rank consumed ``consumed`` of its ``per_rank`` samples.

    With ``keep_padding`` (same world size on resume) the padding positions stay,
    so each rank's remaining batches are exactly those of an uninterrupted run (a tail
    ``drop_last`` left out stays at the end, where this world drops it again). Without it (elastic resume) every real sample not
    delivered remains, a dropped tail included (it was never delivered); the new world pads
    or drops afresh.

    >>> remaining_ranges([(0, 10)], world=2, per_rank=5, consumed=2, keep_padding=True)
    [(2, 5), (7, 10)]
    >>> remaining_ranges([(0, 11)], world=2, per_rank=4, consumed=4, keep_padding=False)  # drop_last's tail
    [(8, 11)]
    >>> remaining_ranges([(0, 3), (0, 1)], world=2, per_rank=2, consumed=1, keep_padding=False)  # a padding repeat
    [(1, 2)]
    """
    visit = RangeList(ranges)
    n = len(visit)
    consumed = min(max(consumed, 0), per_rank)
    if not keep_padding:  # every plan position of the visit that no rank delivered, once, in plan order
        delivered = [p for r in range(world) for p in _wrapped(visit, r * per_rank, r * per_rank + consumed)]
        return _subtract(_union(visit.as_list()), _union(delivered))
    out: list[tuple[int, int]] = []
    for r in range(world):
        out += _wrapped(visit, r * per_rank + consumed, (r + 1) * per_rank)
    # A tail drop_last leaves out stays in the visit, after every share: this world drops it
    # again (it cannot fill a batch per rank), a later resume onto another world delivers it.
    return _merge(out + visit.sub(world * per_rank, n))


def _wrapped(visit: RangeList, a: int, b: int) -> list[tuple[int, int]]:
    """The plan ranges of virtual positions ``[a, b)`` of ``visit``, past its end wrapping to its start."""
    n = len(visit)
    out = visit.sub(a, min(b, n))
    v = max(a, n)
    while n and v < b:
        u = (v - n) % n
        run = min(b - v, n - u)
        out += visit.sub(u, u + run)
        v += run
    return out


def _union(ranges: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """Ranges sorted and merged: each position once (a visit that holds padding repeats some)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if int(b) > int(a)):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(keep: list[tuple[int, int]], drop: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged ranges ``keep`` without the positions of sorted, merged ``drop``.

    >>> _subtract([(0, 10), (20, 30)], [(2, 4), (8, 22)])
    [(0, 2), (4, 8), (22, 30)]
    """
    out: list[tuple[int, int]] = []
    j = 0
    for a, b in keep:
        while j < len(drop) and drop[j][1] <= a:
            j += 1
        k = j
        while a < b and k < len(drop) and drop[k][0] < b:
            if drop[k][0] > a:
                out.append((a, drop[k][0]))
            a = max(a, drop[k][1])
            k += 1
        if a < b:
            out.append((a, b))
    return out


def unit_samples_per_rank(visit_len: int, unit: int, world: int, batch_size: int | None, drop_last: bool) -> int:
    """Samples per rank when the plan keeps runs of ``unit`` positions together (whole
    single-source batches): ranks split at unit boundaries.

    >>> unit_samples_per_rank(40, 8, 2, 8, False), unit_samples_per_rank(10, 1, 4, None, False)
    (24, 3)
    """
    if unit > 1:
        return samples_per_rank(visit_len // unit, world, None, drop_last) * unit
    return samples_per_rank(visit_len, world, batch_size, drop_last)


PLAN_CHUNK_BATCHES = 16  # batches planned per call: the lookups are vectorised, so they cost per call


def planned_batches(
    spans: Iterable[tuple[int, int]],
    visit: RangeList,
    plan,
    rank: int,
    world: int,
    per_rank: int,
    chunk: int = PLAN_CHUNK_BATCHES,
) -> Iterator[tuple]:
    """``(positions, sources, indices)`` of each batch span of a rank (``worker_batches`` offsets),
    planned ``chunk`` batches per call.

    >>> from mmloader.planning.mixing import SingleOrder
    >>> [p.tolist() for p, _s, _i in planned_batches([(0, 2), (4, 6)], RangeList([(0, 10)]),
    ...                                               SingleOrder(10, shuffle=False), 0, 1, 10)]
    [[0, 1], [4, 5]]
    """
    spans = iter(spans)
    while group := list(itertools.islice(spans, chunk)):
        flat = np.concatenate([rank_positions(len(visit), world, rank, per_rank, a, b) for a, b in group])
        positions = visit.take(flat)
        sources, indices = plan.lookup(positions)
        o = 0
        for a, b in group:
            n = b - a
            yield positions[o : o + n], sources[o : o + n], indices[o : o + n]
            o += n


def unrepeated_share(total: int, world: int, rank: int, batch_size: int | None) -> tuple[int, int, int]:
    """``(start, share, rows)`` of ``rank`` when no sample is repeated (an evaluation pass):
    ranks take contiguous shares differing by at most one sample, and every rank delivers
    the same number of batches; a rank whose share needs one batch fewer ends with a batch of
    one padding row (flagged not valid). Rows past ``share`` are that padding.

    >>> [unrepeated_share(9, 2, r, 4) for r in (0, 1)]
    [(0, 5, 5), (5, 4, 5)]
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    b = batch_size or 1
    base, extra = divmod(int(total), int(world))
    share = base + (rank < extra)
    start = rank * base + min(rank, extra)
    batches = -(-(base + (extra > 0)) // b)  # the largest share's batches: every rank's count
    rows = share if -(-share // b) == batches else (batches - 1) * b + 1
    return start, share, rows


def unrepeated_positions(start: int, share: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Virtual visit positions of rows ``a:b`` of a rank's :func:`unrepeated_share`, and which are
    real samples (the padding row repeats the rank's first sample, or the visit's first).

    >>> [x.tolist() for x in unrepeated_positions(5, 4, 2, 5)]
    [[7, 8, 5], [True, True, False]]
    """
    offsets = np.arange(a, b, dtype=np.int64)
    valid = offsets < share
    return np.where(valid, start + offsets, start if share else 0), valid


def unrepeated_remaining(ranges: Iterable[Sequence[int]], world: int, consumed: int) -> list[tuple[int, int]]:
    """Plan ranges not yet delivered after every rank of an unrepeated split
    (:func:`unrepeated_share`) delivered ``consumed`` rows: the rest of each rank's share.

    >>> unrepeated_remaining([(0, 9)], world=2, consumed=4)
    [(4, 5)]
    """
    visit = RangeList(ranges)
    out: list[tuple[int, int]] = []
    for r in range(world):
        start, share, _rows = unrepeated_share(len(visit), world, r, None)
        out += visit.sub(start + min(consumed, share), start + share)
    return _merge(out)
