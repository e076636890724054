"""A gate that ``fork()`` waits at until no LMDB call is in flight in another thread.

py-lmdb counts the calls each environment has in flight (they run without the GIL), and
closing an environment waits until that count is back to zero. A child forked while
another thread of the parent was inside such a call inherits the count but not the
thread, so the close that a forked child must do (an environment cannot be used across
``fork()``, and a path cannot be opened twice in one process) waited forever: a
DataLoader worker forked while the thread backend read a batch hung at start.

Each thread holds a lock of its own while it calls into LMDB (``with FORK_GATE.hold():``;
threads never wait for each other); a fork takes every thread's lock, so it waits for the
calls in flight and keeps new ones out until it is done. The locks are C locks taken and
released by the ``with`` statement itself, so a Ctrl-C caught around a read cannot leave
one counted as held (a Python counter could: it lost a decrement and every later fork
waited its timeout). The child starts with a fresh gate.

>>> with FORK_GATE.hold():                             # doctest: +SKIP
...     value = txn.get(key)
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("mmloader")

FORK_WAIT_S = 30.0  # a call still in flight after this is a stuck disk: fork anyway, and say so


class ForkGate:
    """One re-entrant lock per thread, held while the thread is inside an LMDB call (nested
    calls take it again); ``fork()`` takes them all."""

    def __init__(self) -> None:
        self._registry = threading.Lock()  # held by a fork from start to end: no thread registers meanwhile
        self._locks: dict[int, Any] = {}  # thread ident -> its lock
        self._local = threading.local()
        self._taken: list = []

    def hold(self):
        """This thread's lock (a C ``RLock``), to hold with ``with`` around a call into LMDB."""
        lock = getattr(self._local, "lock", None)
        if lock is None:
            lock = threading.RLock()
            with self._registry:
                self._locks[threading.get_ident()] = lock
            self._local.lock = lock
        return lock

    def before_fork(self) -> None:
        self._registry.acquire()
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in self._locks if i not in alive]:  # threads that ended
            del self._locks[ident]
        self._taken = []
        for lock in list(self._locks.values()):
            if lock.acquire(timeout=FORK_WAIT_S):  # this thread's own lock is re-entrant: taken at once
                self._taken.append(lock)
            else:
                log.warning(
                    "fork(): an LMDB read has been in flight for %.0f s; forking anyway "
                    "(the child may hang closing the environment)",
                    FORK_WAIT_S,
                )

    def after_fork_in_parent(self) -> None:
        taken, self._taken = self._taken, []
        for lock in taken:
            lock.release()
        self._registry.release()

    def after_fork_in_child(self) -> None:
        type(self).__init__(self)  # the parent's threads, and their calls, do not exist here


FORK_GATE = ForkGate()
os.register_at_fork(
    before=FORK_GATE.before_fork,
    after_in_parent=FORK_GATE.after_fork_in_parent,
    after_in_child=FORK_GATE.after_fork_in_child,
)
