"""A live source's iterable over a ``multiprocessing`` queue fed by a producer process."""

from __future__ import annotations

import os
import queue as queue_module
from typing import Any, Iterator

from ..errors import LiveSourceError


def from_queue(q: Any, *, producer: Any = None, end: Any = None, poll_s: float = 0.2) -> Iterator[Any]:
    """The items of ``q`` until ``end`` arrives; a dead producer is an error, not a wait.

    >>> source = mmloader.live(lambda *_: mmloader.from_queue(q, producer=proc))   # doctest: +SKIP

    Args:
        q: a ``multiprocessing`` (or ``queue``) queue the producer puts samples into.
        producer: the producing process (a ``multiprocessing.Process`` or its pid): while the queue
            is empty, its death raises :class:`mmloader.errors.LiveSourceError` within ``poll_s``.
        end: the item that marks the end of the stream (default None).
        poll_s: how often an empty queue's producer is checked.

    Raises:
        LiveSourceError: the producer exited (its pid and exit code in the message).
    """
    pid = producer if isinstance(producer, int) else getattr(producer, "pid", None)
    while True:
        try:
            item = q.get(timeout=poll_s)
        except queue_module.Empty:
            if producer is not None:
                gone = _exited(producer, pid)
                if gone is not None:
                    raise LiveSourceError(f"the producer process (pid {pid}) {gone}, and its queue is empty") from None
            continue
        if item is end or (end is None and item is None):
            return
        yield item


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
            state = f.read().rsplit(")", 1)[1].split()[0]
        return "exited" if state in ("Z", "X") else None  # a zombie: ended, not yet reaped
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
