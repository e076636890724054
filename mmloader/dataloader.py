"""``mmloader.loader``: a loader set up right for a :class:`Stream`, with mid-epoch resume."""
from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.utils.data

from .distributed import available_cpus, local_world_size
from .stream import Stream
from .threaded import ThreadLoader


def default_num_workers() -> int:
    """CPUs available to this process divided by the ranks on this node (never more than CPUs)."""
    return max(1, available_cpus() // max(local_world_size(), 1))


class _Resumable:
    """Counts delivered batches; ``state_dict``/``load_state_dict`` resume by arithmetic."""

    stream: Stream
    batches_seen = 0

    def set_epoch(self, epoch: int) -> None:
        self.batches_seen = 0
        self.stream.set_epoch(epoch)

    def _counted(self, iterator) -> Iterator[Any]:
        for batch in iterator:
            self.batches_seen += 1
            yield batch
        # A full pass ended: the next pass (same epoch or next) starts from the beginning.
        self.batches_seen = 0
        self.stream.end_of_pass()

    def state_dict(self) -> dict:
        """Where this rank is: epoch plus delivered batches (and the plan geometry to check against)."""
        return self.stream.progress(self.batches_seen)

    def load_state_dict(self, state: dict) -> None:
        """Resume mid-epoch at exactly the next unseen batch (also on another world size or worker count)."""
        self.stream.resume(state)
        self.batches_seen = 0


class Loader(_Resumable, torch.utils.data.DataLoader):
    """A :class:`torch.utils.data.DataLoader` over a :class:`Stream` that knows where it is.

    ``state_dict()`` records the epoch and how many batches this rank has
    delivered; ``load_state_dict()`` resumes at exactly the next unseen batch by
    arithmetic (nothing is replayed), also onto another world size or worker count.

    >>> loader = mmloader.loader(stream)                         # doctest: +SKIP
    >>> for epoch in range(start_epoch, 100):                    # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         step(batch); ckpt["loader"] = loader.state_dict()
    """

    def __init__(self, stream: Stream, num_workers: int | None = None, *, pin_memory: bool | None = None,
                 persistent_workers: bool | None = None, prefetch_factor: int | None = None, **kwargs: Any):
        if not isinstance(stream, Stream):
            raise TypeError(f"loader() needs an mmloader.Stream, got {type(stream).__name__}")
        workers = default_num_workers() if num_workers is None else num_workers
        if persistent_workers is None:
            persistent_workers = workers > 0
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        if workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        super().__init__(stream, batch_size=None, num_workers=workers, pin_memory=pin_memory,
                         persistent_workers=persistent_workers and workers > 0,
                         prefetch_factor=prefetch_factor if workers > 0 else None, **kwargs)
        self.stream = stream
        self.batches_seen = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.stream._where()  # fix rank/world in the main process, before workers start
        iterator = super().__iter__()
        # Persistent workers reuse one iterator, which remembers the length of the pass it was
        # made for; a resumed (shorter) pass must not make later full passes look too long.
        if hasattr(iterator, "_IterableDataset_len_called"):
            iterator._IterableDataset_len_called = len(self.stream)
        return self._counted(iterator)

    def load_state_dict(self, state: dict) -> None:
        """Resume mid-epoch. Persistent workers restart once so they see the new plan."""
        super().load_state_dict(state)
        if getattr(self, "_iterator", None) is not None:
            self._iterator._shutdown_workers()
            self._iterator = None


class ThreadedLoader(_Resumable, ThreadLoader):
    """The thread backend (:class:`mmloader.threaded.ThreadLoader`) with the same resume API."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._counted(ThreadLoader.__iter__(self))


def loader(stream: Stream, num_workers: int | None = None, *, backend: str = "process",
           **kwargs: Any) -> Loader | ThreadedLoader:
    """A loader for ``stream``: workers from the CPUs per local rank, pinned memory with CUDA,
    persistent workers, worker RNGs seeded from (seed, epoch, rank, worker).

    ``backend="process"`` (default) is a :class:`torch.utils.data.DataLoader` with worker
    processes; ``backend="thread"`` builds batches in threads of this process — faster when
    decoding dominates and cores are few (no pickling, no shared-memory copies).

    >>> for batch in mmloader.loader(mmloader.Stream(ds, batch_size=32)): ...   # doctest: +SKIP
    """
    if backend == "thread":
        if not isinstance(stream, Stream):
            raise TypeError(f"loader() needs an mmloader.Stream, got {type(stream).__name__}")
        workers = default_num_workers() if num_workers is None else num_workers
        pin = kwargs.pop("pin_memory", None)
        prefetch = kwargs.pop("prefetch_factor", None) or 2
        producers = kwargs.pop("producers", None)
        if kwargs:
            raise TypeError(f"backend='thread' does not take {sorted(kwargs)}")
        return ThreadedLoader(stream, workers, prefetch, torch.cuda.is_available() if pin is None else pin,
                              producers)
    if backend != "process":
        raise ValueError(f"backend={backend!r}: expected 'process' or 'thread'")
    return Loader(stream, num_workers=num_workers, **kwargs)
