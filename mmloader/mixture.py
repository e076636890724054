"""``mmloader.mix``: several datasets, one stream, weighted and planned globally."""
from __future__ import annotations

from typing import Any, Sequence

from .planning.mixing import MixOrder, quotas


class Mix:
    """Datasets plus how much of each goes into an epoch. Stream it with :class:`mmloader.Stream`.

    ``mode``: ``"proportion"`` (weights = fractions of the epoch), ``"repeat"``
    (weights = repeat factors), ``"count"`` (weights = samples per epoch).
    ``batch_composition``: ``"sample"`` (batches mix sources in proportion) or
    ``"source"`` (each batch from one source; batches alternate in proportion).

    >>> m = mmloader.mix([image_text, text_only], weights=[0.7, 0.3])   # doctest: +SKIP
    >>> stream = mmloader.Stream(m, batch_size=64)                      # doctest: +SKIP
    """

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float] | None = None, *,
                 mode: str = "proportion", epoch_size: int | None = None,
                 batch_composition: str = "sample", names: Sequence[str] | None = None):
        if not datasets:
            raise ValueError("mix() needs at least one dataset")
        if batch_composition not in ("sample", "source"):
            raise ValueError(f"batch_composition={batch_composition!r}: expected 'sample' or 'source'")
        self.datasets = list(datasets)
        self.names = list(names) if names else [f"source{i}" for i in range(len(self.datasets))]
        self.sizes = [len(d) for d in self.datasets]
        self.weights = list(weights) if weights is not None else [1.0] * len(self.datasets)
        self.mode, self.composition = mode, batch_composition
        self.quotas = quotas(self.sizes, self.weights, mode=mode, epoch_size=epoch_size)

    def __len__(self) -> int:
        return int(self.quotas.sum())

    def order(self, *, unit: int = 1, **kwargs) -> MixOrder:
        return MixOrder(self.sizes, self.quotas, unit=unit, **kwargs)

    def summary(self, unit: int = 1) -> list[dict]:
        """Per source: size, samples per epoch, realised proportion, repeats."""
        q = self.order(unit=unit).quotas
        total = max(int(q.sum()), 1)
        return [{"name": n, "size": s, "per_epoch": int(k), "proportion": int(k) / total,
                 "repeats": int(k) / s if s else 0.0} for n, s, k in zip(self.names, self.sizes, q)]


def mix(datasets: Sequence[Any], weights: Sequence[float] | None = None, **kwargs: Any) -> Mix:
    """See :class:`Mix`."""
    return Mix(datasets, weights, **kwargs)
