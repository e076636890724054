"""One reader's slice of a live source, read in a thread, on demand, with bounded waits.

The thread is what makes waiting bounded: a factory call or a generator's ``next()`` cannot be
interrupted, but waiting for them can stop after ``timeout``. What the thread reads is what
batches ask for: a source that cannot say where it is (a queue) is never read ahead, since
samples read ahead are lost when a pass ends; one that can (``state_dict()``) is read up to
``buffer`` samples ahead, since the next pass reopens it at the last delivered position anyway.
Either way memory stays bounded when the producer is faster than training.

Each sample carries the slice's position just after it, ``{"position": state_dict(), "count":
samples of the stream read}``, so a batch's position is its last sample's. Batches take their
samples in the order they were planned (their ``ticket``), whichever thread builds them.
"""

from __future__ import annotations

import collections
import copy
import logging
import threading
import time
import types
from typing import Any, Callable, Iterable, NamedTuple

from ..errors import LiveSourceError

log = logging.getLogger("mmloader")

_POLL_S = 0.1  # how often a waiting thread checks that the reader was closed
_CLOSE_WAIT_S = 0.2  # how long closing waits for the thread to leave the source


class Taken(NamedTuple):
    """What :meth:`Fetcher.take` got: the samples, the slice's position after the last of them
    (None if its source cannot say), and why it got fewer than asked (``"ended"``/``"stalled"``) or None."""

    samples: list
    state: Any
    short: str | None


def checkpointable(iterable: Any) -> bool:
    """Whether ``iterable`` can say where it is and be put back there."""
    return callable(getattr(iterable, "state_dict", None)) and callable(getattr(iterable, "load_state_dict", None))


class Fetcher:
    """Reads one slice in a daemon thread; :meth:`take` waits for its samples, boundedly.

    Args:
        open: makes the slice's iterable (the live source's factory call), in the thread.
        where: how errors and logs name this reader (source name, rank, reader).
        buffer: samples read ahead at most, for a source that can say where it is.
        deal: ``(slot, slots)``: keep sample ``i`` of the stream only when ``i % slots == slot``
            (``split="deal"``); ``(0, 1)`` keeps all.
        saved: the slice's position to put the iterable back at (from an earlier pass or a
            checkpoint), or None to start where the source is.
        restarts: the slice delivered before without a position: warn if the iterable is a plain
            generator, which starts over.
    """

    def __init__(
        self,
        open: Callable[[], Iterable[Any]],
        where: str,
        buffer: int,
        deal: tuple[int, int] = (0, 1),
        saved: dict | None = None,
        restarts: bool = False,
    ):
        self.where, self.deal, self.buffer = where, deal, buffer
        self._open, self._saved, self._restarts = open, saved, restarts
        self._items: collections.deque = collections.deque()
        self._wanted = 0  # samples asked for by take() and not yet received
        self._served = 0  # tickets served: batches take their samples in planning order
        self._final: tuple | None = None  # ("end",) or ("error", exception), once reached
        self.finished = False  # the source ended, failed or stalled: plan no further batch
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"mmloader-live {where}")
        self._thread.start()

    # -- the reading thread ------------------------------------------------------
    def _run(self) -> None:
        try:
            iterable = self._open()
            tracks_state = checkpointable(iterable)
            count = 0
            if self._saved is not None:
                if not tracks_state:
                    raise LiveSourceError(
                        "a position was saved for this slice, but its iterable has no load_state_dict()"
                    )
                iterable.load_state_dict(copy.deepcopy(self._saved["position"]))  # type: ignore[attr-defined]
                count = int(self._saved.get("count", 0))
            elif self._restarts and isinstance(iterable, types.GeneratorType):
                log.warning(
                    "%s: the factory returned a generator without state_dict(), so each pass starts it "
                    "over and its samples repeat; give the iterable state_dict()/load_state_dict() (a "
                    "counter) or read from something that keeps its own position (a queue, a server)",
                    self.where,
                )
            ahead = self.buffer if tracks_state else 0
            slot, slots = self.deal
            iterator = iter(iterable)
            while True:
                with self._cond:
                    while not self._stopped and len(self._items) >= self._wanted + ahead:
                        self._cond.wait(_POLL_S)
                    if self._stopped:
                        return
                try:
                    sample = next(iterator)
                except StopIteration:
                    self._push(("end",))
                    return
                i, count = count, count + 1
                if i % slots != slot:
                    continue
                state = None
                if tracks_state:
                    state = {"position": copy.deepcopy(iterable.state_dict()), "count": count}  # type: ignore[attr-defined]
                self._push(("sample", sample, state))
        except BaseException as e:  # delivered to the consumer, raised there with the source's name
            self._push(("error", e))

    def _push(self, entry: tuple) -> None:
        with self._cond:
            if not self._stopped:
                self._items.append(entry)
                self._cond.notify_all()

    # -- the consumer ------------------------------------------------------------
    def take(self, n: int, timeout: float, on_stall: str = "end", ticket: int | None = None) -> Taken:
        """Up to ``n`` samples, waiting at most ``timeout`` seconds for each; with ``ticket``,
        after the takes of every earlier ticket.

        Raises:
            LiveSourceError: the source (or its factory) raised, chained; or it stalled with
                ``on_stall="raise"``.
        """
        with self._cond:
            while ticket is not None and self._served < ticket and not self._stopped:
                self._cond.wait(_POLL_S)
            try:
                return self._take(n, timeout, on_stall)
            finally:
                if ticket is not None:
                    self._served = max(self._served, ticket + 1)
                    self._cond.notify_all()

    def _take(self, n: int, timeout: float, on_stall: str) -> Taken:  # with the lock held
        samples: list = []
        state = None
        self._wanted += n
        self._cond.notify_all()
        try:
            deadline = time.monotonic() + timeout
            while len(samples) < n:
                if self._items:
                    entry = self._items.popleft()
                elif self._final is not None:
                    entry = self._final
                elif self._stopped:  # closed: nothing more comes
                    self.finished = True
                    return Taken(samples, state, "ended")
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.finished = True
                        if on_stall == "raise":
                            raise LiveSourceError(
                                f"{self.where}: no sample for {timeout:g} s (timeout=); on_stall='end' ends the pass instead"
                            )
                        return Taken(samples, state, "stalled")
                    self._cond.wait(min(left, _POLL_S))
                    continue
                if entry[0] == "sample":
                    samples.append(entry[1])
                    state = entry[2]
                    self._wanted -= 1
                    deadline = time.monotonic() + timeout
                    continue
                self._final, self.finished = entry, True
                if entry[0] == "end":
                    return Taken(samples, state, "ended")
                error = entry[1]
                if isinstance(error, LiveSourceError):
                    raise LiveSourceError(f"{self.where}: {error}") from error
                raise LiveSourceError(f"{self.where} raised {type(error).__name__}: {error}") from error
            return Taken(samples, state, None)
        finally:
            self._wanted -= n - len(samples)  # what was not received is no longer asked for

    def close(self) -> None:
        """Stop reading: the thread ends at the source's next sample (a source blocked for good
        keeps its daemon thread until the process ends); a take waiting now returns."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(_CLOSE_WAIT_S)
