"""A live source's iterable over a ``multiprocessing`` queue fed by a producer process."""

from __future__ import annotations

import os
import queue as queue_module
import time
import weakref
from typing import Any, Iterable, Iterator

from ..errors import LiveSourceError


def from_queue(q: Any, *, producer: Any = None, end: Any = None, poll_s: float = 0.2) -> Iterable[Any]:
    """The items of ``q`` until ``end`` arrives; a dead producer is an error, not a wait.

    Several readers (ranks, workers, passes) may share one queue: each item goes to one of them.
    The ``end`` marker is put back for the others, so one ends the stream for every reader. The
    queue is polled without blocking in it: a reader whose process exits while waiting never
    leaves the queue's lock taken.

    >>> source = mmloader.live(lambda *_: mmloader.from_queue(q, producer=proc))   # doctest: +SKIP

    Args:
        q: a ``multiprocessing`` (or ``queue``) queue the producer puts samples into.
        producer: the producing process (a ``multiprocessing.Process`` or its pid): while the queue
            is empty, its death raises :class:`mmloader.errors.LiveSourceError` within ``poll_s``.
        end: the item that marks the end of the stream (default None).
        poll_s: how often an empty queue's producer is checked.

    Raises:
        LiveSourceError: the producer exited without ending the stream (its pid and exit code in
            the message, where this process can know it).
    """
    return QueueItems(q, producer, end, poll_s)


class QueueItems:
    """What :func:`from_queue` returns: the queue's items, as an iterable that keeps its position
    where the queue does (not a generator, which a live stream warns starts over each pass)."""

    def __init__(self, q: Any, producer: Any, end: Any, poll_s: float):
        self.q, self.producer, self.end, self.poll_s = q, producer, end, poll_s

    def __iter__(self) -> Iterator[Any]:
        return _items(self.q, self.producer, self.end, self.poll_s)


def _items(q: Any, producer: Any, end: Any, poll_s: float) -> Iterator[Any]:
    if q in _ENDED:  # this process saw the end already (and can put nothing back)
        return
    pid = producer if isinstance(producer, int) else getattr(producer, "pid", None)
    nap, checked = 0.001, time.monotonic()
    while True:
        try:
            if q in _ENDED:  # another reader in this process saw the end
                return
            item = q.get_nowait()
        except ValueError:  # closed by a reader here that saw the end
            if q in _ENDED:
                return
            raise
        except queue_module.Empty:
            now = time.monotonic()
            if producer is not None and now - checked >= poll_s:
                checked = now
                gone = _exited(producer, pid)
                if gone is not None and q.empty():
                    raise LiveSourceError(
                        f"the producer process (pid {pid}) {gone} without putting the end marker, and its queue is empty"
                    ) from None
            time.sleep(nap)
            nap = min(nap * 2, 0.01)
            continue
        nap = 0.001
        if item is end or (end is None and item is None):
            _put_back(q, item)
            return
        yield item


#: Queues whose end this process has seen (a later pass's reader here ends at once).
_ENDED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _put_back(q: Any, item: Any) -> None:
    """Put the end marker back for the other readers, then wait for it to be written: a
    ``multiprocessing`` queue writes from a feeder thread, which must not outlive this call (a
    fork while such a thread ends can hang the child), so this process closes its writing end."""
    try:
        q.put_nowait(item)
    except (queue_module.Full, ValueError):  # full only if the producer went on after its end
        pass
    try:
        _ENDED.add(q)  # (before closing: the other readers here then know why it is closed)
    except TypeError:  # not weakly referenceable: a later reader here waits for the marker again
        return
    close, join = getattr(q, "close", None), getattr(q, "join_thread", None)
    if close is not None and join is not None:
        close()
        join()


def _exited(producer: Any, pid: int | None) -> str | None:
    """How the producer ended ("exited with code 1", "was killed by signal 9"), or None while alive."""
    try:  # our own child: multiprocessing knows, and reaps it
        if not producer.is_alive():
            code = producer.exitcode
            return f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return None
    except (AttributeError, AssertionError, ValueError):  # not ours (e.g. read in a DataLoader worker)
        pass
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X"):
            return None
        if len(fields) > 49:  # a zombie (ended, not yet reaped) still says how: its wait status
            status = int(fields[49])
            return f"was killed by signal {status & 0x7F}" if status & 0x7F else f"exited with code {status >> 8}"
        return "exited"
    except FileNotFoundError:
        return "exited"
    except OSError:
        try:
            os.kill(pid, 0)
            return None
        except ProcessLookupError:
            return "exited"
        except PermissionError:
            return None
