"""Planning: pure functions from (counts, seed, epoch, rank, world, worker, workers) to positions.

Nothing here opens a file; everything is numpy and can be tested exhaustively.
"""

from .order import ShuffledOrder, epoch_rng
from .partition import RangeList, rank_positions, remaining_ranges, samples_per_rank, worker_batches

__all__ = [
    "ShuffledOrder",
    "epoch_rng",
    "RangeList",
    "samples_per_rank",
    "rank_positions",
    "worker_batches",
    "remaining_ranges",
]
