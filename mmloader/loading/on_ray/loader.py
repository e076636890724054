""":class:`RayLoader`: a rank's batches, built by Ray actors, delivered in plan order."""

from __future__ import annotations

import collections
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from ...errors import MMLoaderError
from ..protocol import check_stream
from ..resumable import Resumable
from .builders import BuilderPool, builder_pool
from .cluster import connect

_TRIES = 4  # builds of one batch before its loss is an error (each on another builder)


@dataclass
class _InFlight:
    j: int
    spec: tuple
    actor: int
    ref: Any
    tries: int = 1


class RayLoader(Resumable):
    """Batches of a stored :class:`mmloader.Stream`, built on a Ray cluster's CPU nodes.

    The rank plans (a pure function of seed, epoch and its place in the world), so any
    builder can build batch ``j`` of any rank: a batch whose builder or node is lost is simply
    built again by another, and delivery stays in plan order. Every promise of the local
    backends holds: each sample once per epoch, equal batches per rank, ``state_dict`` /
    ``load_state_dict`` (also onto another world size), ``errors=`` with the same errors.

    Args:
        stream: a stored stream (a :class:`mmloader.LiveStream` has no plan to hand out).
        address: the cluster (``host:port`` of its head); default ``RAY_ADDRESS``, else a
            local Ray started in this process.
        actors: builders for the job (default: one per CPU of the decode nodes); the ranks
            of a job share them.
        in_flight: batches this rank has asked for and not taken (its memory bound); default
            twice the builders per rank, at least 2.
        job: the name the job's builders share (default: torchrun's run id, else this process's).
        on_trainer_nodes: put builders on the training nodes too (default: only when the
            cluster has no other node).
        timeout_s: how long one batch may take before the loader says so and stops.

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
    ):
        check_stream(stream)
        if not hasattr(stream, "build_planned"):
            raise TypeError(
                f"backend='ray' builds the batches of a stored mmloader.Stream; a {type(stream).__name__} "
                "has no plan to hand out: use backend='thread' or 'process'"
            )
        self.stream = stream
        self.address, self.actors, self.in_flight = address, actors, in_flight
        self.job = job or os.environ.get("TORCHELASTIC_RUN_ID") or f"mmloader-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.on_trainer_nodes, self.timeout_s = on_trainer_nodes, timeout_s
        self.batches_seen = 0
        self.rebuilt = 0  # batches built again after their builder or node was lost
        self._ray: Any = None
        self._pool: BuilderPool | None = None

    def __len__(self) -> int:
        return len(self.stream)

    def pool(self) -> BuilderPool:
        """The job's builders (started, or found, on first use)."""
        if self._pool is None:
            self._ray = connect(self.address)
            self._pool = builder_pool(self._ray, self.job, self.actors, self.on_trainer_nodes)
        return self._pool

    def _window(self) -> int:
        if self.in_flight is not None:
            return max(1, self.in_flight)
        world = self.stream.where()[1]
        return max(2, math.ceil(2 * len(self.pool().actors) / world))

    def _batches(self) -> Iterator[Any]:
        pool, ray = self.pool(), self._ray
        stream: Any = self.stream  # a stored Stream (checked in __init__): it has planned()
        pass_id = uuid.uuid4().hex
        seed_globals = bool(stream.python_work())
        stream_ref, refs = ray.put(stream), None
        planned = stream.planned(0, 1)
        window: collections.deque[_InFlight] = collections.deque()
        limit, last_plan = self._window(), None

        def submit(entry: _InFlight) -> None:
            entry.ref = pool.actors[entry.actor].build.remote(pass_id, refs, entry.spec, seed_globals)

        j = 0
        try:
            while True:
                while len(window) < limit:
                    item = next(planned, None)
                    if item is None:
                        break
                    plan, spec = item[0], item[1:]
                    if plan is not last_plan:  # one plan per pass: sent once, by reference
                        refs, last_plan = [stream_ref, ray.put(plan)], plan
                    entry = _InFlight(j, spec, pool.pick(), None)
                    submit(entry)
                    window.append(entry)
                    j += 1
                if not window:
                    return
                batch = self._take(window, submit)
                yield batch
        finally:
            for entry in window:  # a pass left early: what it asked for is not built for nothing
                ray.cancel(entry.ref)

    def _take(self, window: collections.deque, submit: Any) -> Any:
        """The oldest batch in flight, built again elsewhere while its builder is lost."""
        ray = self._ray
        exceptions = ray.exceptions
        head = window[0]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                batch, skipped = ray.get(head.ref, timeout=max(0.0, deadline - time.monotonic()))
            except exceptions.RayTaskError as e:  # the build raised: the same error as locally
                cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
                raise cause from None
            except exceptions.GetTimeoutError:
                raise MMLoaderError(
                    f"backend='ray': batch {head.j} of this pass was not built within {self.timeout_s:.0f} s "
                    "(timeout_s=); are the cluster's builders alive (`ray status`)?"
                ) from None
            except (exceptions.RayActorError, exceptions.ObjectLostError) as e:
                lost = head.actor
                for entry in window:  # everything that builder held is built again by others
                    if entry.actor == lost:
                        if entry.tries >= _TRIES:
                            raise MMLoaderError(
                                f"backend='ray': batch {entry.j} was lost {entry.tries} times with its builder ({e})"
                            ) from None
                        entry.actor, entry.tries = self._pool.pick(avoid=lost), entry.tries + 1  # type: ignore[union-attr]
                        submit(entry)
                        self.rebuilt += 1
                continue
            window.popleft()
            for _ in range(skipped):
                self.stream.control.count_skip(None)
            return batch
