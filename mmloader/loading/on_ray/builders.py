"""The actor that builds planned batches, and the pool of them the ranks of a job share."""

from __future__ import annotations

import collections
import itertools
import os
import time
from typing import Any

from ...errors import MMLoaderError
from . import lease
from .cluster import NAMESPACE, decode_nodes
from .wire import to_wire

_PASSES_KEPT = 16  # passes an actor keeps a stream for (a few per rank of the jobs it serves)


class BatchBuilder:
    """Builds batch specs of any rank's pass: ``(positions, sources, indices, seed, valid)``,
    planned by the rank, built here by the stream's own builder (the same code, seeds and
    error policy as a local worker). The stream and plan of a pass are fetched once, by
    reference, and kept for the pass."""

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)  # one CPU per builder: an op's own thread team only contends
        self._passes: collections.OrderedDict[str, tuple[Any, Any]] = collections.OrderedDict()
        self._built = 0

    def build(self, pass_id: str, refs: list, spec: tuple, seed_globals: bool) -> tuple[Any, int]:
        """(the batch, samples it skipped under ``errors="skip"``)."""
        stream, plan = self._pass(pass_id, refs)
        before = stream.control.skipped
        batch = to_wire(stream.build_planned(plan, spec, seed_globals))
        self._built += 1
        return batch, stream.control.skipped - before

    def built(self) -> int:
        """Batches this builder has built since it started."""
        return self._built

    def where(self) -> tuple[str, int]:
        """(node id, process id) of this builder."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def _pass(self, pass_id: str, refs: list) -> tuple[Any, Any]:
        hit = self._passes.get(pass_id)
        if hit is None:
            import ray

            hit = self._passes[pass_id] = tuple(ray.get(refs))  # (refs in a list: resolved here, once)
            while len(self._passes) > _PASSES_KEPT:
                self._passes.popitem(last=False)
        self._passes.move_to_end(pass_id)
        return hit


class BuilderPool:
    """The builders of one job: detached named actors that every rank of the job finds (the first
    rank to ask creates them, and its ``actors`` sets how many), kept by the job's lease
    (:mod:`.lease`): they outlive the rank that made them and go once the job's last rank has
    left. Each is placed on a decode node, one per CPU by default; a builder lost with its
    process or node is restarted by Ray (on another node when its own is gone).

    A process keeps its pools (:func:`builder_pool`) until it exits: loaders come and go (one
    per epoch in some frameworks) and the job's builders stay.
    """

    def __init__(self, ray: Any, job: str, actors: int | None, on_trainer_nodes: bool | None):
        self.ray, self.job, self.on_trainer_nodes, self._wanted = ray, job, on_trainer_nodes, actors
        self.actors: list[Any] = []
        self.lease: Any = None
        self.joins = 0  # 1, and one more each time the lease had lapsed and the job's builders were made anew
        self._turn = itertools.count()
        self.join()

    def join(self) -> None:
        """Join the job's lease and find (or make) its builders; return once they have started."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray, job = self.ray, self.job
        slots = builder_slots(decode_nodes(ray, self.on_trainer_nodes))
        count = self._wanted or len(slots)
        cpus = sum(int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive"))
        if count > cpus:  # could never all start: say so now rather than wait
            raise MMLoaderError(
                f"backend='ray': actors={count} builders of one CPU each, on a cluster of {cpus} CPUs: "
                "pass actors= fewer, or add decode nodes"
            )
        names = [f"{job}-builder-{i}" for i in range(count)]
        self.lease, count = lease.join(ray, job, names, NAMESPACE)  # (the first rank's count)
        remote = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)(BatchBuilder)

        def builder(i: int) -> Any:
            return remote.options(
                name=f"{job}-builder-{i}",
                namespace=NAMESPACE,
                get_if_exists=True,
                lifetime="detached",  # (the lease ends them: not the rank that happened to make them)
                # A node whose CPUs are taken (by another job's builders) spills its builder to
                # one that has a CPU free, rather than keep it waiting there.
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    slots[i % len(slots)], soft=True, _spill_on_unavailable=True
                ),
            ).remote()

        self.actors = [builder(i) for i in range(count)]
        self.joins += 1
        deadline = time.monotonic() + START_S
        waiting = self._started(builder, deadline)
        if waiting:
            lease.leave(ray, job, self.lease)  # (alone, its pending builders go: a retry starts afresh)
            free = ray.available_resources().get("CPU", 0)
            raise MMLoaderError(
                f"backend='ray': {len(waiting)} of {len(self.actors)} builders did not start within {START_S:.0f} s; "
                f"each needs a CPU and the cluster has {free:g} free (other loaders' or jobs' builders hold the "
                "rest): pass actors= fewer, or add decode nodes"
            )

    def _started(self, builder: Any, deadline: float) -> dict:
        """Wait for every builder to answer; those that did not by ``deadline``."""
        ray = self.ray
        waiting = {a.built.remote(): i for i, a in enumerate(self.actors)}
        while waiting and time.monotonic() < deadline:
            ready, _pending = ray.wait(list(waiting), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                i = waiting.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:  # one a released lease was still removing: its name is
                    time.sleep(0.2)  # about to be free, and then a new one is made under it
                    self.actors[i] = builder(i)
                    waiting[self.actors[i].built.remote()] = i
        return waiting

    def held(self) -> bool:
        """Whether the job's lease still holds its builders (False: it lapsed, as when this
        process was paused past the lease with no other rank renewing; :meth:`join` again)."""
        return lease.renewed(self.ray, self.lease)

    def pick(self, avoid: int | None = None) -> int:
        """The next builder in turn (not ``avoid``, the one that just failed, when there are others)."""
        while True:
            i = next(self._turn) % len(self.actors)
            if i != avoid or len(self.actors) == 1:
                return i


def builder_slots(nodes: list[tuple[str, int]]) -> list[str]:
    """One slot per CPU, the nodes taken in turn, so that a few builders spread over the nodes.

    >>> builder_slots([("a", 3), ("b", 1), ("c", 2)])
    ['a', 'b', 'c', 'a', 'c', 'a']
    """
    slots: list[str] = []
    for turn in range(max((cpus for _node, cpus in nodes), default=0)):
        slots += [node for node, cpus in nodes if cpus > turn]
    return slots


_POOLS: dict[tuple, BuilderPool] = {}
START_S = 120.0  # builders that have not started by then are said not to fit on the cluster


def builder_pool(ray: Any, job: str, actors: int | None, on_trainer_nodes: bool | None) -> BuilderPool:
    """This process's pool of ``job``'s builders on its current Ray connection (joined, made or
    found on the cluster, on first use), started before it is handed out."""
    key = (*lease.connection(ray), job, on_trainer_nodes)
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = BuilderPool(ray, job, actors, on_trainer_nodes)
    return pool
