"""A gate that ``fork()`` waits at until no LMDB call is in flight in another thread.

py-lmdb counts the calls each environment has in flight (they run without the GIL), and
closing an environment waits until that count is back to zero. A child forked while
another thread of the parent was inside such a call inherits the count but not the
thread, so the close that a forked child must do (an environment cannot be used across
``fork()``, and a path cannot be opened twice in one process) waited forever: a
DataLoader worker forked while the thread backend read a batch hung at start.

Calls into LMDB run inside the gate (``with FORK_GATE:``, a counter, not a lock: threads
do not wait for each other); a fork waits until the count is zero and holds new calls
back until it is done. The child starts with a fresh gate.

>>> with FORK_GATE:                                   # doctest: +SKIP
...     value = txn.get(key)
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("mmloader")

FORK_WAIT_S = 30.0  # a call still in flight after this is a stuck disk: fork anyway, and say so


class ForkGate:
    """Counts the threads inside; ``fork()`` waits for zero and keeps new ones out until it is done.
    A thread already inside may enter again (nested calls) without waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inside = 0
        self._forks = 0  # forks waiting or under way (threads may fork at the same time)
        self._depth = threading.local()

    def __enter__(self) -> "ForkGate":
        depth = getattr(self._depth, "n", 0)
        if not depth:
            with self._lock:
                while self._forks:  # a fork is waiting for the calls in flight: do not add one
                    self._changed.wait()
                self._inside += 1
        self._depth.n = depth + 1
        return self

    def __exit__(self, *exc) -> None:
        depth = getattr(self._depth, "n", 0)
        if not depth:  # entered in the parent before a fork: this child's gate started empty
            return
        self._depth.n = depth - 1
        if depth == 1:
            with self._lock:
                self._inside -= 1
                if self._forks and not self._inside:
                    self._changed.notify_all()

    def before_fork(self) -> None:
        self._lock.acquire()  # held through the fork: no thread starts a call meanwhile
        self._forks += 1
        own = 1 if getattr(self._depth, "n", 0) else 0  # forking from inside a call: do not wait for it
        if not self._changed.wait_for(lambda: self._inside <= own, timeout=FORK_WAIT_S):
            log.warning("fork(): an LMDB read has been in flight for %.0f s; forking anyway "
                        "(the child may hang closing the environment)", FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        self._forks -= 1
        self._changed.notify_all()  # the threads that waited to start a call, another fork
        self._lock.release()

    def after_fork_in_child(self) -> None:
        self.__init__()  # the parent's threads, and their calls, do not exist here


FORK_GATE = ForkGate()
os.register_at_fork(before=FORK_GATE.before_fork, after_in_parent=FORK_GATE.after_fork_in_parent,
                    after_in_child=FORK_GATE.after_fork_in_child)
