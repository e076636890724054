""":class:`RayLoader`: a rank's batches, built by Ray actors, delivered in plan order."""

from __future__ import annotations

import math
import uuid
from typing import Any, Iterator

from ...errors import MMLoaderError
from ..protocol import check_stream
from ..resumable import Resumable
from .builders import BuilderPool, builder_pool
from .cluster import CONNECT_S, connect, job_name
from .lease import connection
from .window import BuildWindow

#: What ``mmloader.loader(stream, backend="ray", ...)`` takes besides ``num_workers`` (= ``actors``).
RAY_OPTIONS = ("address", "actors", "in_flight", "job", "on_trainer_nodes", "timeout_s", "connect_timeout_s")


class RayLoader(Resumable):
    """Batches of a stored :class:`mmloader.Stream`, built on a Ray cluster's CPU nodes.

    The rank plans (a pure function of seed, epoch and its place in the world), so any
    builder can build batch ``j`` of any rank: a batch whose builder or node is lost is simply
    built again by another, and delivery stays in plan order. Every promise of the local
    backends holds: each sample once per epoch, equal batches per rank, ``state_dict`` /
    ``load_state_dict`` (also onto another world size), ``errors=`` with the same errors.
    The data must be readable from the decode nodes at the paths the stream names (a shared
    file system, object storage or the Hub).

    Args:
        stream: a stored stream (a :class:`mmloader.LiveStream` has no plan to hand out).
        address: the cluster (``host:port`` of its head); default ``RAY_ADDRESS``, else the
            cluster ``ray start`` runs on this machine, else a local Ray started in this
            process (one rank only); ``"local"``: always a local Ray of its own.
        actors: builders for the job (default: one per CPU of the decode nodes); the ranks
            of a job, and the loaders of a process, share them (the first to start them sets
            how many).
        in_flight: batches this rank has asked for and not taken (its memory bound); default
            twice the builders per rank, at least 2.
        job: the name the job's builders share (default: torchrun's run id, else one the
            ranks agree on through ``torch.distributed``'s store, else this process's own).
        on_trainer_nodes: put builders on the training nodes too (default: only when the
            cluster has no other node).
        timeout_s: how long one batch may take before the loader says so and stops.
        connect_timeout_s: how long connecting to the cluster may take before
            :class:`~mmloader.cluster.ray_cluster.ClusterUnreachable` says why (Ray's own
            client may retry for good).

    >>> loader = mmloader.loader(stream, backend="ray", address="head:6379")   # doctest: +SKIP
    """

    def __init__(
        self,
        stream: Any,
        *,
        address: str | None = None,
        actors: int | None = None,
        in_flight: int | None = None,
        job: str | None = None,
        on_trainer_nodes: bool | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = CONNECT_S,
    ):
        check_stream(stream)
        if not hasattr(stream, "build_planned"):
            raise TypeError(
                f"backend='ray' builds the batches of a stored mmloader.Stream; a {type(stream).__name__} "
                "has no plan to hand out: use backend='thread' or 'process'"
            )
        for name, value in (("actors", actors), ("in_flight", in_flight)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"backend='ray': {name}={value!r}: expected a positive number or None")
        self.stream = stream
        self.address, self.actors, self.in_flight = address, actors, in_flight
        self.job = job  # (default: named on first use, once torch.distributed is set up)
        self.on_trainer_nodes, self.timeout_s = on_trainer_nodes, timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.batches_seen = 0
        self.rebuilt = 0  # batches built again after their builder or node was lost
        self._ray: Any = None
        self._pool: BuilderPool | None = None
        self._connection: tuple = ()  # the Ray connection its pool belongs to

    def __len__(self) -> int:
        return len(self.stream)

    def pool(self) -> BuilderPool:
        """The job's builders (joined, started or found, on first use)."""
        if self._pool is not None and (not self._ray.is_initialized() or connection(self._ray) != self._connection):
            # Measured (Ray 2.60): after ray.shutdown() and ray.init() again in one process,
            # ray.put can hand out object ids that still name the old connection's job, and the
            # builders then fail to fetch them (OwnerDiedError), in some runs and not others.
            raise MMLoaderError(
                "backend='ray': Ray was shut down (ray.shutdown()) after this loader's builders started; "
                "Ray does not hand a process reliable object references after it connects again, so "
                "this process cannot feed them: keep Ray connected between passes (the job's builders "
                "stay for its other ranks, and a new process of the job joins them)"
            )
        if self._pool is None:
            world = self.stream.where()[1]
            self._ray = connect(self.address, world=world, deadline_s=self.connect_timeout_s)
            self.job = self.job or job_name(world)
            self._pool = builder_pool(self._ray, self.job, self.actors, self.on_trainer_nodes)
            self._connection = connection(self._ray)
        return self._pool

    def _window_size(self) -> int:
        if self.in_flight is not None:
            return self.in_flight
        world = self.stream.where()[1]
        return max(2, math.ceil(2 * len(self.pool().actors) / world))

    def _batches(self) -> Iterator[Any]:
        pool, ray = self.pool(), self._ray
        stream: Any = self.stream  # a stored Stream (checked in __init__): it has planned()
        window = BuildWindow(
            ray, pool, uuid.uuid4().hex, bool(stream.python_work()), self._window_size(), self.timeout_s
        )
        stream_ref, refs, last_plan = ray.put(stream), [], None
        planned = stream.planned(0, 1)
        try:
            while True:
                window.check_connected()
                while not window.full():
                    item = next(planned, None)
                    if item is None:
                        break
                    plan, spec = item[0], item[1:]
                    if plan is not last_plan:  # one plan per pass: sent once, by reference
                        refs, last_plan = [stream_ref, ray.put(plan)], plan
                    window.ask(refs, spec)
                if not len(window):
                    return
                batch, skipped = window.take()
                for _ in range(skipped):
                    self.stream.control.count_skip(None)
                yield batch
        finally:
            self.rebuilt += window.rebuilt
            window.cancel()

    def stats(self, reset: bool = False) -> dict[str, float]:
        """:meth:`Resumable.stats`, with ``builders`` (the job's) and ``rebuilt`` (batches built
        again after their builder or node was lost, since the loader was made)."""
        figures = super().stats(reset)
        figures["builders"] = len(self._pool.actors) if self._pool is not None else 0
        figures["rebuilt"] = self.rebuilt
        return figures
