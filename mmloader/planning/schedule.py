"""Mix weights that change over a run: piecewise constant or linear, by epoch or by samples.

A schedule is a list of points ``(at, weights)``; ``at`` counts epochs (``by="epoch"``,
fractions allowed: 9.5 is half-way through epoch 9) or samples consumed since the run began
(``by="samples"``). Epoch ``e`` is cut into *phases* at every point that falls inside it (and,
for linear pieces, every 1/:data:`LINEAR_STEPS` of an epoch); each phase mixes with constant
weights. The sources' samples of the whole epoch are drawn once (so within an epoch no sample
repeats while a source's total fits in it) and dealt to the phases in order. Everything is
a pure function of (schedule, epoch size, seed, epoch): resume, elastic resume and every
rank's share work as for fixed weights.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .mixing import MixOrder, apportion

LINEAR_STEPS = 32  # phases per epoch along a linear piece: weights within 1/32 epoch of the line
BY = ("epoch", "samples")
INTERPOLATE = ("step", "linear")


class WeightSchedule:
    """Weights as a function of the run's progress.

    >>> s = WeightSchedule([(0, [1, 0]), (10, [0, 1])], interpolate="linear")
    >>> s.weights_at(5).tolist()
    [0.5, 0.5]

    Args:
        points: ``(at, weights)`` pairs, ``at`` increasing; weights one per source (before the
            first point the first weights hold, after the last the last).
        by: ``"epoch"`` or ``"samples"`` (samples consumed since the run began).
        interpolate: ``"step"`` (each point's weights hold until the next) or ``"linear"``.
    """

    def __init__(self, points: Sequence[tuple[float, Sequence[float]]], by: str = "epoch", interpolate: str = "step"):
        if by not in BY:
            raise ValueError(f"schedule by={by!r}: expected one of {', '.join(map(repr, BY))}")
        if interpolate not in INTERPOLATE:
            raise ValueError(
                f"schedule interpolate={interpolate!r}: expected one of {', '.join(map(repr, INTERPOLATE))}"
            )
        if not points:
            raise ValueError("a schedule needs at least one point (at, weights)")
        self.by, self.interpolate = by, interpolate
        self.at = np.array([float(a) for a, _ in points])
        self.weights = np.array([[float(x) for x in w] for _, w in points], dtype=np.float64)
        if (np.diff(self.at) <= 0).any() or (self.at < 0).any():
            raise ValueError(f"schedule points must be at increasing, non-negative positions, got {self.at.tolist()}")
        if (self.weights < 0).any() or not np.isfinite(self.weights).all():
            raise ValueError("schedule weights must be finite and non-negative")
        if (self.weights.sum(axis=1) <= 0).any():
            bad = self.at[self.weights.sum(axis=1) <= 0].tolist()
            raise ValueError(f"schedule: every point needs a positive weight (all zero at {bad})")

    @property
    def sources(self) -> int:
        return self.weights.shape[1]

    def weights_at(self, t: float) -> np.ndarray:
        """The weights at progress ``t`` (in the schedule's unit)."""
        i = int(np.searchsorted(self.at, t, side="right")) - 1
        if i < 0:
            return self.weights[0].copy()
        if i >= len(self.at) - 1 or self.interpolate == "step":
            return self.weights[i].copy()
        f = (t - self.at[i]) / (self.at[i + 1] - self.at[i])
        return (1 - f) * self.weights[i] + f * self.weights[i + 1]

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what a resume state records, and what :meth:`from_dict` reads)."""
        return {
            "by": self.by,
            "interpolate": self.interpolate,
            "points": [[float(a), w.tolist()] for a, w in zip(self.at, self.weights)],
        }

    @classmethod
    def from_dict(cls, spec: dict) -> "WeightSchedule":
        return cls(
            [(a, w) for a, w in spec["points"]], by=spec.get("by", "epoch"), interpolate=spec.get("interpolate", "step")
        )

    def phases(self, epoch: int, epoch_units: int, unit: int = 1) -> list[tuple[int, np.ndarray]]:
        """``(length in units, weights)`` of each phase of ``epoch``, an epoch of ``epoch_units``
        units of ``unit`` samples.

        >>> [(n, w.tolist()) for n, w in WeightSchedule([(0, [1, 0]), (1.5, [0, 1])]).phases(1, 10)]
        [(5, [1.0, 0.0]), (5, [0.0, 1.0])]
        """
        scale = 1.0 if self.by == "epoch" else 1.0 / (epoch_units * unit)  # schedule unit -> epochs
        at = self.at * scale
        cuts = {0.0, 1.0}
        cuts.update(float(a - epoch) for a in at if epoch < a < epoch + 1)
        if self.interpolate == "linear":
            for i, (a, b) in enumerate(zip(at[:-1], at[1:])):  # pieces of the line inside this epoch
                lo, hi = max(a, epoch), min(b, epoch + 1)
                if hi > lo and not np.array_equal(self.weights[i], self.weights[i + 1]):  # a slope
                    steps = max(1, int(np.ceil((hi - lo) * LINEAR_STEPS)))
                    cuts.update(float(lo - epoch + (hi - lo) * k / steps) for k in range(steps + 1))
        edges = sorted(cuts)
        bounds = [int(round(c * epoch_units)) for c in edges]
        out = []
        for (a, b), (ua, ub) in zip(zip(edges[:-1], edges[1:]), zip(bounds[:-1], bounds[1:])):
            if ub <= ua:
                continue
            t = epoch + (a if self.interpolate == "step" else (a + b) / 2)
            out.append((ub - ua, self.weights_at(t / scale)))
        return out


def phase_quotas(schedule: WeightSchedule, epoch: int, epoch_size: int, unit: int = 1) -> np.ndarray:
    """Samples of each source in each phase of ``epoch``: a (phases, sources) array, whole units.

    >>> phase_quotas(WeightSchedule([(0, [1, 1])]), 0, 10).tolist()
    [[5, 5]]
    """
    units = int(epoch_size) // int(unit)
    rows = []
    carry = np.zeros(schedule.sources)  # rounding left over from earlier phases: no drift over many
    for n, w in schedule.phases(epoch, units, unit):
        target = np.maximum(n * w / w.sum() + carry, 0.0)
        target *= n / target.sum()
        q = apportion(n, target)
        carry = target - q
        rows.append(q * unit)
    return np.array(rows, dtype=np.int64).reshape(-1, schedule.sources)


class PhasedMixOrder:
    """An epoch of several phases, each mixing with its own quotas (:func:`phase_quotas`).

    Each source's items of the whole epoch are drawn as one quota (``MixOrder.indices``), and
    phase ``p`` takes the next ``quotas[p, s]`` of them: no sample repeats in the epoch while
    the source's total fits in it.

    >>> m = PhasedMixOrder([10, 10], np.array([[4, 0], [0, 4]]), seed=0, epoch=0)
    >>> m.lookup(np.arange(8))[0].tolist()
    [0, 0, 0, 0, 1, 1, 1, 1]
    """

    def __init__(self, sizes: list[int], quotas: np.ndarray, unit: int = 1, **opts: Any):
        q = np.asarray(quotas, dtype=np.int64).reshape(-1, len(sizes))
        self.unit = int(unit)
        self.total = MixOrder(sizes, q.sum(axis=0), unit=unit, **opts)  # which samples, per source
        self.phases = [MixOrder(sizes, row, unit=unit, stream=(p + 1,), **opts) for p, row in enumerate(q)]
        self.offsets = np.vstack([np.zeros(len(sizes), np.int64), np.cumsum(q, axis=0)])  # items before phase p
        self.starts = np.concatenate([[0], np.cumsum([len(m) for m in self.phases])]).astype(np.int64)
        self.quotas = q.sum(axis=0)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(positions, dtype=np.int64)
        phase = np.searchsorted(self.starts, p, side="right") - 1
        src, local = np.empty_like(p), np.empty_like(p)
        for k in np.unique(phase).tolist():
            sel = phase == k
            s, loc = self.phases[k].locate(p[sel] - self.starts[k])
            src[sel], local[sel] = s, loc + self.offsets[k][s]
        return src, self.total.indices(src, local)
