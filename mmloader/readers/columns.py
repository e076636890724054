"""Column forms a reader can hand back for a whole batch (``Reader.from_column``) besides a list."""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import threading
from typing import Callable, Iterable, NamedTuple, Sized

import numpy as np
import torch


class Packed(NamedTuple):
    """Encoded bytes of a batch in one buffer (``ImageReader(output="raw")``): ``flat`` and the
    ``B + 1`` ``offsets`` of its samples. One buffer is one shared-memory segment between
    processes and one host-to-device copy."""

    flat: torch.Tensor
    offsets: torch.Tensor


class Ragged(NamedTuple):
    """1-D values of a batch end to end (token ids of different lengths): ``flat`` and the
    ``B + 1`` ``offsets``. The collate pads them to the longest with a mask in one step, or
    stacks them when they have one length; never one tensor per sample."""

    flat: torch.Tensor
    offsets: torch.Tensor


class Stacked(NamedTuple):
    """A batch tensor the reader assembled itself (images decoded in place, channels_last)."""

    tensor: torch.Tensor


def offsets_of(values: Iterable[Sized]) -> np.ndarray:
    """The ``len(values) + 1`` boundaries of ``values`` laid end to end (int64, from 0).

    >>> offsets_of([b"ab", b"", b"c"]).tolist()
    [0, 2, 2, 3]
    """
    return np.fromiter(itertools.accumulate(map(len, values), initial=0), dtype=np.int64)


_local = threading.local()


@contextlib.contextmanager
def arena(allocate: Callable[..., torch.Tensor | None]):
    """While active (this thread), :func:`batch_buffer` asks ``allocate(shape, dtype)`` first:
    the process backend's ring points it at a shared-memory slot, so images decode straight
    into the memory the training process will read."""
    previous = getattr(_local, "allocate", None)
    _local.allocate = allocate
    try:
        yield
    finally:
        _local.allocate = previous


def batch_buffer(shape: tuple, dtype: torch.dtype, share_memory: bool = False) -> torch.Tensor:
    """An uninitialised tensor for a batch a reader assembles itself (see :func:`arena`)."""
    allocate = getattr(_local, "allocate", None)
    if allocate is not None:
        out = allocate(shape, dtype)
        if out is not None:
            return out
    if share_memory:
        # A batch for another process goes through shared memory anyway: allocating it there saves
        # a copy when it is sent (and no freed 12 MB heap block per batch stays with the worker).
        return torch.empty(shape, dtype=dtype).share_memory_()
    return _POOL.tensor(shape, dtype)


class BufferPool:
    """Large batch tensors handed out again once nothing refers to them any more.

    A batch the training loop receives in this process (the thread backend) is freed when
    the loop drops it. Blocks over glibc's 32 MB mmap limit (a batch of 64 float32 224-px
    images is 38.5 MB) go back to the kernel then, and the next batch pays a page fault
    per 4 KB page on first touch: measured 16 ms a batch here, 250 us an image, about as
    much as decoding it. The pool keeps the memory instead: each block is a numpy array
    that every tensor (and view) made from it refers to, so a refcount of the pool's own
    references alone means nothing can see it, and it is reused.

    Args:
        keep: blocks kept per size (enough for the batches in flight: prefetched ones, the
            one the loop holds, the one it just dropped).
        sizes: distinct block sizes kept (the oldest size's blocks are let go first).
        min_bytes: smaller tensors are plain allocations (glibc reuses those itself).
    """

    def __init__(self, keep: int = 8, sizes: int = 4, min_bytes: int = 4 << 20):
        self.keep, self.sizes, self.min_bytes = keep, sizes, min_bytes
        self._blocks: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def tensor(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype``."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            blocks = self._blocks.pop(nbytes, [])
            self._blocks[nbytes] = blocks  # most recently used size last
            while len(self._blocks) > self.sizes:
                del self._blocks[next(iter(self._blocks))]
            for block in blocks:
                # references: the list, this loop's variable, getrefcount's argument; any tensor
                # or view made from the block adds one (it holds the buffer it was made from)
                if sys.getrefcount(block) == 3:
                    return torch.frombuffer(block, dtype=dtype).view(shape)
            block = np.empty(nbytes, dtype=np.uint8)
            if len(blocks) < self.keep:
                blocks.append(block)
            return torch.frombuffer(block, dtype=dtype).view(shape)


_POOL = BufferPool()


def scratch(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A working tensor for building a batch, from the pool (never the ring's shared slot)."""
    return _POOL.tensor(shape, dtype)


def concat_bytes(datas: list, bounds: list[int], share_memory: bool = False) -> torch.Tensor:
    """``datas`` (bytes-like) end to end in one uint8 tensor; ``bounds``: their offsets
    (:func:`offsets_of` as a list). Into the ring's slot or shared memory when the batch
    goes to another process; otherwise one ``bytearray.join`` (all in C, measured 2.1 against
    2.5 us per 20 KB image for a Python loop of slice copies into a fresh tensor)."""
    if not share_memory and getattr(_local, "allocate", None) is None:
        return (
            torch.frombuffer(bytearray().join(datas), dtype=torch.uint8)
            if bounds[-1]
            else torch.empty(0, dtype=torch.uint8)
        )
    flat = batch_buffer((bounds[-1],), torch.uint8, share_memory)
    if bounds[-1]:
        out = flat.numpy().data  # its memoryview
        for d, a, b in zip(datas, bounds, bounds[1:]):
            out[a:b] = d
    return flat


def per_sample(column) -> list:
    """A column as one value per sample: a :class:`Stacked` batch as views of its rows, a
    :class:`Packed` or :class:`Ragged` buffer as views of each sample's values, a list as itself."""
    if isinstance(column, Stacked):
        return list(column.tensor.unbind(0))
    if isinstance(column, (Packed, Ragged)):
        bounds = column.offsets.tolist()
        return [column.flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return column
