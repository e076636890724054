"""``Order``: the epoch's order of samples, a pure function of ``(seed, epoch)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...planning.epoch import epoch_plan
from .values import flag, whole


@dataclass(frozen=True)
class Order:
    """Blockwise shuffle: blocks of ``block_size`` consecutive samples, shuffled within windows of
    ``window_blocks`` blocks (reads stay sequential within a block), a new order each epoch from
    ``seed``, independent of world size and worker count. ``shuffle=False``: the stored order.

    >>> Order(seed=3).identity()["seed"]
    3
    >>> Order(block_size=0)
    Traceback (most recent call last):
    ...
    ValueError: block_size=0: expected an integer >= 1
    """

    shuffle: bool = True
    seed: int = 0
    block_size: int = 1024
    window_blocks: int = 16

    def __post_init__(self) -> None:
        flag("shuffle", self.shuffle)
        whole("seed", self.seed, 0)
        whole("block_size", self.block_size, 1)
        whole("window_blocks", self.window_blocks, 1)

    def identity(self) -> dict[str, Any]:
        """The order's part of a stream's identity (what a resume state must match)."""
        return {
            "seed": int(self.seed),
            "shuffle": bool(self.shuffle),
            "block_size": int(self.block_size),
            "window_blocks": int(self.window_blocks),
        }

    def plan(
        self,
        size: int | None,
        mix: Any,
        epoch: int,
        batch_size: int | None,
        lengths: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        bucket_window: int = 64,
    ):
        """The epoch's plan of samples over one source of ``size`` or over ``mix``
        (``lengths``: bucketed within windows of ``bucket_window`` batches)."""
        return epoch_plan(
            size,
            mix,
            seed=int(self.seed),
            epoch=epoch,
            shuffle=bool(self.shuffle),
            block_size=int(self.block_size),
            window_blocks=int(self.window_blocks),
            batch_size=batch_size,
            lengths=lengths,
            bucket_window=bucket_window,
        )
