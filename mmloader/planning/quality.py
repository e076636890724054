"""How well an epoch plan mixes, in three numbers a user can read (``mmloader plan --quality``).

All three look at the plan's samples in order (positions 0, 1, 2...), never at the data:

* **share drift**: in each window of ``window`` consecutive samples (a few batches), how far
  each source's share strays from its weight, in points; the largest and the 99th percentile
  over the windows. A training step sees the mix it was promised when this is small.
* **shard spread**: how widely the samples of one shard land over the epoch: the standard
  deviation of their positions over that of positions spread uniformly (``n / sqrt(12)``);
  1 is uniform, near 0 is one clump (a shard read in one go: its samples train together).
* **shard runs**: how often two consecutive samples come from the same shard, over how often
  they would by chance (the sum of the shards' squared shares); 1 is chance, large means
  neighbours are correlated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def share_drift(sources: np.ndarray, weights: np.ndarray, window: int) -> tuple[float, float]:
    """(largest, 99th percentile) over windows of ``window`` samples of the largest
    ``|share - weight|`` of any source, in fractions (a last partial window is left out).

    >>> s = np.array([0, 1] * 50)                       # alternating: every window is half and half
    >>> share_drift(s, np.array([0.5, 0.5]), 10)
    (0.0, 0.0)
    >>> share_drift(np.repeat([0, 1], 50), np.array([0.5, 0.5]), 10)   # one source, then the other
    (0.5, 0.5)
    """
    sources = np.asarray(sources, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    windows = len(sources) // window
    if windows == 0:
        return 0.0, 0.0
    cut = sources[: windows * window].reshape(windows, window)
    shares = np.stack([(cut == s).mean(axis=1) for s in range(len(weights))], axis=1)
    drift = np.abs(shares - weights).max(axis=1)
    return float(drift.max()), float(np.percentile(drift, 99))


def shard_spread(shards: np.ndarray) -> float:
    """The median over shards of the standard deviation of their samples' positions, over the
    uniform one (shards of one sample left out).

    >>> round(shard_spread(np.repeat(np.arange(10), 100)), 2)          # unshuffled: 10 clumps
    0.1
    >>> round(shard_spread(np.random.default_rng(0).permutation(np.repeat(np.arange(10), 100))), 1)
    1.0
    """
    shards = np.asarray(shards, dtype=np.int64)
    n = len(shards)
    if n < 2:
        return 1.0
    order = np.argsort(shards, kind="stable")
    ordered = shards[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    uniform = n / np.sqrt(12.0)
    spreads = [np.std(p) / uniform for p in np.split(order, cuts) if len(p) > 1]
    return float(np.median(spreads)) if spreads else 1.0


def shard_runs(shards: np.ndarray) -> float:
    """How often consecutive samples share a shard, over chance.

    >>> round(shard_runs(np.repeat(np.arange(10), 100)), 1)         # unshuffled: 99% against 10%
    9.9
    >>> round(shard_runs(np.random.default_rng(0).permutation(np.repeat(np.arange(100), 100))), 1)
    1.0
    """
    shards = np.asarray(shards, dtype=np.int64)
    if len(shards) < 2:
        return 1.0
    same = float(np.mean(shards[1:] == shards[:-1]))
    _values, counts = np.unique(shards, return_counts=True)
    chance = float(np.sum((counts / len(shards)) ** 2))
    return same / chance if chance else 1.0


@dataclass
class Quality:
    """The three measures of a plan, and what they say."""

    window: int  # samples per window of the share drift
    drift_max: float
    drift_p99: float
    spread: float
    runs: float
    #: the drift the verdict allows: 5 points, or what drawing the window's samples at random
    #: would stray by (3 standard deviations), if more: a window of few samples cannot do better
    drift_limit: float = 0.05

    def verdict(self) -> str:
        """One line: "good" when shares stay within :attr:`drift_limit` (p99), shards spread
        (>= 0.5) and neighbours share a shard at most 2x as often as by chance; else what is not."""
        problems = []
        if self.drift_p99 > self.drift_limit:
            problems.append(
                f"source shares stray up to {100 * self.drift_p99:.0f} points (p99) within {self.window} samples"
            )
        if self.spread < 0.5:
            problems.append(f"a shard's samples clump together (spread {self.spread:.2f} of uniform)")
        if self.runs > 2:
            problems.append(f"consecutive samples share a shard {self.runs:.1f}x as often as by chance")
        return "good: mixes as configured" if not problems else "poor: " + "; ".join(problems)


def plan_quality(sources: np.ndarray, shards: np.ndarray, weights: np.ndarray, window: int) -> Quality:
    """The measures of a plan given each position's source and shard (a global shard id).

    >>> rng = np.random.default_rng(1)
    >>> good = plan_quality(rng.integers(0, 2, 4000), rng.integers(0, 40, 4000), np.array([1, 1]), 400)
    >>> good.verdict()
    'good: mixes as configured'
    >>> bad = plan_quality(np.repeat([0, 1], 2000), np.repeat(np.arange(40), 100), np.array([1, 1]), 400)
    >>> bad.verdict().startswith("poor: source shares stray up to 50 points")
    True
    """
    drift_max, drift_p99 = share_drift(sources, weights, window)
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    limit = max(0.05, 3 * float(np.sqrt(np.max(w * (1 - w)) / max(window, 1))))
    return Quality(int(window), drift_max, drift_p99, shard_spread(shards), shard_runs(shards), limit)
