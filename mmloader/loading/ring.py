"""Batches from worker processes through a fixed ring of shared-memory slots per worker.

A plain DataLoader ships every batch through fresh shared memory: each tensor gets a
new segment, its descriptor is passed over a Unix socket, and both processes fault
its pages in. For raw bytes that per-batch cost is most of the work. Here each worker
allocates a few slots once; a batch is written into a free slot (images are decoded
straight into it) and only a small descriptor crosses the queue. The training process
wraps each tensor's bytes in the slot in a storage of its own — no copy — and hands the
slot back when none of them is left (each holds a reference to the slot's buffer), so a
batch the caller still holds is never overwritten. A storage of its own, not a view of
the slot: a batch saves, pickles and deep-copies as ordinary tensors at their own size
(a view would drag the whole slot along, and ``torch.save`` refuses one storage seen as
several dtypes). When every slot is held, or a batch does not fit,
that batch goes the ordinary way: slower, never wrong.

Segments are created and unlinked at once (torch's file-descriptor sharing), so
nothing is left in ``/dev/shm`` after a normal exit, Ctrl-C or a killed worker.

>>> loader = mmloader.loader(stream, backend="process")   # uses a ring   # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

import torch

from ..readers.columns import arena

_ALIGN = 64
_MIN_SLOT = 1 << 20
_HEADROOM = 1.5  # slots are sized from the first batch: later ones vary (raw bytes)
_WAIT_FOR_SLOT_S = 0.02  # then send the batch the ordinary way rather than wait for the caller


class SlotTensor(NamedTuple):
    """Where a tensor of a batch lies in its slot."""

    offset: int
    dtype: torch.dtype
    shape: tuple
    stride: tuple


class RingBatch(NamedTuple):
    """What crosses the queue instead of a batch: the slot and the batch with tensors as specs."""

    incarnation: int
    worker: int
    slot: int
    structure: Any
    new_slots: list | None  # the worker's slot tensors, sent once (their memory is shared by fd)


def _batch_out(buffers: dict, key: tuple[int, int]) -> bool:
    """Whether a tensor over the slot buffer ``buffers[key]`` is still out: each holds a reference
    to it (``torch.frombuffer``); with none out, only the dict and this call's argument do."""
    return sys.getrefcount(buffers[key]) > 2


def _dense(t: torch.Tensor) -> bool:
    """Its elements fill its memory once each, in some order of its dims (contiguous,
    channels-last images or clips...): copied into the slot with the same strides, a plain copy."""
    if t.numel() == 0 or t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


class _Arena:
    """Bump allocation inside one slot (used while the batch is built, and to pack it)."""

    def __init__(self, slot: torch.Tensor):
        self.slot, self.used = slot, 0

    def take(self, nbytes: int) -> torch.Tensor | None:
        start = -(-self.used // _ALIGN) * _ALIGN
        if start + nbytes > self.slot.numel():
            return None
        self.used = start + nbytes
        return self.slot[start : start + nbytes]

    def empty(self, shape, dtype: torch.dtype, stride=None) -> torch.Tensor | None:
        """A tensor of ``shape`` (and ``stride``, dense) in the slot, or None when it is full."""
        numel = 1
        for d in shape:
            numel *= d
        raw = self.take(numel * dtype.itemsize)
        if raw is None:
            return None
        flat = raw.view(dtype)
        return flat.view(shape) if stride is None else torch.as_strided(flat, shape, stride)

    def owns(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() == self.slot.untyped_storage().data_ptr()


class BatchRing:
    """The slots of every worker of one loader, and which are free.

    ``flags[w, s]`` is 0 when slot ``s`` of worker ``w`` is free, else the incarnation of the
    worker process that filled it: only the worker sets it (free -> its incarnation), only the
    training process clears it, and only for the incarnation it holds, so a restarted worker's
    fresh slots are never freed by the release of an old one.
    """

    def __init__(self, workers: int, slots_per_worker: int):
        self.slots_per_worker = slots_per_worker
        self.flags = torch.zeros((max(workers, 1), slots_per_worker), dtype=torch.int64).share_memory_()
        self._init_local()

    def __getstate__(self) -> dict:
        return {"slots_per_worker": self.slots_per_worker, "flags": self.flags}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local()

    def _init_local(self) -> None:
        # The flags through numpy: reading or setting one element of a tensor costs ~5 us of
        # dispatch, and the training process checks several per batch (~90 us measured).
        self._flag = self.flags.numpy()
        # worker side
        self._incarnation = 0
        self._slots: list[torch.Tensor] = []
        self._announced = False
        self._cursor = 0
        # training-process side
        # (incarnation, slot) -> the slot's bytes as a numpy buffer (which keeps the slot's shared
        # memory alive), referenced by nothing else but the tensors out: see _batch_out
        self._cache: dict[tuple[int, int], Any] = {}
        self._latest: dict[int, int] = {}  # worker -> newest incarnation seen
        self._held: list[tuple[int, int, int]] = []  # (incarnation, worker, slot) with tensors out
        self._lock = threading.Lock()

    # -- worker side ----------------------------------------------------------------------------
    def send(self, build: Callable[[], Any], worker: int) -> Any:
        """Build a batch into a free slot of this worker; the descriptor to yield (or the batch
        itself when no slot is free or the slots are not made yet)."""
        if not self._incarnation:
            self._incarnation = int.from_bytes(os.urandom(7), "little") | 1
            self.flags[worker].zero_()  # this process's slots are new: none is held
        slot = self._acquire(worker) if self._slots else None
        if slot is None:
            batch = build()
            if self._slots:
                return batch  # every slot held by the caller: the ordinary way
            self._make_slots(batch)
            slot = self._acquire(worker)
            if slot is None:
                return batch
            space = _Arena(self._slots[slot])
        else:
            space = _Arena(self._slots[slot])
            with arena(space.empty):  # images decode straight into the slot
                batch = build()
        structure = _pack(batch, space)
        announce = None if self._announced else self._slots
        self._announced = True
        return RingBatch(self._incarnation, worker, slot, structure, announce)

    def _make_slots(self, batch: Any) -> None:
        size = max(int(_tensor_bytes(batch) * _HEADROOM) + _ALIGN * 64, _MIN_SLOT)
        self._slots = [torch.empty(size, dtype=torch.uint8).share_memory_() for _ in range(self.slots_per_worker)]

    def _acquire(self, worker: int) -> int | None:
        flags = self._flag[worker]
        deadline = None
        while True:
            for k in range(self.slots_per_worker):
                s = (self._cursor + k) % self.slots_per_worker
                if int(flags[s]) == 0:
                    flags[s] = self._incarnation
                    self._cursor = (s + 1) % self.slots_per_worker
                    return s
            now = time.monotonic()
            if deadline is None:
                deadline = now + _WAIT_FOR_SLOT_S
            elif now > deadline:
                return None
            time.sleep(0.0002)

    # -- training-process side ------------------------------------------------------------------
    def receive(self, item: Any) -> Any:
        """The batch a worker sent: its tensors over their bytes in the slot (or the item itself)."""
        self.release()
        if not isinstance(item, RingBatch):
            return item
        inc, worker, slot = item.incarnation, item.worker, item.slot
        if item.new_slots is not None:
            self._adopt(worker, inc, item.new_slots)
        batch = _unpack(item.structure, self._cache[(inc, slot)])
        with self._lock:
            self._held.append((inc, worker, slot))
        return batch

    def _adopt(self, worker: int, inc: int, slots: list[torch.Tensor]) -> None:
        """The slots of a worker process (a new one, or one restarted: forget the old slots once
        their batches are released)."""
        with self._lock:
            old = self._latest.get(worker)
            self._latest[worker] = inc
            held = {(i, s) for i, _w, s in self._held}
            for key in [k for k in self._cache if k[0] == old and k not in held]:
                del self._cache[key]
            for s, t in enumerate(slots):
                self._cache[(inc, s)] = t.numpy()

    def release(self) -> None:
        """Hand back every slot whose batch nobody references any more."""
        with self._lock:
            keep = []
            for inc, worker, slot in self._held:
                if _batch_out(self._cache, (inc, slot)):
                    keep.append((inc, worker, slot))
                    continue
                if int(self._flag[worker, slot]) == inc:
                    self._flag[worker, slot] = 0
                if self._latest.get(worker) != inc:
                    del self._cache[(inc, slot)]
            self._held = keep


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


_LEAVES = frozenset({str, bytes, int, float, bool, type(None)})


def _leaves_only(values: list) -> bool:
    """A list with nothing to pack inside (keys, captions): passed as it is, not walked
    value by value on both sides (~1 us per value, 2 of the ~20 us a raw sample costs)."""
    return {type(v) for v in values} <= _LEAVES


def _pack(obj: Any, space: _Arena) -> Any:
    """``obj`` with each tensor replaced by its place in the slot (copied in when it was built
    elsewhere and fits; left as a tensor, sent the ordinary way, when it does not)."""
    if isinstance(obj, torch.Tensor):
        t = obj
        if not space.owns(t):
            stride = t.stride() if _dense(t) else None
            dst = space.empty(t.shape, t.dtype, stride)
            if dst is None:
                return t
            dst.copy_(t)
            t = dst
        offset = int(t.storage_offset() * t.element_size() - space.slot.storage_offset())  # int: not a SymInt
        return SlotTensor(offset, t.dtype, tuple(t.shape), tuple(t.stride()))
    if isinstance(obj, dict):
        return {k: _pack(v, space) for k, v in obj.items()}
    if isinstance(obj, list):
        return obj if _leaves_only(obj) else [_pack(v, space) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_pack(v, space) for v in obj)
    return obj


def _unpack(obj: Any, slot: Any) -> Any:
    """``obj`` with each tensor spec replaced by a tensor over its bytes in ``slot`` (a numpy
    buffer), in a storage of its own that references the buffer until it is freed."""
    if isinstance(obj, SlotTensor):
        extent = 1 + sum((n - 1) * st for n, st in zip(obj.shape, obj.stride)) if all(obj.shape) else 0
        if not extent:
            return torch.empty(obj.shape, dtype=obj.dtype)
        flat = torch.frombuffer(slot, dtype=obj.dtype, count=extent, offset=obj.offset)
        return torch.as_strided(flat, obj.shape, obj.stride)
    if isinstance(obj, dict):
        return {k: _unpack(v, slot) for k, v in obj.items()}
    if isinstance(obj, list):
        return obj if _leaves_only(obj) else [_unpack(v, slot) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_unpack(v, slot) for v in obj)
    return obj
