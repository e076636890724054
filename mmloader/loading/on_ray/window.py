"""A rank's batches in flight on the builders, taken in plan order, built again when lost."""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass
from typing import Any

from ...errors import MMLoaderError
from .builders import BuilderPool
from .wire import from_wire

_TRIES = 4  # builds of one batch before its loss is an error (each on another builder)


@dataclass
class _Build:
    j: int  # its place in this rank's pass
    spec: tuple  # what the builder builds: (positions, sources, indices, seed, valid)
    actor: int
    refs: list  # the pass's stream and plan, by reference (a rebuild sends the same)
    ref: Any = None  # the batch being built
    tries: int = 0


class BuildWindow:
    """At most ``limit`` batches asked of the builders and not yet taken (the rank's memory
    bound and its backpressure: nothing more is asked until the trainer takes the oldest).

    Args:
        ray: the connected ``ray`` module.
        pool: the job's builders.
        pass_id: names this pass's stream and plan on the builders.
        seed_globals: builders reseed the global RNGs per batch (user Python runs in it).
        limit: batches in flight.
        timeout_s: how long the oldest batch may take.
    """

    def __init__(self, ray: Any, pool: BuilderPool, pass_id: str, seed_globals: bool, limit: int, timeout_s: float):
        self.ray, self.pool, self.pass_id, self.seed_globals = ray, pool, pass_id, seed_globals
        self.limit, self.timeout_s = limit, timeout_s
        self.queue: collections.deque[_Build] = collections.deque()
        self.rebuilt = 0  # batches built again after their builder or node was lost
        self._asked = 0

    def check_connected(self) -> None:
        """Before the pass's next Ray call: after ``ray.shutdown()`` that call would connect Ray
        anew (Ray starts or joins a cluster on first use) or end the process, saying nothing."""
        if not self.ray.is_initialized():
            raise MMLoaderError(
                "backend='ray': Ray was shut down (ray.shutdown()) during this pass, and its batches in "
                "flight went with the connection: keep Ray connected until the pass ends"
            )

    def full(self) -> bool:
        return len(self.queue) >= self.limit

    def __len__(self) -> int:
        return len(self.queue)

    def ask(self, refs: list, spec: tuple) -> None:
        """Have a builder build the next batch of the plan (``refs``: the pass's stream and plan)."""
        build = _Build(self._asked, spec, self.pool.pick(), refs)
        self._asked += 1
        self._submit(build)
        self.queue.append(build)

    def _submit(self, build: _Build) -> None:
        build.tries += 1
        actor = self.pool.actors[build.actor]
        build.ref = actor.build.remote(self.pass_id, build.refs, build.spec, self.seed_globals)

    def take(self) -> tuple[Any, int]:
        """(the oldest batch, samples its build skipped), built again elsewhere while its
        builder is lost; a build that raised raises the same error here."""
        exceptions = self.ray.exceptions
        head = self.queue[0]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                batch, skipped = self.ray.get(head.ref, timeout=max(0.0, deadline - time.monotonic()))
            except exceptions.RayTaskError as e:  # the build raised: the same error as locally
                cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
                raise cause from None
            except exceptions.GetTimeoutError:
                raise MMLoaderError(
                    f"backend='ray': batch {head.j} of this pass was not built within {self.timeout_s:.0f} s "
                    "(timeout_s=); are the cluster's builders alive (`ray status`)?"
                ) from None
            except (exceptions.RayActorError, exceptions.ObjectLostError) as e:
                if self.pool.held():
                    self._rebuild_lost(head.actor, e)
                else:  # the lease lapsed (this process paused past it, alone): the job's builders anew
                    self.pool.join()
                    for build in self.queue:  # (the job may have fewer builders now: a later rank made them)
                        build.actor = self.pool.pick()
                        self._submit(build)
                        build.tries -= 1  # (not this batch's loss)
                continue
            self.queue.popleft()
            return from_wire(batch), skipped

    def _rebuild_lost(self, lost: int, error: Exception) -> None:
        """Everything builder ``lost`` held is asked again of the others."""
        for build in self.queue:
            if build.actor != lost:
                continue
            if build.tries >= _TRIES:
                raise MMLoaderError(
                    f"backend='ray': batch {build.j} of this pass was lost {build.tries} times with its "
                    f"builder ({type(error).__name__}: {error})"
                ) from None
            build.actor = self.pool.pick(avoid=lost)
            self._submit(build)
            self.rebuilt += 1

    def cancel(self) -> None:
        """A pass left early (or ended by an error): what it asked for is not built for nothing,
        and builds that already failed are collected here (Ray prints the traceback of a failed
        result nobody took, as if it were a second error)."""
        refs = [build.ref for build in self.queue]
        self.queue.clear()
        if sys.is_finalizing() or not self.ray.is_initialized():
            return  # at exit, or after ray.shutdown(): the builds went with the connection
        for ref in refs:
            self.ray.cancel(ref)
        done, _pending = self.ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        for ref in done:
            try:
                self.ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - the pass's own error (if any) is raised already
                pass
