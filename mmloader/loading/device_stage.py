"""What every device-side stage shares: the batch after the one the caller holds is prepared
ahead (on a side CUDA stream), while the state describes what the caller received.

A stage wraps a loader and turns each batch with :meth:`DeviceStage._process`
(:class:`~.gpu.GPUDecode` decodes JPEGs there, :class:`~.to_device.ToDevice` moves and
normalises). Batch *n + 1* is processed while the model trains on batch *n*; ``state_dict()``
describes what the caller has received, not what was read ahead, so a resume never skips the
batch held. Without CUDA the same read-ahead runs on the CPU, so its bookkeeping is tested
anywhere.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator

import torch


class DeviceStage:
    """A loader's batches, each turned by :meth:`_process` on ``device``, one batch ahead.

    Args:
        loader: an mmloader loader (or any iterable of dict batches with ``state_dict``).
        device: where batches go; default CUDA when available, else the CPU.
    """

    STAT = "device"  # stats(): this stage's own time per batch, under <STAT>_ms_per_batch

    def __init__(self, loader: Iterable, device: str | torch.device | None = None):
        self.loader = loader
        self.device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available here (leave device out: the CPU then)")
        self._side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._held_state: Any = None  # the loader's state when the batch the caller holds was taken
        self._before_held: Any = None  # ... and when the one before it was (snapshot(before_last=True))
        self._left_early = False  # the caller stopped taking batches before the pass ended
        self._working = [0, 0.0]  # batches processed, seconds of this process's time it took (stats)

    def _process(self, batch: dict) -> dict:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> Any:  # epoch, stream... of the loader
        if attr in ("loader", "__setstate__", "_held_state", "_left_early"):
            raise AttributeError(attr)
        return getattr(self.loader, attr)

    # -- resume: what the caller received, not what was read ahead ------------------------------
    def state_dict(self) -> dict:
        """The loader's state as of the last batch handed to the caller (the batch decoded ahead
        is not counted: resuming from this state delivers it again)."""
        held = self._held_state
        if held is None:
            return self.loader.state_dict()  # type: ignore[attr-defined]
        return held() if callable(held) else held

    def load_state_dict(self, state: dict) -> None:
        """Resume the loader at ``state`` (a :meth:`state_dict`)."""
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]
        if getattr(self.loader, "_pending", None) is None:
            self._held_state, self._left_early = None, False

    def set_epoch(self, epoch: int) -> None:
        """Select the loader's epoch (see :meth:`mmloader.Loader.set_epoch`)."""
        held = self._held_nodes() if self._left_early else None
        self.loader.set_epoch(epoch)  # type: ignore[attr-defined]
        if getattr(self.loader, "_pending", None) is None:  # applied now, not when the pass ends
            self._rewind_nodes(held)  # (a batch read ahead, never handed over, went through them)
            self._held_state, self._left_early = None, False

    @property
    def sampler(self) -> Any:
        """Where Lightning and accelerate call ``set_epoch``: it reaches this wrapper (and the loader)."""
        from .resumable import EpochSampler

        return EpochSampler(self)  # type: ignore[arg-type]

    def snapshot(self, before_last: bool = False) -> Any:
        """What a stage wrapping this one records (as this one records its loader's): the state
        as of the last batch handed over, or the one before it; never counting the read-ahead."""
        return self._before_held if before_last else self._held_state

    def _snapshot(self, before_last: bool = False) -> Any:
        """The loader's state right now (``before_last``: as it was before the batch it last
        delivered), cheaply: mmloader's loaders give a deferred state."""
        snap = getattr(self.loader, "snapshot", None)
        if snap is not None:
            return snap(before_last=before_last)
        if before_last:
            return None
        state = getattr(self.loader, "state_dict", None)
        return state() if state is not None else None

    def __iter__(self) -> Iterator[dict]:
        # Batch n+1 is decoded (on the side stream with CUDA) while the caller works on batch n.
        # The same read-ahead runs on the CPU, so its bookkeeping is tested without a GPU.
        if self._left_early and self._held_state is not None and getattr(self.loader, "_pending", None) is None:
            # The last pass was left early: continue after the batch the caller last received,
            # not after the one decoded ahead (the loader would count that one as delivered).
            self.loader.load_state_dict(self.state_dict())  # type: ignore[attr-defined]
        self._held_state, self._left_early = None, True
        pending = None
        batches = iter(self.loader)
        try:
            for batch in batches:
                if pending is None and self._held_state is None:  # the pass's start: nothing handed over yet
                    self._held_state = self._snapshot(before_last=True)
                state = self._snapshot()  # taken before the next batch is read ahead
                with torch.cuda.stream(self._side) if self._side is not None else contextlib.nullcontext():
                    began = time.perf_counter()
                    ready = self._process(batch)
                    self._working[0] += 1
                    self._working[1] += time.perf_counter() - began
                    event = None
                    if self._side is not None:
                        event = torch.cuda.Event()
                        event.record(self._side)
                if pending is not None:
                    yield self._handoff(*pending)
                pending = (ready, event, state)
            if pending is not None:  # the last batch: nothing is read ahead now, the loader's own state holds
                yield self._handoff(pending[0], pending[1], None)
            self._left_early = False
        finally:
            waiting = getattr(self.loader, "_pending", None)
            held = self._held_nodes() if self._left_early else None
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the loader's pass ends now: a set_epoch/load_state_dict made during it applies
            if (waiting is None or waiting[0] != "state") and getattr(self.loader, "_active", None) is None:
                # the batch read ahead went through the loader's nodes: they go back to the batch held
                # (a set_epoch next would not rewind them; a state loaded during the pass sets its own;
                # a newer pass under way is left alone)
                self._rewind_nodes(held)
            if waiting is not None:  # ...so what this pass held no longer describes where the next one starts
                self._held_state, self._left_early = None, False

    def _held_nodes(self) -> Any:
        """The loader's nodes' states as of the batch the caller holds (None: no nodes, or nothing held)."""
        held = self._held_state
        return held.get("nodes") if isinstance(held, dict) else getattr(held, "nodes", None)

    def _rewind_nodes(self, saved: Any) -> None:
        """Put the loader's nodes back to ``saved`` (a state's ``"nodes"``; None: it has none)."""
        rewind = getattr(self.loader, "_rewind_nodes", None)
        if saved is not None and rewind is not None:
            rewind(saved)

    def stats(self, reset: bool = False) -> dict[str, float]:
        """The loader's :meth:`stats`, with the work done here (``<STAT>_ms_per_batch``, the
        training process's own time: on a GPU mostly queuing the work) moved from the loop's
        compute to its wait for data, where the loop spends it."""
        figures = self.loader.stats(reset)  # type: ignore[attr-defined]
        batches, seconds = self._working
        if reset:
            self._working = [0, 0.0]
        if batches:
            own = 1e3 * seconds / batches
            wait, compute = figures["wait_ms_per_batch"], figures["compute_ms_per_batch"]
            figures[f"{self.STAT}_ms_per_batch"] = own
            figures["compute_ms_per_batch"] = max(0.0, compute - own)
            figures["wait_ms_per_batch"] = wait + own
            figures["wait_fraction"] = min(1.0, (wait + own) / (wait + compute)) if wait + compute else 0.0
        return figures

    def _handoff(self, batch: dict, event: Any, state: Any) -> dict:
        self._before_held, self._held_state = self._held_state, state
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for value in _tensors(batch):  # their memory now belongs to the caller's stream
                if value.is_cuda:
                    value.record_stream(stream)
        return batch


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a batch, in its dicts (``__offsets__``, ``__present__``) and lists (images
    of several sizes) too: every one :class:`~.to_device.ToDevice` moves needs its stream recorded."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
