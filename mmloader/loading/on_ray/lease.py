"""A job's builders live as long as the job: a lease the job's ranks hold together.

The builders are detached actors (no rank owns them: the rank that happened to create them can
finish, fail or be preempted while the others read on). A detached :class:`PoolLease` actor
beside them counts the ranks that use them: a rank joins, renews while its process lives
(:class:`_Renewer`, a daemon thread) and leaves when its process exits. Once no rank is left,
whether each left or none renewed within the lease (all killed), the lease removes the builders
and then itself, so a finished or dead job's builders free their CPUs within seconds, or the
lease, of its last rank.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import uuid
from typing import Any

from ...errors import MMLoaderError

LEASE_S = 60.0  # a rank that has not renewed for this long is taken for gone
JOIN_S = 30.0  # how long a join may wait for a lease that is releasing to be gone
MEMBER = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this process, in every lease


class PoolLease:
    """The ranks of one job that use its builders (``builder_names``); the first rank to join set
    how many builders there are (``count``) and how long a rank may go without renewing."""

    def __init__(self, builder_names: list[str], namespace: str, lease_s: float):
        self._names, self._namespace, self._lease_s = builder_names, namespace, lease_s
        self._members: dict[str, float] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._born = time.monotonic()
        self._joined = False  # (a new or restarted lease waits one lease for its ranks to join or renew)
        self._wake = threading.Event()
        threading.Thread(target=self._watch, name="mmloader-lease", daemon=True).start()

    def join(self, member: str) -> tuple[int, float] | None:
        """(builders, lease in seconds), or None while this lease is releasing (join anew)."""
        return (len(self._names), self._lease_s) if self.renew(member) else None

    def renew(self, member: str) -> bool:
        """False once released: the builders are gone (or going)."""
        with self._lock:
            if not self._closed:
                self._members[member] = time.monotonic()
                self._joined = True
            return not self._closed

    def leave(self, member: str) -> None:
        """``member`` is done; the last one to leave releases the builders now (a rank joining
        meanwhile waits for the release and makes the job anew)."""
        with self._lock:
            self._members.pop(member, None)
            if not self._members and self._joined:  # (a restarted lease waits for the others' renewals)
                self._closed = True
        self._wake.set()

    def _watch(self) -> None:
        while not self._closing():
            self._wake.wait(min(1.0, self._lease_s / 4))
        self._release()

    def _closing(self) -> bool:
        """Whether to release: members not renewed within the lease dropped, none left (a new or
        restarted lease waits one lease for its ranks to join or renew)."""
        with self._lock:
            if not self._closed:
                now = time.monotonic()
                for member, renewed in list(self._members.items()):
                    if now - renewed > self._lease_s:
                        del self._members[member]
                if not self._members and (self._joined or now - self._born >= self._lease_s):
                    self._closed = True
            return self._closed

    def _release(self) -> None:
        """The builders, then this lease: each name freed before the next rank may reuse it."""
        import ray

        for name in self._names:
            try:
                ray.kill(ray.get_actor(name, namespace=self._namespace), no_restart=True)
            except ValueError:  # never started, or already gone
                pass
        deadline = time.monotonic() + 30
        for name in self._names:
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(name, namespace=self._namespace)
                except ValueError:
                    break
                time.sleep(0.1)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def join(ray: Any, job: str, builder_names: list[str], namespace: str) -> tuple[Any, int]:
    """Join ``job``'s lease (made by the first rank, with ``builder_names``) and keep it renewed
    while this process lives: (the lease, how many builders the job has)."""
    remote = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=8)(PoolLease)
    deadline = time.monotonic() + JOIN_S
    while True:
        lease = remote.options(
            name=f"{job}-lease", namespace=namespace, lifetime="detached", get_if_exists=True
        ).remote(builder_names, namespace, LEASE_S)
        try:
            joined = ray.get(lease.join.remote(MEMBER), timeout=max(1.0, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):  # released as we asked
            joined = None  # (its name is about to be free), or still releasing
        if joined is not None:
            count, lease_s = joined
            _RENEWER.hold(ray, job, lease, lease_s)
            return lease, count
        if time.monotonic() > deadline:
            raise MMLoaderError(
                f"backend='ray': job {job!r}: its builders' lease (actor {job}-lease in namespace "
                f"{namespace!r}) did not answer within {JOIN_S:.0f} s; is it being removed (`ray list actors`)? "
                "Retry, or pass another job="
            )
        time.sleep(0.2)


def renewed(ray: Any, lease: Any) -> bool:
    """Whether ``lease`` still holds: False only once it is known released (it said so, or it
    ended as it does after removing the builders; join again). A lease that does not answer,
    as when the cluster's head is gone, counts as held: the builders' loss is then counted as
    any other, and said once it repeats, before Ray gives up on the cluster (a join would wait
    on the head with no deadline)."""
    try:
        return bool(ray.get(lease.renew.remote(MEMBER), timeout=10))
    except ray.exceptions.ActorDiedError:
        return False
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return True


def leave(ray: Any, job: str, lease: Any) -> None:
    """This process leaves ``job``'s lease now (its builders go if no other rank holds them)."""
    _RENEWER.drop(job)
    try:
        ray.get(lease.leave.remote(MEMBER), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        pass  # gone or unreachable: it lapses without this process's renewals


class _Renewer:
    """This process's leases, renewed by one daemon thread (each within a quarter of its lease)
    and left at exit. Leases of an earlier Ray connection are dropped, to lapse: a process that
    connected again does not feed its builders (:meth:`RayLoader.pool` says why)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Any, float, tuple]] = {}  # job -> (lease, lease_s, connection)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, ray: Any, job: str, lease: Any, lease_s: float) -> None:
        with self._lock:
            self._held[job] = (lease, lease_s, connection(ray))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, args=(ray,), name="mmloader-renew", daemon=True)
                self._thread.start()
                atexit.register(self._leave_all, ray)  # (after Ray's own: runs before its shutdown)

    def drop(self, job: str) -> None:
        with self._lock:
            self._held.pop(job, None)

    def _current(self, ray: Any) -> list[Any]:
        with self._lock:
            if not ray.is_initialized():
                return []
            now = connection(ray)
            for job, (_lease, _s, held_on) in list(self._held.items()):
                if held_on != now:
                    del self._held[job]
            return [lease for lease, _s, _c in self._held.values()]

    def _period(self) -> float:
        with self._lock:
            return min([s for _l, s, _c in self._held.values()] or [LEASE_S]) / 4

    def _run(self, ray: Any) -> None:
        while True:
            time.sleep(self._period())
            try:
                refs = [lease.renew.remote(MEMBER) for lease in self._current(ray)]
                if refs:
                    ray.wait(refs, num_returns=len(refs), timeout=10)
                    for ref in refs:
                        try:
                            ray.get(ref, timeout=0)
                        except Exception:  # noqa: BLE001 - a lease gone: the next pass joins anew
                            pass
            except Exception:  # noqa: BLE001 - Ray shutting down or reconnecting: renew next time
                pass

    def _leave_all(self, ray: Any) -> None:
        try:
            refs = [lease.leave.remote(MEMBER) for lease in self._current(ray)]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=5)
        except Exception:  # noqa: BLE001 - at exit: the lease lapses on its own
            pass


_RENEWER = _Renewer()


def connection(ray: Any) -> tuple:
    """Which connection to Ray this process holds: (GCS address, job id)."""
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_job_id()
