"""What every stream gives the loaders: :class:`StreamLike`.

A stored :class:`~mmloader.loading.stream.Stream` (an epoch plan over stored samples) and a
:class:`~mmloader.live_sources.stream.LiveStream` (a live source streamed by steps) both
implement it; the loaders, the framework adapters and ``GPUDecode`` take any stream that does,
and know no kind of stream by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .control import SharedControl


@dataclass
class PassFlags:
    """What was asked of a stream since its last pass began; the loaders read and clear it when
    the next pass begins (:mod:`mmloader.loading.resumable`)."""

    epoch_chosen: bool = False  # set_epoch was called
    resume_fresh: bool = False  # load_state_dict was called


@runtime_checkable
class StreamLike(Protocol):
    """A stream of batches for one rank, resumable, built by zero-argument tasks."""

    #: Whether each pass starts its readers afresh from where the training process got to (a
    #: live source): worker processes kept from an earlier pass would not know where that is.
    restarts_each_pass: bool
    #: How long a batch may rightly wait for its data (a live source's per-sample timeout), in s.
    longest_wait_s: float
    batch_size: int | None
    seed_workers: bool
    #: The state shared with worker processes (epoch, place in the world, resume flag).
    control: SharedControl
    #: A pass's bookkeeping: ``set_epoch`` / ``load_state_dict`` was called since it began.
    pass_flags: PassFlags

    @property
    def epoch(self) -> int: ...

    def where(self) -> tuple[int, int]:
        """(rank, world), fixed on first use."""
        ...

    def drop_resume(self) -> None: ...

    @property
    def datasets(self) -> list[Any]:
        """The datasets the batches read from."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def remaining(self) -> int: ...

    def progress(self, batches_seen: int, epoch_done: bool = False, next_epoch: int | None = None) -> dict: ...

    def check_resume(self, state: dict) -> list[tuple[int, int]]: ...

    def resume(self, state: dict) -> None: ...

    def deliver(self, batches: Iterator[Any]) -> Iterator[Any]: ...

    def python_work(self) -> list[str]: ...

    def batch_tasks(
        self, worker: int = 0, workers: int = 1, seed_globals: bool = False, readers: int | None = None
    ) -> Iterator[Callable[[], Any]]:
        """The batches of worker ``worker`` of ``workers`` as tasks, in delivery order;
        ``readers``: how many builders read at once (a live source splits its slices among
        them; a stored plan does not depend on it)."""
        ...


def check_stream(stream: Any) -> None:
    """A TypeError, naming what was given, for anything that is no stream."""
    if not isinstance(stream, StreamLike):
        raise TypeError(f"loader() needs an mmloader.Stream or LiveStream, got {type(stream).__name__}")
