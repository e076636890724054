"""Reaching a Ray cluster, naming a training job, and choosing where the batch builders go."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from ...errors import MMLoaderError

NAMESPACE = "mmloader"  # the builders' named actors live here, whatever namespace the job uses


class ClusterUnreachable(MMLoaderError):
    """The Ray cluster named by ``address=`` or ``RAY_ADDRESS`` does not answer."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("backend='ray' needs Ray: pip install 'mmloader[ray]'") from None
    return ray


def connect(address: str | None = None, timeout_s: float = 5.0, world: int = 1) -> Any:
    """Ray, connected: to ``address`` (else ``RAY_ADDRESS``; else, as ``ray.init()`` does, the
    cluster ``ray start`` runs on this machine or a local Ray started here; ``"local"``: always a
    new local Ray), or to the cluster this process already joined. A ``host:port`` that does not accept a connection
    within ``timeout_s`` raises :class:`ClusterUnreachable` at once (Ray itself would retry for a
    minute before failing). Several ranks with no cluster named would each start a Ray of their
    own, every one using all of the node's CPUs: that is refused, naming the remedy."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None and world > 1:
        raise MMLoaderError(
            f"backend='ray' on {world} ranks needs one Ray cluster they share, and none is named: start "
            "one (`ray start --head`, then `ray start --address=HEAD:6379` on each decode node) and pass "
            "address='HEAD:6379' or set RAY_ADDRESS"
        )
    if address and address not in ("auto", "local") and "://" not in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as e:
            raise ClusterUnreachable(
                f"cannot reach the Ray cluster at {address!r} ({e}): start one there "
                "(`ray start --head`), or fix address= / RAY_ADDRESS"
            ) from None
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=True, configure_logging=False)
    return ray


_PROCESS_JOB = f"process-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this process's loaders share one pool


def job_name() -> str:
    """A name every rank of one training job computes alike, and no other job does, so that the
    job's ranks (and the loaders of one process) share its builders: torchrun's run id; else,
    once ``torch.distributed`` is initialised, a name the first rank to ask writes into the
    job's rendezvous store (Lightning's and accelerate's launchers have no run id, and two jobs
    may use the same ``MASTER_ADDR:MASTER_PORT``); else this process's own."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"run-{run_id}"
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            mine = f"job-{uuid.uuid4().hex[:12]}"
            # set only where unset: the first rank's name wins, every rank reads it (no waiting)
            return bytes(store.compare_set("mmloader/ray-job", "", mine)).decode()
        except (AttributeError, RuntimeError, NotImplementedError):  # a store that cannot
            pass
    return _PROCESS_JOB


def decode_nodes(ray: Any, on_trainer_nodes: bool | None) -> list[tuple[str, int]]:
    """(node id, CPUs) of the nodes builders go to: every alive node but this one (the trainer's),
    unless it is the only one or ``on_trainer_nodes`` asks for it too."""
    here = ray.get_runtime_context().get_node_id()
    nodes = [
        (n["NodeID"], int(n["Resources"].get("CPU", 0)))
        for n in ray.nodes()
        if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1
    ]
    others = [n for n in nodes if n[0] != here]
    if on_trainer_nodes or (on_trainer_nodes is None and not others):
        return sorted(nodes)
    if not others:
        raise MMLoaderError("backend='ray': the cluster has no node besides this one; pass on_trainer_nodes=True")
    return sorted(others)
