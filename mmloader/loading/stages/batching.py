"""``Batching``: a rank's share of the plan in equal batches, and how they are collated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...align.collate import collate
from ...planning.partition import unit_samples_per_rank, unrepeated_share
from .values import choice, flag, whole

PADDING = ("repeat", "mask")


@dataclass(frozen=True)
class Batching:
    """``size`` samples (rows, when packing) per batch; None: samples one by one.

    Every rank delivers the same number of batches. ``padding="repeat"`` (default) fills a
    short last share by repeating samples from the plan's start, or ``drop_last=True`` drops
    what does not fill a batch on every rank. ``padding="mask"`` (evaluation) repeats nothing:
    ranks' shares differ by one sample at most, the last batches may be short, and each batch
    carries ``__valid__`` (False only on a padding row a rank with one batch fewer needs).
    ``collate_fn`` builds a batch from its samples (None: the list as it is).

    >>> Batching(64, padding="mask").identity()
    {'batch_size': 64, 'drop_last': False, 'padding': 'mask'}
    >>> Batching(64, drop_last=True, padding="mask")
    Traceback (most recent call last):
    ...
    ValueError: padding='mask' delivers every sample once; drop_last=True drops some: choose one
    """

    size: int | None = None
    drop_last: bool = False
    padding: str = "repeat"
    collate_fn: Callable[[list], Any] | None = collate

    def __post_init__(self) -> None:
        whole("batch_size", self.size, 1, allow_none=True)
        flag("drop_last", self.drop_last)
        choice("padding", self.padding, PADDING)
        if self.padding == "mask" and self.drop_last:
            raise ValueError("padding='mask' delivers every sample once; drop_last=True drops some: choose one")

    def identity(self) -> dict[str, Any]:
        """Batching's part of a stream's identity (collate does not change which samples go where)."""
        return {"batch_size": self.size, "drop_last": bool(self.drop_last), "padding": self.padding}

    def per_rank(self, visit: int, unit: int, world: int, rank: int = 0) -> int:
        """Samples (rows) rank ``rank`` of ``world`` delivers of a visit of ``visit`` plan positions
        taken in units of ``unit`` (a mix whose batches come from one source at a time)."""
        if self.padding == "mask":
            return unrepeated_share(visit, world, rank, self.size)[2]
        return unit_samples_per_rank(visit, unit, world, self.size, self.drop_last)
