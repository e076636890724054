"""Reaching a Ray cluster within a deadline, whatever Ray's own client does.

``ray.init`` can wait for good: an address whose port answers but is not Ray, a cluster whose
nodes listen on loopback only (Ray rewrites ``127.0.0.1`` into this machine's network address
and retries that), a local cluster that is shutting down. Its waits are in C++ and cannot be
interrupted, so the connect runs on a thread of its own (one per process: see ``_on_owner``),
abandoned at the deadline: the caller gets :class:`ClusterUnreachable` with the reason and the
remedy, and this process refuses later connects while the abandoned one still runs (it may yet
complete) rather than join a cluster half-way.

The loaders' Ray backend and ``mmloader convert --engine ray`` both connect here.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from ..errors import MMLoaderError

CONNECT_S = 60.0  # ray.init on a busy machine: ~3 s to join a cluster, ~15 s to start a local one
SOCKET_S = 5.0  # a host:port that does not accept a TCP connection by then is not there


class ClusterUnreachable(MMLoaderError):
    """The Ray cluster named by ``address=`` or ``RAY_ADDRESS`` does not answer."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("Ray is not installed: pip install 'mmloader[ray]'") from None
    return ray


_abandoned: tuple[str, threading.Event] | None = None  # a connect given up (address, set when it ends)
_lock = threading.Lock()
_connects: queue.SimpleQueue = queue.SimpleQueue()
_owner: threading.Thread | None = None


def _owner_loop() -> None:
    while True:
        init, done = _connects.get()
        try:
            init()
        finally:
            done.set()


def _on_owner(init: Any) -> threading.Event:
    """Run ``init`` on the one thread that makes every connect of this process, and stays: Ray
    ties the processes a local start spawns (gcs_server, raylet) to the *thread* that spawned
    them (``PR_SET_PDEATHSIG``), so a thread that ended took the local cluster with it, and
    Ray then ended this process."""
    global _owner
    if _owner is None or not _owner.is_alive():
        _owner = threading.Thread(target=_owner_loop, name="mmloader-ray-connect", daemon=True)
        _owner.start()
    done = threading.Event()
    _connects.put((init, done))
    return done


def connect(address: str | None = None, *, deadline_s: float = CONNECT_S, **init_options: Any) -> Any:
    """Ray, connected to ``address`` (else ``RAY_ADDRESS``; else what ``ray.init()`` picks: the
    cluster ``ray start`` runs on this machine, or a local Ray; ``"local"``: a new local Ray)
    within ``deadline_s``, or :class:`ClusterUnreachable` naming why. ``init_options`` go to
    ``ray.init``.

    A process already connected keeps its cluster: an ``address`` naming another one is
    refused (Ray would silently keep the first).
    """
    ray = import_ray()
    named = address or os.environ.get("RAY_ADDRESS") or None
    with _lock:
        if ray.is_initialized():
            if address:  # (RAY_ADDRESS is how the cluster was found: it names the same one)
                _check_same_cluster(ray, address)
            return ray
        if _abandoned is not None and not _abandoned[1].is_set():
            raise ClusterUnreachable(
                f"an earlier connect to the Ray cluster at {_abandoned[0]!r} did not finish and cannot be "
                "taken back in this process: restart it (with a cluster that answers, or another address)"
            )
        if named and named not in ("auto", "local") and "://" not in named:
            _check_port(named)
        return _init_within(ray, named, deadline_s, init_options)


def _check_port(address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=SOCKET_S).close()
    except (OSError, ValueError) as e:
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {address!r} ({e}): start one there "
            "(`ray start --head`), or fix address= / RAY_ADDRESS"
        ) from None


def _init_within(ray: Any, address: str | None, deadline_s: float, options: dict) -> Any:
    global _abandoned
    outcome: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(address=address, **options)
            outcome.append(None)
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    worker_log = logging.getLogger("ray._private.worker")
    quiet = _NotMainThreadNote()
    worker_log.addFilter(quiet)  # Ray says it cannot set its SIGTERM handler outside the main thread
    started = time.monotonic()
    done: threading.Event | None = None
    try:
        done = _on_owner(init)
        done.wait(deadline_s)
    finally:  # (a Ctrl-C here too: the connect goes on, and no second one may start beside it)
        worker_log.removeFilter(quiet)
        if done is not None and not done.is_set():
            _abandoned = (address or "(ray.init's default)", done)
    if not outcome:
        raise ClusterUnreachable(
            f"no Ray cluster answered at {address or '(ray.init default)'} within {deadline_s:.0f} s. {_why(address)}"
        )
    error = outcome[0]
    if error is not None:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ClusterUnreachable(
            f"cannot connect to the Ray cluster at {address or '(ray.init default)'} after "
            f"{time.monotonic() - started:.0f} s: {first}. {_why(address)}"
        ) from error
    return ray


def _why(address: str | None) -> str:
    if address is None or address == "auto":
        return (
            "Ray looked for a cluster started on this machine (`ray start`), else started one: if one is "
            "shutting down or stuck, run `ray stop` and retry, or name a cluster with address= / RAY_ADDRESS"
        )
    if address == "local":
        return "a local Ray did not start: see /tmp/ray/session_latest/logs"
    host = address.rpartition(":")[0]
    loopback = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
    hint = (
        " Ray reaches 127.0.0.1 through this machine's network address: a cluster started on loopback "
        "only (`ray start --node-ip-address=127.0.0.1`) needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in "
        "this process too."
        if loopback and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "") != "0"
        else ""
    )
    return (
        f"Check that {address} is a Ray head's port (`ray status --address {address}`; the dashboard's "
        f"port is not it) and that this machine can reach every node's address.{hint}"
    )


def _check_same_cluster(ray: Any, address: str) -> None:
    if address == "auto" or "://" in address:
        return
    current = ray.get_runtime_context().gcs_address
    if address == "local" or not _same_endpoint(address, current):
        raise MMLoaderError(
            f"this process is connected to the Ray cluster at {current}, and address={address!r} names "
            "another: Ray serves one cluster per process. Drop address= to use the connected one, or "
            "call ray.shutdown() first"
        )


def _same_endpoint(a: str, b: str) -> bool:
    """Whether two ``host:port`` name one endpoint (loopback and this machine's own address are one)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if port_a != port_b:
        return False
    return _resolve(host_a) == _resolve(host_b) or (_is_this_machine(host_a) and _is_this_machine(host_b))


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host or "127.0.0.1")
    except OSError:
        return host


def _is_this_machine(host: str) -> bool:
    ip = _resolve(host)
    if ip.startswith("127."):
        return True
    try:
        import ray

        return ip == ray.util.get_node_ip_address()
    except Exception:  # (an address Ray cannot tell: not this machine as far as we know)
        return False


class _NotMainThreadNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()
