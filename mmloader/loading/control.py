"""State the training process shares with its DataLoader workers, in one shared-memory tensor.

Persistent workers keep the dataset object they were started with, so attribute
changes made in the training process never reach them (a classic trap:
``set_epoch`` that workers do not see). The epoch, place in the world and the
resume flag therefore live in a small tensor in shared memory, which forked,
spawned and forkserver workers all map; so do per-worker counters of skipped
samples, so the training process can report them.

Only DataLoader workers share it with the process that made it. A Stream that reaches
another training process (Lightning's ``ddp_spawn`` pickles the module, ``ddp_fork``
forks the parent) gets its own copy there on first use: sharing one tensor between
ranks would give every rank the first rank's place in the world.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch
import torch.utils.data

from ..readers.timing import spent
from .distributed import rank_and_world

log = logging.getLogger("mmloader")

_EPOCH, _RANK, _WORLD, _RESUMING = range(4)
_SKIP_SLOTS = 257  # slot 0: this process (thread backend); slot w + 1: DataLoader worker w


class SharedControl:
    """Epoch, (rank, world), resume flag and skip counters, visible to every worker.

    >>> c = SharedControl(); c.epoch = 3; c.epoch
    3
    """

    def __init__(self):
        self._tensor = torch.zeros(4 + _SKIP_SLOTS, dtype=torch.int64).share_memory_()
        # per slot (as the skip counters): seconds reading, decoding, collating; batches built
        self._stages = torch.zeros(_SKIP_SLOTS, 4, dtype=torch.float64).share_memory_()
        self._lock = threading.Lock()
        self._owner = os.getpid()

    def __getstate__(self) -> dict:
        return {"_tensor": self._tensor, "_stages": self._stages, "_owner": self._owner}

    def __setstate__(self, state: dict) -> None:
        self._tensor, self._stages, self._owner = state["_tensor"], state["_stages"], state["_owner"]
        self._lock = threading.Lock()

    @property
    def _t(self) -> torch.Tensor:
        if self._owner != os.getpid() and torch.utils.data.get_worker_info() is None:
            # Another training process (not a DataLoader worker of ours): its own state from now
            # on, with its place in the world still to be found.
            self._tensor = self._tensor.clone().share_memory_()
            self._tensor[_RANK] = self._tensor[_WORLD] = 0
            self._tensor[4:] = 0
            self._stages = torch.zeros_like(self._stages).share_memory_()
            self._owner = os.getpid()
        return self._tensor

    @property
    def epoch(self) -> int:
        return int(self._t[_EPOCH])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._t[_EPOCH] = int(value)

    @property
    def resuming(self) -> bool:
        return bool(self._t[_RESUMING])

    @resuming.setter
    def resuming(self, value: bool) -> None:
        self._t[_RESUMING] = int(bool(value))

    def set_world(self, rank: int, world: int) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world {world}")
        self._t[_RANK], self._t[_WORLD] = rank, world

    def world(self, group: Any = None) -> tuple[int, int]:
        """(rank, world): fixed on first use from ``group`` (a ProcessGroup), else
        ``torch.distributed`` or the environment."""
        t = self._t
        if int(t[_WORLD]) == 0:
            self.set_world(*rank_and_world(group))
        return int(t[_RANK]), int(t[_WORLD])

    def skip(self, what: str, error: Exception) -> None:
        """Count and log one sample skipped under ``on_error="skip"`` (in whichever worker
        process or thread this runs); ``what`` says what became of it."""
        info = torch.utils.data.get_worker_info()
        self.count_skip(info.id if info is not None else None)
        log.warning("skipping %s: %s", what, error)

    def count_skip(self, worker: int | None) -> None:
        """One more skipped sample, counted by the worker process ``worker`` (None: this process).
        Each slot has one writing process; threads of one process take the lock."""
        slot = 4 + (0 if worker is None else 1 + worker % (_SKIP_SLOTS - 1))
        with self._lock:
            self._t[slot] += 1

    @property
    def skipped(self) -> int:
        return int(self._t[4:].sum())

    def add_stage_times(self, read: float, decode: float, collate: float) -> None:
        """One batch built here (a worker process, or a thread of this one) and its seconds per stage."""
        info = torch.utils.data.get_worker_info()
        slot = 0 if info is None else 1 + info.id % (_SKIP_SLOTS - 1)
        _ = self._t  # (another training process: its own counters first)
        row = self._stages.numpy()[slot]  # (a view of the shared memory: no tensor made per batch)
        with self._lock:
            row[0] += read
            row[1] += decode
            row[2] += collate
            row[3] += 1.0

    def batch_clock(self) -> BatchClock:
        """A clock for one batch this thread starts building now (count it with ``done()``)."""
        return BatchClock(self)

    def stage_times(self) -> list[float]:
        """Seconds reading, decoding and collating, and batches built, summed over the builders."""
        _ = self._t
        return self._stages.sum(dim=0).tolist()


class BatchClock:
    """One batch built in this thread: its reading and collating as timed inside it
    (:mod:`mmloader.readers.timing`), the rest of the time as decoding, counted into the stage
    counters by :meth:`done` (a batch that fails or is not made is never counted)."""

    def __init__(self, control: SharedControl):
        self.control = control
        self.started, self.read, self.collated = time.perf_counter(), spent("read"), spent("collate")

    def done(self) -> None:
        read, collated = spent("read") - self.read, spent("collate") - self.collated
        self.control.add_stage_times(read, time.perf_counter() - self.started - read - collated, collated)


class Controlled:
    """What a stream's :class:`SharedControl` gives the loaders, written once for every kind of
    stream: the epoch, the skip count and the place in the world (from ``group``)."""

    control: SharedControl
    group: Any

    @property
    def epoch(self) -> int:
        return self.control.epoch

    @property
    def skipped(self) -> int:
        """Samples skipped so far under ``on_error="skip"``, by every worker (process or thread)."""
        return self.control.skipped

    def set_world(self, rank: int, world: int) -> None:
        """Fix (rank, world); by default they are detected at first use (from ``group``)."""
        self.control.set_world(rank, world)

    def where(self) -> tuple[int, int]:
        """(rank, world) of this stream's data-parallel group, fixed on first use."""
        return self.control.world(self.group)

    def __getstate__(self) -> dict:
        # A process group cannot cross to worker processes; they read (rank, world) from the
        # shared control, which the training process fixes before starting them.
        state = self.__dict__.copy()
        state["group"] = None
        return state
