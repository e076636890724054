"""One reader's slice of a live source, read ahead in a thread into a bounded buffer.

The thread is what makes waiting bounded: a generator's ``next()`` cannot be interrupted,
but waiting for the buffer can stop after ``timeout``. The buffer's size bounds memory when
the producer is faster than training (the thread then waits for room). A source that can
say where it is (``state_dict()``) is asked after each sample it yields, so each sample
carries the position just after it: a batch's state is its last sample's.
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import Any, Iterable, NamedTuple

from ..errors import LiveSourceError

_PUT_POLL_S = 0.1  # how often a thread waiting for room checks that it was stopped


class Taken(NamedTuple):
    """What :meth:`Fetcher.take` got: the samples, the source's state after the last of them
    (None if it cannot say), and why it got fewer than asked (``"ended"``/``"stalled"``) or None."""

    samples: list
    state: Any
    short: str | None


def checkpointable(iterable: Any) -> bool:
    """Whether ``iterable`` can say where it is and be put back there."""
    return callable(getattr(iterable, "state_dict", None)) and callable(getattr(iterable, "load_state_dict", None))


class Fetcher:
    """Reads ``iterable`` in a daemon thread; :meth:`take` waits for its samples, boundedly.

    Args:
        iterable: the slice's samples (from the live source's factory).
        where: how errors and logs name this reader (source name, rank, reader).
        buffer: samples read ahead at most.
        deal: ``(slot, slots)``: keep sample ``i`` only when ``i % slots == slot`` (the
            ``split="deal"`` of :func:`mmloader.live`); ``(0, 1)`` keeps all.
    """

    def __init__(self, iterable: Iterable[Any], where: str, buffer: int, deal: tuple[int, int] = (0, 1)):
        self.iterable, self.where, self.deal = iterable, where, deal
        self.tracks_state = checkpointable(iterable)
        self._queue: queue.Queue = queue.Queue(maxsize=buffer)
        self._stop = threading.Event()
        self._final: tuple | None = None  # ("end",) or ("error", exception): seen by the consumer
        self._lock = threading.Lock()  # take() may be called from several builder threads
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"mmloader-live {where}")
        self._thread.start()

    def _run(self) -> None:
        slot, slots = self.deal
        try:
            for i, sample in enumerate(self.iterable):
                if self._stop.is_set():
                    return
                if i % slots != slot:
                    continue
                state = copy.deepcopy(self.iterable.state_dict()) if self.tracks_state else None  # type: ignore[attr-defined]
                if not self._put(("sample", sample, state)):
                    return
            self._put(("end",))
        except BaseException as e:  # delivered to the consumer, raised there with the source's name
            self._put(("error", e))

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def take(self, n: int, timeout: float, on_stall: str = "end") -> Taken:
        """Up to ``n`` samples, waiting at most ``timeout`` seconds for each.

        Raises:
            LiveSourceError: the source raised (chained), or stalled with ``on_stall="raise"``.
        """
        samples: list = []
        state = None
        with self._lock:
            while len(samples) < n:
                if self._final is not None:
                    entry = self._final
                else:
                    closed = self._stop.is_set()  # closed: only what it had read ahead is left
                    try:
                        entry = self._queue.get(timeout=timeout) if not closed else self._queue.get_nowait()
                    except queue.Empty:
                        if closed:
                            return Taken(samples, state, "ended")
                        if on_stall == "raise":
                            raise LiveSourceError(
                                f"{self.where}: no sample for {timeout:g} s (timeout=); "
                                "on_stall='end' ends the pass instead"
                            ) from None
                        return Taken(samples, state, "stalled")
                kind = entry[0]
                if kind == "sample":
                    samples.append(entry[1])
                    state = entry[2]
                    continue
                self._final = entry
                if kind == "end":
                    return Taken(samples, state, "ended")
                error = entry[1]
                if isinstance(error, LiveSourceError):
                    raise LiveSourceError(f"{self.where}: {error}") from error
                raise LiveSourceError(f"{self.where} raised {type(error).__name__}: {error}") from error
        return Taken(samples, state, None)

    def close(self) -> None:
        """Stop reading: the thread ends at the source's next sample (a source blocked for good
        keeps its daemon thread until the process ends). What was read ahead stays for
        :meth:`take` (a batch still being built may need a replacement for a bad sample)."""
        self._stop.set()
