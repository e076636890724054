"""Length bucketing: group samples of similar length into batches, within windows of the plan.

The plan is cut into windows of ``batch_size * window_batches`` positions; inside a
window, positions are sorted by sample length and cut into batches, and the order
of those batches is shuffled (seeded from seed, epoch and window). The result is
another permutation of the plan — a pure function of (lengths, seed, epoch) — so
exactly-once, equal batches per rank and mid-epoch resume are untouched, while
each batch pads only to lengths close to its own. With single-source batches
(``batch_composition="source"``) each source is bucketed on its own, so batches
stay single-source.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .order import epoch_rng, groups


class BucketedOrder:
    """Wraps a plan (``len``, ``lookup``, ``unit``) and regroups each window by length.

    >>> from mmloader.planning.mixing import SingleOrder
    >>> plan = BucketedOrder(SingleOrder(100, seed=0), lambda src, idx: idx % 7, batch_size=4, window_batches=5)
    >>> sorted(plan.lookup(np.arange(100))[1].tolist()) == list(range(100))
    True
    """

    def __init__(
        self,
        plan,
        lengths: Callable[[np.ndarray, np.ndarray], np.ndarray],
        batch_size: int,
        window_batches: int = 64,
        seed: int = 0,
        epoch: int = 0,
    ):
        self.plan, self.lengths = plan, lengths
        self.unit = plan.unit
        if self.unit > 1 and self.unit != batch_size:
            raise ValueError(f"bucketing single-source batches needs unit == batch_size ({self.unit} != {batch_size})")
        self.batch_size, self.window = batch_size, batch_size * window_batches
        self.seed, self.epoch = seed, epoch
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.plan)

    def _window_order(self, w: int) -> np.ndarray:
        """Plan positions of window ``w``, in bucketed order."""
        hit = self._cache.get(w)
        if hit is None:
            positions = np.arange(w * self.window, min((w + 1) * self.window, len(self.plan)), dtype=np.int64)
            src, idx = self.plan.lookup(positions)
            lengths = np.asarray(self.lengths(src, idx))
            if self.unit > 1:
                # Whole single-source batches (batch_composition="source"): bucket each source's
                # positions apart. A window holds whole units, so every source fills whole batches.
                groups = [positions[src == s] for s in np.unique(src)]
                lengths_of = [lengths[src == s] for s in np.unique(src)]
            else:
                groups, lengths_of = [positions], [lengths]
            batches = []
            for group, group_lengths in zip(groups, lengths_of):
                by_length = group[np.argsort(group_lengths, kind="stable")]
                batches += [by_length[a : a + self.batch_size] for a in range(0, len(by_length), self.batch_size)]
            order = epoch_rng(self.seed, self.epoch, 0x62756B, w).permutation(len(batches))
            hit = np.concatenate([batches[i] for i in order]) if batches else positions
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[w] = hit
        return hit

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(positions, dtype=np.int64)
        mapped = np.empty_like(p)
        w = p // self.window
        for wi, sel in groups(w):
            mapped[sel] = self._window_order(wi)[p[sel] - wi * self.window]
        return self.plan.lookup(mapped)
