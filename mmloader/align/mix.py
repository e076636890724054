"""``mmloader.mix``: several datasets, one stream, weighted and planned globally."""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import numpy as np

from ..planning.epoch import mix_order
from ..planning.mixing import MixOrder, quotas
from ..planning.schedule import PhasedMixOrder, WeightSchedule


class Mix:
    """Datasets plus how much of each goes into an epoch. Stream it with :class:`mmloader.Stream`.

    ``mode``: ``"proportion"`` (weights = fractions of the epoch), ``"repeat"``
    (weights = repeat factors), ``"count"`` (weights = samples per epoch).
    ``batch_composition``: ``"sample"`` (batches mix sources in proportion) or
    ``"source"`` (each batch from one source; batches alternate in proportion).
    ``schedule``: weights that change over the run (curriculum, annealing), piecewise constant
    or linear, by epoch or by samples consumed — see :class:`mmloader.planning.schedule.WeightSchedule`;
    it needs ``mode="proportion"`` and ``epoch_size``. ``weights_by="tokens"``: the weights
    (and a schedule's) are shares of the *tokens* of an epoch, not of its samples: a stream that
    packs the mix (:class:`mmloader.Packing`) turns them into sample weights by each source's
    mean tokens per sample (``epoch_size`` still counts samples). Plain form::

        {"by": "samples", "interpolate": "linear",
         "points": [{"at": 0, "weights": {"web": 0.9, "hq": 0.1}},
                    {"at": 900_000, "weights": {"web": 0.9, "hq": 0.1}},
                    {"at": 1_000_000, "weights": {"web": 0.2, "hq": 0.8}}]}

    >>> m = mmloader.mix([image_text, text_only], weights=[0.7, 0.3])   # doctest: +SKIP
    >>> stream = mmloader.Stream(m, batch_size=64)                      # doctest: +SKIP
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        mode: str = "proportion",
        epoch_size: int | None = None,
        batch_composition: str = "sample",
        names: Sequence[str] | None = None,
        schedule: WeightSchedule | Mapping[str, Any] | None = None,
        weights_by: str = "samples",
    ):
        if not datasets:
            raise ValueError("mix() needs at least one dataset")
        if batch_composition not in ("sample", "source"):
            raise ValueError(f"batch_composition={batch_composition!r}: expected 'sample' or 'source'")
        self.datasets = list(datasets)
        self.names = list(names) if names else [f"source{i}" for i in range(len(self.datasets))]
        if len(set(self.names)) != len(self.names):
            twice = sorted({n for n in self.names if self.names.count(n) > 1})
            raise ValueError(
                f"mix(names=...): {twice} name(s) more than one source; batches' __source__ could not tell them apart"
            )
        self.sizes = [len(d) for d in self.datasets]
        self.weights = list(weights) if weights is not None else [1.0] * len(self.datasets)
        self.mode, self.composition, self.epoch_size = mode, batch_composition, epoch_size
        if schedule is not None and weights is not None:
            raise ValueError("mix(): give weights or a schedule (whose points hold the weights), not both")
        self.schedule = _schedule(schedule, self.names, mode, epoch_size)
        first = self.schedule.weights_at(0).tolist() if self.schedule is not None else self.weights
        if self.schedule is not None and weights is None:
            self.weights = first  # what summaries show: the schedule's start
        if weights_by not in ("samples", "tokens"):
            raise ValueError(f"weights_by={weights_by!r}: expected 'samples' or 'tokens'")
        if weights_by == "tokens" and mode != "proportion":
            raise ValueError(
                f"weights_by='tokens' makes the weights shares of an epoch's tokens: it needs mode='proportion', not {mode!r}"
            )
        self.weights_by = weights_by
        self.tokens_per_sample: list[float] | None = None  # each source's mean, once a packing stream measured it
        self.given_schedule = self.schedule  # (by_tokens plans with a schedule of sample weights made from it)
        self.quotas = quotas(self.sizes, first, mode=mode, epoch_size=epoch_size)

    def by_tokens(self, tokens_per_sample: Sequence[float]) -> Mix:
        """This mix with its token shares turned into sample weights: each source's weight over
        its mean tokens per sample (a schedule's points alike: the weights are linear in them, so
        a linear schedule's every point is exact too). The mix itself is unchanged."""
        means = np.asarray(tokens_per_sample, dtype=np.float64)
        rows = self.schedule.weights if self.schedule is not None else np.asarray([self.weights], dtype=np.float64)
        for point, row in enumerate(rows):  # (every point of a schedule: a later one may weigh it)
            empty = [n for n, m, w in zip(self.names, means, row) if not m > 0 and w > 0]
            if empty:
                at = f" at schedule point {point}" if self.schedule is not None else ""
                raise ValueError(
                    f"weights_by='tokens': source {empty[0]!r} has a weight{at} but its samples hold no tokens"
                )
        per = np.where(means > 0, 1.0 / np.maximum(means, 1e-12), 0.0)
        out = copy.copy(self)
        out.tokens_per_sample = [float(m) for m in means]
        out.given_schedule = self.schedule  # what identities, summaries and errors show: the user's
        if self.schedule is not None:
            s = self.schedule
            points = [(float(a), (w * per).tolist()) for a, w in zip(s.at, s.weights)]
            out.schedule = WeightSchedule(points, by=s.by, interpolate=s.interpolate)
        # (with a schedule, self.weights are its start's: the planned schedule's start too)
        out.quotas = quotas(
            self.sizes, (np.asarray(self.weights) * per).tolist(), mode=self.mode, epoch_size=self.epoch_size
        )
        return out

    def __len__(self) -> int:
        return int(self.quotas.sum())

    def identity(self) -> dict:
        """The mix as recorded in a resume state: weights, mode, epoch size, composition and
        the per-epoch quotas they give (plain data)."""
        return {
            "names": list(self.names),
            "weights": [float(w) for w in self.weights],
            "mode": self.mode,
            "epoch_size": self.epoch_size,
            "composition": self.composition,
            "quotas": [int(q) for q in self.quotas] if self.schedule is None else None,
            "schedule": self.given_schedule.as_dict() if self.given_schedule is not None else None,
            **({"weights_by": "tokens"} if self.weights_by == "tokens" else {}),  # (the quotas say the rest)
        }

    def order(self, *, unit: int = 1, epoch: int = 0, **kwargs) -> MixOrder | PhasedMixOrder:
        """The plan of ``epoch`` (``kwargs``: seed, shuffle, block_size, window_blocks)."""
        return mix_order(self.sizes, self.quotas, self.schedule, self.epoch_size, unit=unit, epoch=epoch, **kwargs)

    def epoch_quotas(self, epoch: int, batch_size: int | None = None) -> list[int]:
        """Samples of each source in ``epoch`` (they change with a schedule)."""
        return [int(q) for q in self.order(unit=self.unit(batch_size), epoch=epoch).quotas]

    def unit(self, batch_size: int | None) -> int:
        """Plan positions kept together from one source: a whole batch with ``"source"`` composition."""
        return batch_size if self.composition == "source" and batch_size else 1

    def summary(self, batch_size: int | None = None) -> list[dict]:
        """Per source: size, samples per epoch as delivered (whole batches with ``"source"``
        composition), realised proportion, repeats.

        >>> mmloader.mix([a, b], [0.5, 0.5]).summary(batch_size=64)    # doctest: +SKIP
        """
        q = self.order(unit=self.unit(batch_size)).quotas
        total = max(int(q.sum()), 1)
        return [
            {
                "name": n,
                "size": s,
                "per_epoch": int(k),
                "proportion": int(k) / total,
                "repeats": int(k) / s if s else 0.0,
            }
            for n, s, k in zip(self.names, self.sizes, q)
        ]

    def problems(self, batch_size: int | None = None) -> tuple[str | None, list[str]]:
        """(error, warnings) for an epoch that would be empty or degenerate."""
        rows = self.summary(batch_size)
        total = sum(r["per_epoch"] for r in rows)
        warnings: list[str] = []
        if total == 0:
            why = f" in whole batches of {batch_size} (batch_composition='source')" if self.unit(batch_size) > 1 else ""
            return (
                f"the mix plans 0 samples per epoch{why}: quotas {[int(q) for q in self.quotas]} for "
                f"sources {self.names}; raise mix epoch_size or use mode='repeat'"
            ), warnings
        for r, w in zip(rows, self.weights):
            if w > 0 and r["per_epoch"] == 0:
                warnings.append(f"source {r['name']!r} has weight {w} but delivers 0 samples per epoch")
        if self.schedule is not None:  # every later point too: a weight its quotas round to nothing
            for at, point in zip(self.schedule.at[1:].tolist(), self.schedule.weights[1:]):
                got = quotas(self.sizes, point.tolist(), mode=self.mode, epoch_size=self.epoch_size)
                for name, w, k in zip(self.names, point.tolist(), got.tolist()):
                    if w > 0 and k == 0:
                        warnings.append(
                            f"source {name!r} has weight {w:g} at schedule point {at:g} but delivers 0 samples "
                            "per epoch there; raise epoch_size or its weight"
                        )
        if batch_size and total < batch_size:
            warnings.append(f"the epoch holds {total} samples, fewer than one batch of {batch_size}")
        data = sum(size for size, w in zip(self.sizes, self.weights) if w > 0)
        if self.epoch_size is None and self.mode == "proportion" and total < 0.01 * data:
            active = [(size / w, n, size) for n, size, w in zip(self.names, self.sizes, self.weights) if w > 0]
            _, name, size = min(active)
            warnings.append(
                f"the epoch holds {total} of {data} samples: by default no source repeats, and "
                f"source {name!r} ({size} samples) limits the epoch; set epoch_size (mix: "
                "{epoch_size: N}) or mode='repeat' to read more of the others"
            )
        return None, warnings


def _schedule(
    spec: WeightSchedule | Mapping[str, Any] | None, names: list[str], mode: str, epoch_size: int | None
) -> WeightSchedule | None:
    """A schedule from its plain form: ``{by, interpolate, points: [{at, weights}, ...]}``, each
    point's weights a list in source order or a mapping by source name (missing names: 0)."""
    if spec is None:
        return None
    if mode != "proportion" or epoch_size is None:
        raise ValueError(
            "a mix schedule changes proportions within epochs of a fixed length: it needs "
            f"mode='proportion' and epoch_size (got mode={mode!r}, epoch_size={epoch_size!r})"
        )
    if isinstance(spec, WeightSchedule):
        schedule = spec
    else:
        unknown = set(spec) - {"by", "interpolate", "points"}
        if unknown:
            raise ValueError(f"schedule: unknown key(s) {sorted(unknown)} (allowed: by, interpolate, points)")
        points = []
        for n, point in enumerate(spec.get("points") or []):
            at, weights = (point.get("at"), point.get("weights")) if isinstance(point, Mapping) else point
            if isinstance(weights, Mapping):
                extra = set(weights) - set(names)
                if extra:
                    raise ValueError(f"schedule.points[{n}]: unknown source(s) {sorted(extra)} (sources: {names})")
                weights = [weights.get(name, 0.0) for name in names]
            if not isinstance(at, (int, float)) or isinstance(at, bool) or weights is None:
                raise ValueError(f"schedule.points[{n}]: expected {{at: <number>, weights: ...}}, got {point!r}")
            points.append((at, weights))
        schedule = WeightSchedule(points, by=spec.get("by", "epoch"), interpolate=spec.get("interpolate", "step"))
    if schedule.sources != len(names):
        raise ValueError(f"schedule: {schedule.sources} weights per point for {len(names)} sources {names}")
    return schedule


class LiveMix:
    """Stored datasets and one live source (:func:`mmloader.live`) in one stream: what
    :func:`mix` makes when one of its datasets is live. The weights are shares: the live
    source's share of each batch (``batch_composition="sample"``) or of the steps (``"source"``);
    the stored part is planned as a stream of its own (exactly once per epoch, resumable).

    Args:
        datasets: the stored datasets and the live source, in any order.
        weights: one per dataset (default equal); normalised to shares.
        names: one per dataset (default ``source0``, ``source1``...; the live source's own name).
        batch_composition: ``"sample"`` (every batch holds ``round(batch_size * share)`` live
            samples) or ``"source"`` (whole batches alternate, in proportion).
        **stored: other :class:`Mix` options for the stored datasets when there are several.
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        names: Sequence[str] | None = None,
        batch_composition: str = "sample",
        **stored: Any,
    ):
        live = [i for i, d in enumerate(datasets) if getattr(d, "is_live_source", False)]
        if len(live) != 1:
            raise ValueError(
                f"mix() takes one live source, got {len(live)}: several live sources are one factory "
                "that interleaves them"
            )
        if batch_composition not in ("sample", "source"):
            raise ValueError(f"batch_composition={batch_composition!r}: expected 'sample' or 'source'")
        mode = stored.pop("mode", "proportion")
        if mode != "proportion" or stored.get("schedule") is not None:
            raise ValueError(
                "mix() with a live source takes its weights as shares (mode='proportion', no schedule): "
                "a live source has no size to repeat or count"
            )
        if len(datasets) < 2:
            raise ValueError(
                "mix() of a live source alone: stream the source itself (mmloader.LiveStream(source, ...))"
            )
        if stored.get("weights_by", "samples") != "samples":
            raise ValueError(
                "mix(weights_by='tokens') weighs packed rows' tokens; a live stream is not packed: weigh by samples"
            )
        if len(datasets) == 2 and stored:  # one stored dataset: no Mix of the stored part to take them
            raise ValueError(
                f"mix() of a live source and one stored dataset takes no {', '.join(sorted(stored))}: "
                "they are options of a mix of several stored datasets"
            )
        w = [float(x) for x in (weights if weights is not None else [1.0] * len(datasets))]
        if len(w) != len(datasets) or any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"mix(): weights {list(w)} for {len(datasets)} datasets: one non-negative weight each")
        i = live[0]
        self.live = datasets[i]
        self.share = w[i] / sum(w)
        if not 0 < self.share < 1:
            raise ValueError(f"mix(): the live source's share is {self.share:g}: give it and the stored data weight")
        all_names = (
            list(names)
            if names
            else [getattr(d, "name", None) if j == i else f"source{j}" for j, d in enumerate(datasets)]
        )
        self.live_name = str(all_names[i])
        self.names: list[str] = [str(n) for j, n in enumerate(all_names) if j != i]
        stored_sets = [d for j, d in enumerate(datasets) if j != i]
        stored_weights = [x for j, x in enumerate(w) if j != i]
        self.stored: Any = (
            stored_sets[0] if len(stored_sets) == 1 else Mix(stored_sets, stored_weights, names=self.names, **stored)
        )
        self.composition = batch_composition

    def identity(self) -> dict:
        """The mix as recorded in a resume state (plain data)."""
        return {"live": self.live_name, "share": self.share, "composition": self.composition, "stored": self.names}


def mix(datasets: Sequence[Any], weights: Sequence[float] | None = None, **kwargs: Any) -> Mix | LiveMix:
    """See :class:`Mix` (and :class:`LiveMix`, made when one of ``datasets`` is a live source)."""
    if any(getattr(d, "is_live_source", False) for d in datasets):
        return LiveMix(datasets, weights, **kwargs)
    return Mix(datasets, weights, **kwargs)
