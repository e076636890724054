"""The resume protocol both loader backends share: epochs, ``state_dict``, ``load_state_dict``.

What each pass of a loader delivers (the same on both backends, under ``GPUDecode``
and with persistent workers):

* the first pass: the current epoch (0 unless ``set_epoch`` or ``load_state_dict`` chose);
* after ``load_state_dict``: the rest of the saved epoch, for that one pass only;
* after ``set_epoch(e)``: epoch ``e`` from its start;
* otherwise, after a completed pass: the next epoch, so a loop that never calls
  ``set_epoch`` still gets a new order each epoch;
* otherwise, after a pass left early (a ``break``, a framework's batch limit): the same
  epoch from its next unseen batch, exactly as a resume from ``state_dict()`` taken
  then. Frameworks that limit batches per epoch call ``set_epoch`` before the next
  one (Lightning does, through :attr:`Resumable.sampler`), which starts it afresh.

A pass is decided at its first batch (frameworks make the iterator before setting the
epoch); ``set_epoch``/``load_state_dict`` during a pass apply when it ends; one pass at a
time (a second, interleaved iterator raises).

The formats follow torchdata's ``StatefulDataLoader``: ``state_dict()`` is plain data
(JSON-able), taken at any point, loaded before the next pass.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Iterator

from ..readers.timing import STAGES
from .nodes.chain import Chain
from .nodes.chain import check as check_nodes
from .protocol import StreamLike

READY_S = 1e-3  # a next() this quick found its batch built already (the queue held one)


class EpochSampler:
    """What frameworks find at ``loader.sampler``: ``set_epoch`` reaches the loader.

    Lightning, accelerate and HF Trainer call ``set_epoch`` on a loader's sampler at
    each epoch (as they would on a ``DistributedSampler``); mmloader has no sampler,
    its plan does the sharding, so this one only forwards the epoch.

    Args:
        loader: the loader whose epoch it sets.
    """

    def __init__(self, loader: "Resumable"):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """Select ``epoch`` on the loader (see :meth:`Resumable.set_epoch`)."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[None]:
        raise TypeError("mmloader's loaders plan their own batches; this sampler only carries set_epoch")


class LoaderStats:
    """How long the training loop waited for data, and for how long it ran between batches.

    ``wait`` is the time spent inside the loader's ``next()``; ``compute`` the time
    between receiving a batch and asking for the next one. The first batch of each pass
    (starting workers, filling the pipeline) is counted apart, in ``first_wait``. ``ready``:
    batches that were waiting when asked for (the prefetch queue was not empty). ``stages``:
    the builders' counters (:meth:`SharedControl.stage_times`) when counting began.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Start counting afresh."""
        self.batches, self.samples, self.wait, self.compute = 0, 0, 0.0, 0.0
        self.first_batches, self.first_wait, self.samples_after_first = 0, 0.0, 0
        self.ready, self.stages = 0, [0.0] * 4

    def as_dict(self) -> dict[str, float]:
        """The figures as plain numbers (per batch in milliseconds; rates per second)."""
        timed = self.batches - self.first_batches
        total = self.wait + self.compute
        return {
            "batches": self.batches,
            "samples": self.samples,
            "wait_s": self.wait,
            "compute_s": self.compute,
            "first_batch_wait_s": self.first_wait,
            "wait_ms_per_batch": 1e3 * self.wait / timed if timed else 0.0,
            "compute_ms_per_batch": 1e3 * self.compute / self.batches if self.batches else 0.0,  # (after each)
            "wait_fraction": self.wait / total if total else 0.0,
            "batches_per_s": timed / total if total else 0.0,
            "samples_per_s": self.samples_after_first / total if total else 0.0,
            "ready_fraction": self.ready / timed if timed else 0.0,
        }

    def stage_figures(self, now: list[float]) -> dict[str, float]:
        """Milliseconds per built batch of each stage since counting began, from the builders'
        counters ``now`` (none when no batch was built where they count: the Ray backend's)."""
        *seconds, built = [a - b for a, b in zip(now, self.stages)]
        if built <= 0:
            return {}
        return {f"{stage}_ms_per_batch": 1e3 * s / built for stage, s in zip(STAGES, seconds)}


class Resumable:
    """Counts the batches delivered in this pass; states are computed from that count.

    A state taken after an epoch's last batch points at the start of the next epoch,
    so resuming from it never replays the finished epoch.
    """

    stream: StreamLike
    batches_seen = 0
    epoch_done = False
    _passes = 0
    _stats: LoaderStats | None = None
    _active: object | None = None  # the pass delivering now (None between passes)
    _pending: tuple[str, Any] | None = None  # set_epoch/load_state_dict that came during a pass
    batch_sampler = None  # frameworks read it beside `sampler` (Lightning's shuffle check)
    _chain: Chain | None = None  # the user's nodes after the backend (loader(nodes=[...]))

    @property
    def epoch(self) -> int:
        """The epoch being delivered (after ``load_state_dict``: the epoch the state resumes)."""
        return self.stream.epoch

    @property
    def sampler(self) -> EpochSampler:
        """An object with ``set_epoch``, where Lightning and accelerate look for one."""
        return EpochSampler(self)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next pass delivers, from its start; a resume pending for this same
        epoch is kept (see :meth:`~.stream.Stream.set_epoch`). Called while a pass is delivering, it
        applies when that pass ends: its batches, and states taken during it, stay those of
        its own epoch.

        Args:
            epoch: the epoch number (its order is a function of the stream's seed and it).
        """
        if self._delivering():
            self._pending = ("epoch", int(epoch))
            return
        self._pending = None
        self.stream.set_epoch(epoch)
        self.batches_seen, self.epoch_done = 0, False

    def load_state_dict(self, state: dict) -> None:
        """Resume at exactly the next unseen batch (also on another world size or worker count).
        Called while a pass is delivering, it applies when that pass ends (checked now).

        Args:
            state: a :meth:`state_dict` of this stream (the next pass delivers the rest of its epoch).
        """
        progress, nodes = state, None
        if isinstance(state, dict) and "nodes" in state:
            progress, nodes = {k: v for k, v in state.items() if k != "nodes"}, state["nodes"]
        if self._delivering():
            self.stream.check_resume(progress)  # a state that does not fit fails here, not later
            check_nodes(self._chain, nodes)
            self._pending = ("state", state)
            return
        self._pending = None
        check_nodes(self._chain, nodes)
        self._resume_now(progress)
        if self._chain is not None:
            self._chain.load(nodes)

    def _rewind_nodes(self, saved: list[dict]) -> None:
        """Put the nodes back to ``saved`` (a read-ahead stage's batch never handed over went through them)."""
        if self._chain is not None:
            self._chain.load(saved)

    def _resume_now(self, state: dict) -> None:
        self.stream.resume(state)
        self.batches_seen, self.epoch_done = 0, False

    def _delivering(self) -> bool:
        """A pass is under way and has batches left to deliver."""
        return self._active is not None and not self.epoch_done

    def _apply_pending(self) -> None:
        """Apply a set_epoch/load_state_dict that came while the last pass was delivering."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._active = None
            (self.set_epoch if pending[0] == "epoch" else self.load_state_dict)(pending[1])

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        # Everything is decided at the first next(), not at iter(): frameworks make an iterator
        # and only then set the epoch (Lightning), or make one they never use.
        self.stream.where()  # fix rank/world in this process, before any worker starts
        self._apply_pending()  # (a pass left without being closed: a reference to it kept)
        self._begin_pass()
        getattr(self.stream, "prepare", lambda: None)()  # what workers would each compute, once, here
        token = self._active = object()
        try:
            yield from self._counted(self._through_nodes(self.stream.deliver(self._batches())), token)
        finally:
            if self._active is token:  # (an old pass closed late must not end a newer one)
                self._active = None
                self._apply_pending()

    def _through_nodes(self, batches: Iterator[Any]) -> Iterator[Any]:
        # (no local of _pass may hold the backend's generator: dropped with the pass, it stops
        # its workers at once, also at interpreter exit, while the module's functions are there)
        return batches if self._chain is None else self._chain.run(batches)

    def _batches(self) -> Iterator[Any]:
        """The backend's batches for the pass just begun."""
        raise NotImplementedError

    def _begin_pass(self) -> None:
        """Decide what this pass delivers (the module docstring's rules), before workers start."""
        stream = self.stream
        if stream.pass_flags.resume_fresh:
            stream.pass_flags.resume_fresh = False  # it applies to this pass only
        elif stream.pass_flags.epoch_chosen or self._passes == 0:
            if stream.control.resuming:
                stream.drop_resume()  # a resume some earlier pass delivered
        elif self.epoch_done:
            stream.drop_resume()
            stream.control.epoch = stream.epoch + 1
        else:  # left early: continue this epoch at its next unseen batch
            self._resume_now(self._progress())  # (the nodes go on as they are)
            stream.pass_flags.resume_fresh = False
        stream.pass_flags.epoch_chosen = False
        self._passes += 1
        self.batches_seen, self.epoch_done = 0, False

    def _counted(self, iterator: Iterator[Any], token: object) -> Iterator[Any]:
        total = self.stream.remaining()
        if total == 0:
            self.epoch_done = True
        stats = self.stats_counter
        batch_size = self.stream.batch_size or 1
        clock = time.perf_counter
        first = True
        while True:
            if self._active is not token:
                raise RuntimeError(
                    "this pass of the loader was superseded by a newer one (iter(loader) "
                    "again): a loader delivers one pass at a time; make a second loader "
                    "over the same stream definition for a second one"
                )
            asked = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            got = clock()
            size = _batch_len(batch, batch_size)
            stats.batches += 1
            stats.samples += size
            if first:
                stats.first_batches += 1
                stats.first_wait += got - asked
                first = False
            else:
                stats.wait += got - asked
                stats.samples_after_first += size
                stats.ready += got - asked < READY_S
            self.batches_seen += 1
            # Counted as delivered now: frameworks that know the length (Lightning) never ask
            # for the batch after the last, so the pass may never see StopIteration.
            self.epoch_done = self.batches_seen >= total
            yield batch
            stats.compute += clock() - got

    @property
    def stats_counter(self) -> LoaderStats:
        if self._stats is None:
            self._stats = LoaderStats()
            control = getattr(self.stream, "control", None)
            if control is not None:  # (another loader of the stream may have built batches)
                self._stats.stages = control.stage_times()
        return self._stats

    def stats(self, reset: bool = False) -> dict[str, float]:
        """How the training loop waited for data since the loader was made (or last reset).

        Keys: ``batches``, ``samples``, ``wait_s`` (inside ``next()``), ``compute_s``
        (between batches), ``first_batch_wait_s`` (each pass's first batch, counted apart),
        ``builders`` (the threads or processes that build batches),
        ``wait_ms_per_batch``, ``compute_ms_per_batch``, ``wait_fraction`` (of the loop's
        time; near 0 when data keeps up), ``batches_per_s`` and ``samples_per_s`` delivered,
        ``ready_fraction`` (batches already built when asked for: the prefetch queue's
        occupancy). Where the batches are built in this process or its DataLoader workers,
        the stages of building one, in milliseconds per batch and summed over the builders
        (each worker's own time): ``read_ms_per_batch`` (stored bytes), ``decode_ms_per_batch``
        (decoding with the transforms) and ``collate_ms_per_batch``;
        :func:`mmloader.loading.diagnosis.advice` says in a line what holds the loop up.

        Args:
            reset: start counting afresh after reading (for per-interval logging).
        """
        counter = self.stats_counter
        figures = counter.as_dict()
        # who built the batches: the thread backend's producers, else the worker processes (0: this one)
        figures["builders"] = getattr(self, "builders", None) or getattr(self, "num_workers", 0) or 1
        control = getattr(self.stream, "control", None)
        if control is not None:
            now = control.stage_times()
            figures.update(counter.stage_figures(now))
        if reset:
            counter.reset()
            if control is not None:
                counter.stages = now
        return figures

    def state_dict(self) -> dict:
        """Where this rank is: epoch plus delivered batches (and the plan geometry to check against).
        After the epoch's last batch: the start of the next epoch (the one ``set_epoch`` chose,
        if it was called during the pass). With nodes, a copy of each node's state."""
        pending = self._pending
        if self.epoch_done and pending is not None and pending[0] == "state":
            return pending[1]  # the pass is over; the next one is that
        return self._with_nodes(self._progress())

    def _progress(self) -> dict:
        """The stream's part of :meth:`state_dict`."""
        pending = self._pending
        if self.epoch_done and pending is not None and pending[0] == "epoch":
            return self.stream.progress(0, epoch_done=True, next_epoch=pending[1])
        return self.stream.progress(self.batches_seen, epoch_done=self.epoch_done)

    def _with_nodes(self, progress: dict, nodes: list[dict] | None = None) -> dict:
        """A state: the stream's progress, with the nodes' states (``nodes``: taken earlier)."""
        if self._chain is None:
            return progress
        return {**progress, "nodes": self._chain.saved(nodes)}

    def snapshot(self, before_last: bool = False) -> Any:
        """A deferred :meth:`state_dict` of this very moment: the stream's part is computed only
        if called, the nodes' states are taken now (they change with the next batch).

        Args:
            before_last: the state as it was before the batch delivered last (a wrapper that
                reads ahead hands it to its caller later).
        """
        chain = self._chain
        if before_last and self.batches_seen:
            progress = functools.partial(self.stream.progress, self.batches_seen - 1)
            nodes = chain.before if chain is not None else None
        else:
            progress = functools.partial(self.stream.progress, self.batches_seen, epoch_done=self.epoch_done)
            nodes = chain.states() if chain is not None else None
        return progress if chain is None else Snapshot(self, progress, nodes)


class Snapshot:
    """A state taken at one moment, computed when called; ``nodes``: the nodes' states then."""

    def __init__(self, loader: Resumable, progress: Any, nodes: list[dict] | None):
        self.loader, self.progress, self.nodes = loader, progress, nodes

    def __call__(self) -> dict:
        return self.loader._with_nodes(self.progress(), self.nodes)


def _batch_len(batch: Any, default: int) -> int:
    """Samples in a batch: its keys when it has them (a short last batch), else the batch size."""
    keys = batch.get("__key__") if isinstance(batch, dict) else None
    return len(keys) if isinstance(keys, (list, tuple)) else default


def warn_if_a_framework_cuts_the_epoch(stream: Any, state: dict) -> None:
    """A resume onto more ranks needs more steps in its epoch than a fresh epoch has here; a
    framework that read ``len`` before the state was loaded stops the epoch short of them."""
    read, needed = stream._len_read, len(stream)
    if read is None or needed <= read:
        return
    short = needed - read
    saved, world = state.get("world"), stream.where()[1]
    warnings.warn(
        f"this resume of epoch {state['epoch']} (saved on {saved} rank{'s' * (saved != 1)}, resumed on "
        f"{world}) needs {needed} steps per rank in its epoch ({stream._steps_before} taken "
        f"before + {stream.remaining()} to come), but len() was {read} when read before the state was "
        f"loaded: a framework that read it then (Lightning with the loader returned by its own "
        f"train_dataloader()) ends the epoch {short} batches early and their samples go untrained. "
        "Load the state before the framework reads the length (mmloader.frameworks.lightning.DataModule "
        "does), or resume onto the same or fewer ranks.",
        stacklevel=3,
    )
