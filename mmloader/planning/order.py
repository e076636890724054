"""The epoch order: a blockwise shuffle that is a pure function of (n, seed, epoch).

Samples are cut into blocks of ``block_size`` consecutive indices (a block is
read mostly sequentially from a shard). The block order is shuffled, then the
samples of every ``window_blocks`` consecutive blocks are shuffled together.
Any window is materialised on its own, so memory is O(n / block_size +
block_size * window_blocks), not O(n). The order does not depend on world size
or worker count, which is what lets a run resume on another number of GPUs.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def groups(keys: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(key, the indices holding it)`` for each distinct key, in key order: one stable sort, so
    a lookup over a whole epoch costs O(n log n), not O(n) for each of its windows.

    >>> [(k, i.tolist()) for k, i in groups(np.array([2, 0, 2, 1]))]
    [(0, [1]), (1, [3]), (2, [0, 2])]
    """
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(keys)].tolist()):
        if b > a:
            yield int(ordered[a]), order[a:b]


def epoch_rng(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """A generator seeded from (seed, epoch, *stream): never from pid or time."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch), *map(int, stream)])))


class ShuffledOrder:
    """Position in the epoch -> sample index.

    >>> order = ShuffledOrder(10, seed=0, epoch=0, block_size=4, window_blocks=2)
    >>> sorted(order.take(np.arange(10)).tolist()) == list(range(10))
    True
    """

    def __init__(
        self,
        n: int,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        block_size: int = 1024,
        window_blocks: int = 16,
        stream: tuple[int, ...] = (),
    ):
        if block_size < 1 or window_blocks < 1:
            raise ValueError("block_size and window_blocks must be >= 1")
        self.n, self.shuffle = int(n), shuffle
        self.block_size, self.window_blocks = int(block_size), int(window_blocks)
        self.seed, self.epoch, self.stream = seed, epoch, tuple(stream)
        nb = -(-self.n // self.block_size)
        self.window_len = self.block_size * self.window_blocks
        if shuffle and self.n:
            self.blocks = epoch_rng(seed, epoch, *self.stream).permutation(nb)
            last = int(np.flatnonzero(self.blocks == nb - 1)[0])
            self._short_window = last // self.window_blocks  # the one window holding the short last block
            self._shortfall = nb * self.block_size - self.n
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.n

    def _window_start(self, w: int) -> int:
        return w * self.window_len - (self._shortfall if w > self._short_window else 0)

    def window(self, w: int) -> np.ndarray:
        """Sample indices of window ``w``, in epoch order."""
        hit = self._cache.get(w)
        if hit is None:
            blocks = self.blocks[w * self.window_blocks : (w + 1) * self.window_blocks]
            starts = blocks * self.block_size
            parts = [np.arange(s, min(s + self.block_size, self.n)) for s in starts]
            hit = np.concatenate(parts) if parts else np.empty(0, np.int64)
            epoch_rng(self.seed, self.epoch, *self.stream, w + 1).shuffle(hit)
            if len(self._cache) >= 4:  # readers move forward; keep a few windows only
                self._cache.pop(next(iter(self._cache)))
            self._cache[w] = hit
        return hit

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Sample indices at epoch positions (any order, each in [0, n))."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffle:
            return positions.copy()
        out = np.empty_like(positions)
        # Windows before the one holding the short block are full length; after it they
        # are shifted back by the shortfall.
        boundary = (self._short_window + 1) * self.window_len - self._shortfall
        w = np.where(
            positions < boundary, positions // self.window_len, (positions + self._shortfall) // self.window_len
        )
        for wi, sel in groups(w):
            out[sel] = self.window(wi)[positions[sel] - self._window_start(wi)]
        return out
