"""Reaching a Ray cluster, naming a training job, and choosing where the batch builders go."""

from __future__ import annotations

import os
import uuid
from typing import Any

from ...cluster.ray_cluster import CONNECT_S, ClusterUnreachable, import_ray
from ...cluster.ray_cluster import connect as reach
from ...errors import MMLoaderError

__all__ = ["ClusterUnreachable", "connect", "decode_nodes", "job_name"]

NAMESPACE = "mmloader"  # the builders' named actors live here, whatever namespace the job uses


def connect(address: str | None = None, world: int = 1, deadline_s: float = CONNECT_S) -> Any:
    """Ray, connected (:func:`mmloader.cluster.ray_cluster.connect`: within its deadline, or
    :class:`ClusterUnreachable` naming why). Several ranks with no cluster named would each start
    a Ray of their own, every one using all of the node's CPUs: that is refused, naming the remedy."""
    ray = import_ray()
    if not ray.is_initialized() and world > 1 and not (address or os.environ.get("RAY_ADDRESS")):
        raise MMLoaderError(
            f"backend='ray' on {world} ranks needs one Ray cluster they share, and none is named: start "
            "one (`ray start --head`, then `ray start --address=HEAD:6379` on each decode node) and pass "
            "address='HEAD:6379' or set RAY_ADDRESS"
        )
    return reach(address, deadline_s=deadline_s, namespace=NAMESPACE, log_to_driver=True, configure_logging=False)


_PROCESS_JOB = f"process-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this process's loaders share one pool


def job_name(world: int = 1) -> str:
    """A name every rank of one training job computes alike, and no other job does, so that the
    job's ranks (and the loaders of one process) share its builders: torchrun's run id; else,
    once ``torch.distributed`` is initialised, a name the first rank to ask writes into the
    job's rendezvous store (Lightning's and accelerate's launchers have no run id, and two jobs
    may use the same ``MASTER_ADDR:MASTER_PORT``); else, for one rank, this process's own.
    Ranks of a ``world`` of several with none of these (launched with ``RANK`` / ``WORLD_SIZE``
    only) cannot find each other: that is said at once, naming the remedies."""
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
    if world > 1:
        raise MMLoaderError(
            f"backend='ray' on {world} ranks: the ranks cannot find their shared builders (no torchrun "
            "run id, torch.distributed not initialised), so each would start a pool of its own: pass "
            "job='NAME', the same on every rank (e.g. your launcher's job id), or call "
            "torch.distributed.init_process_group() before the first pass, or launch with torchrun"
        )
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
