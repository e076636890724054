"""Column forms a reader can hand back for a whole batch (``Reader.from_column``) besides a list."""

from __future__ import annotations

import contextlib
import itertools
import math
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
    much as decoding it. The pool keeps the memory instead. Every tensor handed out is a
    view of one base tensor per block, so they all share its storage, and the storage's use
    count (torch's own reference count, which Python's reference counting does not affect)
    says whether anything but the pool still refers to it: a tensor, a view, a numpy array
    made from one (it holds the tensor), a DLPack capsule.

    Args:
        keep: blocks kept per size (enough for the batches in flight: prefetched ones, the
            one the loop holds, the one it just dropped).
        sizes: distinct block sizes kept (the oldest size's blocks are let go first).
        min_bytes: smaller tensors are plain allocations (glibc reuses those itself).
        max_bytes: the most the pool keeps in all.
    """

    def __init__(self, keep: int = 8, sizes: int = 4, min_bytes: int = 4 << 20, max_bytes: int = 1 << 30):
        self.keep, self.sizes, self.min_bytes, self.max_bytes = keep, sizes, min_bytes, max_bytes
        self._blocks: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds (blocks in use included)."""
        return sum(n * len(b) for n, b in self._blocks.items())

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
            for base in blocks:
                if _free(base):
                    return base.view(dtype).view(shape)
            base = torch.empty(nbytes, dtype=torch.uint8)
            if len(blocks) < self.keep and self.nbytes + nbytes <= self.max_bytes:
                blocks.append(base)
            return base.view(dtype).view(shape)

    def release(self) -> None:
        """Let go of the blocks nothing uses (those in use are freed with their last tensor)."""
        with self._lock:
            for nbytes in list(self._blocks):
                self._blocks[nbytes] = [b for b in self._blocks[nbytes] if not _free(b)]
                if not self._blocks[nbytes]:
                    del self._blocks[nbytes]


def _free(base: torch.Tensor) -> bool:
    # The storage's references: ``base`` itself, and the Python storage object made for the
    # call; every tensor or view handed out adds one.
    return torch._C._storage_Use_Count(base.untyped_storage()._cdata) <= 2


_POOL = BufferPool()


def release_pool() -> None:
    """Let go of the pooled batch buffers nothing uses (the thread backend, after each pass)."""
    _POOL.release()


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
