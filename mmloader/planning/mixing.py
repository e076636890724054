"""Weighted mixing of several sources into one epoch plan, decided before any rank split.

Each source contributes a *quota* of samples per epoch. Source ``s`` is read as
an endless sequence of shuffled cycles over its samples; epoch ``e`` takes the
next ``quota`` positions of that sequence, so within a quota no sample repeats
(unless the quota exceeds the source, i.e. upsampling) and successive epochs
walk through the whole source. Sources are interleaved chunk by chunk: chunk
``k`` takes ``floor((k+1)·C·q/T) - floor(k·C·q/T)`` items of each source, so
proportions hold within every chunk (±1 item) and any position is found without
materialising the epoch.
"""

from __future__ import annotations

import numpy as np

from .order import ShuffledOrder, epoch_rng, groups


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest remainder).

    >>> apportion(10, np.array([0.5, 0.3, 0.2])).tolist()
    [5, 3, 2]
    """
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    base = np.floor(exact).astype(np.int64)
    rest = total - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:rest]] += 1
    return base


def quotas(
    sizes: list[int], weights: list[float] | None = None, *, mode: str = "proportion", epoch_size: int | None = None
) -> np.ndarray:
    """Samples per epoch from each source.

    * ``proportion``: ``weights`` are fractions of the epoch; ``epoch_size`` defaults to
      the largest epoch in which no source repeats.
    * ``repeat``: ``weights`` are repeat factors (2.0 = each sample twice per epoch).
    * ``count``: ``weights`` are per-source sample counts.

    >>> quotas([1000, 100], [0.5, 0.5]).tolist()
    [100, 100]
    """
    sizes_a = np.asarray(sizes, dtype=np.int64)
    w = np.ones(len(sizes_a)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(sizes_a):
        raise ValueError(f"{len(w)} weights for {len(sizes_a)} sources")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError(f"weights must be finite and non-negative, got {w.tolist()}")
    if w.sum() <= 0:
        raise ValueError("at least one weight must be positive")
    if epoch_size is not None and (
        isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) or epoch_size < 1
    ):
        raise ValueError(f"epoch_size={epoch_size!r}: expected a whole number of samples >= 1")
    if mode == "count" and not np.all(w == np.floor(w)):
        raise ValueError(f"mode='count' takes whole numbers of samples as weights, got {w.tolist()}")
    if mode == "proportion":
        if epoch_size is None:
            active = w > 0
            epoch_size = int(np.floor((sizes_a[active] / (w[active] / w.sum())).min()))
        return apportion(int(epoch_size), w)
    if mode == "repeat":
        q = np.floor(sizes_a * w + 0.5).astype(np.int64)
    elif mode == "count":
        q = np.floor(w).astype(np.int64)
    else:
        raise ValueError(f"mix mode {mode!r}: expected 'proportion', 'repeat' or 'count'")
    if epoch_size is not None:
        q = apportion(int(epoch_size), q)
    return q


FULL_CYCLE, REMAINDER = 1, 2  # the two kinds of shuffled cycles a quota draws from


def quota_indices(size: int, quota: int, epoch: int, local: np.ndarray, order) -> np.ndarray:
    """Which samples of a source of ``size`` fill positions ``local`` of its ``quota`` in ``epoch``.

    ``quota = a * size + r``: the epoch takes ``a`` whole shuffled cycles (each sample ``a``
    times) plus ``r`` samples from a remainder cycle, so within an epoch every sample appears
    ``a`` or ``a + 1`` times and, when the quota fits (``a == 0``), never twice. A remainder
    cycle is shared by ``k = size // r`` consecutive epochs, which take disjoint slices of it:
    successive epochs walk through the source (all of it when ``r`` divides ``size``) instead of
    re-reading one part. ``order(kind, cycle)`` gives the shuffled order of a cycle (``.take``).

    >>> from mmloader.planning.order import ShuffledOrder
    >>> order = lambda kind, cycle: ShuffledOrder(10, 0, cycle, stream=(kind,))
    >>> sorted(np.concatenate([quota_indices(10, 5, e, np.arange(5), order) for e in (0, 1)]).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    local = np.asarray(local, dtype=np.int64)
    whole, rest = divmod(int(quota), int(size))
    out = np.empty_like(local)
    full = local < whole * size
    for c in np.unique(local[full] // size):  # whole cycles: a fresh shuffle per epoch and cycle
        sel = full & (local // size == c)
        out[sel] = order(FULL_CYCLE, int(epoch) * whole + int(c)).take(local[sel] - c * size)
    if rest and (~full).any():
        per_cycle = size // rest  # epochs sharing one remainder cycle
        cycle, slot = divmod(int(epoch), per_cycle)
        out[~full] = order(REMAINDER, cycle).take(slot * rest + local[~full] - whole * size)
    return out


class MixOrder:
    """Epoch position -> (source, sample index). ``unit`` > 1 keeps runs of ``unit``
    consecutive positions from one source (``batch_composition="source"``).

    >>> m = MixOrder([100, 10], [20, 10], seed=0, epoch=0)
    >>> src, idx = m.lookup(np.arange(len(m))); np.bincount(src).tolist()
    [20, 10]
    """

    def __init__(
        self,
        sizes: list[int],
        quotas_: np.ndarray,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        block_size: int = 1024,
        window_blocks: int = 16,
        unit: int = 1,
        chunk: int = 1024,
        stream: tuple[int, ...] = (),
    ):
        self.sizes = [int(s) for s in sizes]
        self.stream = tuple(stream)  # distinguishes the interleavings of several phases of one epoch
        self.unit = int(unit)
        self.quota_units = np.asarray(quotas_, dtype=np.int64) // self.unit
        for s, (size, q) in enumerate(zip(self.sizes, self.quota_units)):
            if q > 0 and size == 0:
                raise ValueError(f"source {s} is empty but has a quota of {q * self.unit}")
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.block_size, self.window_blocks, self.chunk = block_size, window_blocks, int(chunk)
        self.total_units = int(self.quota_units.sum())
        k = np.arange(-(-self.total_units // self.chunk) + 1, dtype=np.int64)
        self._f = self._before(k)  # (chunks+1, sources): items of s before chunk k
        self._cum = self._f.sum(axis=1)  # units before chunk k
        self._orders: dict[tuple[int, int, int], ShuffledOrder] = {}
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _before(self, k: np.ndarray) -> np.ndarray:
        t = max(self.total_units, 1)
        reach = np.minimum(k * self.chunk, self.total_units)
        return (reach[:, None] * self.quota_units[None, :]) // t

    @property
    def quotas(self) -> np.ndarray:
        return self.quota_units * self.unit

    def __len__(self) -> int:
        return self.total_units * self.unit

    def _chunk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        hit = self._chunks.get(k)
        if hit is None:
            counts = self._f[k + 1] - self._f[k]
            src = np.repeat(np.arange(len(counts)), counts)
            if self.shuffle:
                epoch_rng(self.seed, self.epoch, 0x6D6978, *self.stream, k).shuffle(src)
            local = np.empty_like(src)
            for s in np.flatnonzero(counts):  # the j-th item of s in this chunk
                sel = src == s
                local[sel] = self._f[k, s] + np.arange(counts[s])
            if len(self._chunks) >= 4:
                self._chunks.pop(next(iter(self._chunks)))
            hit = self._chunks[k] = (src, local)
        return hit

    def _source_indices(self, s: int, local: np.ndarray) -> np.ndarray:
        """Sample indices of source ``s`` for positions ``local`` (0 <= local < quota) of this epoch."""
        return quota_indices(self.sizes[s], int(self.quotas[s]), self.epoch, local, self._order_for(s))

    def _order_for(self, s: int):
        def order(kind: int, cycle: int) -> ShuffledOrder:
            key = (s, kind, cycle)
            hit = self._orders.get(key)
            if hit is None:
                hit = ShuffledOrder(
                    self.sizes[s],
                    self.seed,
                    cycle,
                    self.shuffle,
                    self.block_size,
                    self.window_blocks,
                    stream=(s + 1, kind),
                )
                if len(self._orders) >= 4 * len(self.sizes):
                    self._orders.pop(next(iter(self._orders)))
                self._orders[key] = hit
            return hit

        return order

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        src, local = self.locate(positions)
        return src, self.indices(src, local)

    def indices(self, src: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Sample indices of the ``local``-th items of sources ``src`` in this epoch's quotas."""
        idx = np.empty_like(local)
        for s in np.unique(src):
            sel = src == s
            idx[sel] = self._source_indices(int(s), local[sel])
        return idx

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, item of that source's quota) at each epoch position."""
        p = np.asarray(positions, dtype=np.int64)
        units, within = p // self.unit, p % self.unit
        k = np.searchsorted(self._cum, units, side="right") - 1
        src = np.empty_like(p)
        local = np.empty_like(p)
        for kk, sel in groups(k):
            s_chunk, l_chunk = self._chunk(kk)
            i = units[sel] - self._cum[kk]
            src[sel] = s_chunk[i]
            local[sel] = l_chunk[i] * self.unit + within[sel]
        return src, local


class SingleOrder:
    """One source: the plan is its shuffled order (``lookup`` returns source 0)."""

    def __init__(self, n: int, **kwargs):
        self.order = ShuffledOrder(n, **kwargs)
        self.unit = 1

    def __len__(self) -> int:
        return len(self.order)

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = self.order.take(positions)
        return np.zeros_like(idx), idx
