"""Randomness tied to the plan: every batch has a seed from (seed, epoch, rank, its first plan position).

A batch's seed does not depend on which worker or thread builds it, on the worker
count, or on whether the run was resumed, so the same seed gives the same
augmentations on both backends and after a resume.

* :func:`rng` gives the batch being built its own generators (torch, numpy,
  ``random``), per thread: reproducible on every backend. Built-in randomness uses it.
* In DataLoader worker processes the global RNGs (``random``, ``numpy.random``,
  ``torch``) are also seeded per batch when user Python runs there (transforms,
  custom readers or decoders, a custom collate), so code that draws from them is
  reproducible there. The thread backend leaves the global RNGs alone: they belong to
  the training loop running beside it (its dropout, its sampling).

>>> def augment(image):                                   # doctest: +SKIP
...     if mmloader.rng().torch_rand() < 0.5:
...         image = image.flip(-1)
...     return image
"""

from __future__ import annotations

import random
import threading
from typing import Callable

import numpy as np
import torch
from torch import Tensor

_local = threading.local()


def batch_seed(seed: int, epoch: int, rank: int, first_position: int) -> int:
    """The 64-bit seed of the batch that starts at plan position ``first_position`` on ``rank``.

    >>> batch_seed(0, 1, 0, 64) == batch_seed(0, 1, 0, 64) != batch_seed(0, 2, 0, 64)
    True
    """
    return int(
        np.random.SeedSequence([int(seed), int(epoch), int(rank), int(first_position), 0x6D6D6C]).generate_state(
            1, np.uint64
        )[0]
    )


class BatchRNG:
    """Generators for one batch, made on first use from the batch's seed.

    ``seed``: the seed, or a function that computes it: :func:`batch_seed` costs ~14 us
    (numpy's SeedSequence), a tenth of a raw batch's build, and most batches draw nothing.
    """

    def __init__(self, seed: int | Callable[[], int]):
        self._seed = seed if callable(seed) else int(seed)
        self._torch: torch.Generator | None = None
        self._numpy: np.random.Generator | None = None
        self._random: random.Random | None = None

    @property
    def seed(self) -> int:
        if callable(self._seed):
            self._seed = int(self._seed())
        return self._seed

    @property
    def torch(self) -> torch.Generator:
        if self._torch is None:
            self._torch = torch.Generator().manual_seed(self.seed)
        return self._torch

    @property
    def numpy(self) -> np.random.Generator:
        if self._numpy is None:
            self._numpy = np.random.default_rng(self.seed)
        return self._numpy

    @property
    def random(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(self.seed)
        return self._random

    def torch_rand(self, *size: int) -> Tensor | float:  # Tensor: in this class ``torch`` is the generator
        """Uniform [0, 1) from the batch's torch generator (a float when no size is given)."""
        out = torch.rand(size or (1,), generator=self.torch)
        return float(out) if not size else out


def rng() -> BatchRNG:
    """The generators of the batch this thread is building (outside a batch: seeded from 0).

    >>> mmloader.rng().numpy.integers(0, 10)        # doctest: +SKIP
    """
    current = getattr(_local, "rng", None)
    if current is None:
        current = _local.rng = BatchRNG(0)
    return current


def enter_batch(seed: int | Callable[[], int], seed_globals: bool) -> None:
    """Make ``seed`` (or the seed it computes, when first needed) the current batch's (this
    thread); with ``seed_globals`` (worker processes only) also reseed the process-wide RNGs."""
    current = _local.rng = BatchRNG(seed)
    if seed_globals:
        seed = current.seed
        small = seed % (1 << 32)
        random.seed(seed)
        np.random.seed(small)
        # The CPU generator only: torch.manual_seed also queues a reseed of every accelerator
        # backend, recording a stack trace each time (~1 ms, a third of a raw batch's cost);
        # a worker process draws from the CPU generator alone.
        torch.default_generator.manual_seed(seed)
