"""``mmloader.Stream``: an epoch plan streamed to one rank's DataLoader workers.

The Stream composes the parts that each do one job: :mod:`mmloader.loading.control`
(state shared with workers: epoch, place in the world, resume flag, skip
counts), :mod:`mmloader.planning` (the epoch plan, the rank/worker split, resume
arithmetic — pure functions), :mod:`mmloader.readers.seeding` (per-batch seeds) and
:mod:`mmloader.loading.building` (reading and collating a batch, the error policy).
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.utils.data

from ..align.collate import Collate, collate
from ..errors import PlanChangedError
from ..planning import RangeList, worker_batches
from ..planning.balance import balanced_batches
from ..planning.partition import batches_per_rank, planned_batches, unrepeated_positions, unrepeated_share
from ..planning.resume import check_fields, progress_state, resume_ranges, upgraded
from ..readers.seeding import batch_seed, enter_batch
from .building import BatchBuilder
from .control import Controlled, SharedControl
from .identity import plan_identity
from .ledger import Ledger
from .packing import token_weighted
from .protocol import PassFlags
from .replan import changed_plan_target
from .resumable import warn_if_a_framework_cuts_the_epoch
from .stages import Batching, Bucketing, Errors, Order, Packing
from .stages.options import shortcut_stages, unknown_options
from .stages.values import choice, whole

log = logging.getLogger("mmloader")

ON_CHANGE = ("error", "next_epoch", "continue")


class Stream(Ledger, Controlled, torch.utils.data.IterableDataset):
    """Deterministic, rank- and worker-aware stream over a map-style dataset (or a :func:`mmloader.mix`).

    * The epoch's order (:class:`~mmloader.Order`) is a pure function of ``(seed, epoch)``,
      independent of world size and worker count.
    * Each rank gets an equal contiguous part, at sample granularity, in batches of
      :class:`~mmloader.Batching` (padding by repeats, ``drop_last``, or ``padding="mask"``
      for evaluation: every sample once, ``__valid__`` per row); workers build whole batches.
    * ``lengths``: :class:`~mmloader.Bucketing` (batches of similar length) or
      :class:`~mmloader.Packing` (rows of whole samples filled to a token budget, planned
      before the rank split). ``errors``: :class:`~mmloader.Errors` (``"raise"`` or ``"skip"``).
    * Randomness: every batch has a seed from (seed, epoch, rank, its first plan position);
      :func:`mmloader.rng` gives it, and worker processes running user Python also reseed the
      global RNGs with it (``seed_workers``; see :mod:`mmloader.readers.seeding`).
    * Epochs advance by themselves: each pass of a loader after a completed pass is the next
      epoch; ``set_epoch`` chooses one; a pass after one left early continues that epoch at its
      next unseen batch (see :class:`mmloader.loading.resumable.Resumable`).
    * ``group``: the data-parallel process group (a ``torch.distributed`` ProcessGroup, or a
      1-D ``DeviceMesh`` such as ``mesh["dp"]``): the tensor-parallel peers of one data-parallel
      rank get the same batches.
    * States name their plan (sources and fingerprints, weights, stages). ``on_change`` says
      what a resume from another plan's state does: ``"error"`` (default) raises
      :class:`mmloader.errors.PlanChangedError` saying what changed; ``"next_epoch"`` starts
      the new plan at the next epoch; ``"continue"`` delivers the rest of the saved epoch under
      the new plan, without the samples already delivered (:mod:`mmloader.loading.replan`).
    * The data ledger: ``keys_at(step, rank)``, ``steps_of(key)`` (:mod:`mmloader.loading.ledger`).

    >>> stream = Stream(dataset, batch_size=64, seed=0)     # doctest: +SKIP
    >>> loader = mmloader.loader(stream)                    # doctest: +SKIP
    >>> for epoch in range(10):                             # doctest: +SKIP
    ...     for batch in loader: ...                        # epochs 0, 1, 2 ... in new orders
    """

    #: Passes continue from the plan; stored data makes no batch wait (see :class:`~.protocol.StreamLike`).
    restarts_each_pass, longest_wait_s = False, 0.0

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        seed: int | None = None,
        drop_last: bool | None = None,
        *,
        order: Order | None = None,
        batching: Batching | None = None,
        lengths: Bucketing | Packing | None = None,
        errors: Errors | str = "raise",
        group: Any = None,
        on_change: str = "error",
        seed_workers: bool = True,
        **unknown: Any,
    ):
        from ..align.mix import LiveMix, Mix
        from .distributed import data_parallel_group

        if getattr(dataset, "is_live_source", False) or isinstance(dataset, LiveMix):
            raise TypeError(
                f"Stream() streams stored samples by epochs; {type(dataset).__name__} is live, streamed by "
                "steps: mmloader.LiveStream(source, batch_size=..., steps=...)"
            )
        if unknown:  # after the check above, so that Stream(live, steps=...) is told of LiveStream
            raise TypeError(unknown_options("Stream", unknown))
        self.order, self.batching = shortcut_stages(order, batching, batch_size, shuffle, seed, drop_last)
        self.errors = Errors.of(errors)
        if lengths is not None and not isinstance(lengths, (Bucketing, Packing)):
            raise TypeError(f"lengths={lengths!r}: expected mmloader.Bucketing(...) or mmloader.Packing(...)")
        choice("on_change", on_change, ON_CHANGE)
        self.mix = dataset if isinstance(dataset, Mix) else None
        if self.mix is None:
            try:
                size = len(dataset)
            except TypeError:
                raise TypeError(f"Stream needs a dataset with a known length, got {type(dataset).__name__}") from None
            if size == 0:
                raise ValueError(f"the dataset is empty (0 samples): {dataset!r}")
        elif self.mix.composition == "source" and not self.batching.size:
            raise ValueError("mix(batch_composition='source') needs Stream(batch_size=...)")
        self.datasets = self.mix.datasets if self.mix is not None else [dataset]
        # The stages' values, read everywhere a plan is laid out.
        self.batch_size, self.drop_last = self.batching.size, self.batching.drop_last
        self.padding, self.collate_fn = self.batching.padding, self.batching.collate_fn
        self.shuffle, self.seed = self.order.shuffle, int(self.order.seed)
        self.on_error, self.on_change, self.seed_workers = self.errors.policy, on_change, seed_workers
        if self.padding == "mask" and self.mix is not None and self.mix.unit(self.batch_size) > 1:
            raise ValueError("padding='mask' splits ranks at sample granularity; batch_composition='source' cannot")
        self.lengths = lengths
        if lengths is not None:
            lengths.check(self)
        self.packer = lengths.packer(self) if lengths is not None else None
        self.mix = token_weighted(self.mix, self.packer)  # (a mix weighed by tokens: now by samples)
        self._identity: dict | None = None
        self._warned_empty = False
        self.control = SharedControl()
        self.group = data_parallel_group(group)
        self.pass_flags = PassFlags()
        self._steps_before = 0  # batches (samples unbatched) this rank delivered of the resumed epoch before
        self._len_read: int | None = None  # what len() last said with no resume pending (a framework's epoch)
        self.builder = BatchBuilder(
            self.datasets,
            self.mix.names if self.mix is not None else None,
            self.collate_fn,
            self.errors,
            self.control,
        )
        self._resume: dict | None = None
        self.resumed_epochs: dict[int, dict] = {}  # how each epoch resumed mid-way was delivered (the ledger's)
        if self.mix is not None:
            error, problems = self.mix.problems(self.batch_size)
            if error:
                raise ValueError(error)
            for problem in problems:
                warnings.warn(f"mmloader.mix: {problem}", stacklevel=2)

    # -- epoch, place in the world, resume -------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's plan; persistent workers see it on their next pass.

        A resume pending for this very epoch is kept (the natural loop
        ``load_state_dict(state)`` ... ``set_epoch(epoch)`` continues mid-epoch);
        one pending for another epoch is dropped, with a warning.
        """
        whole("set_epoch(epoch)", epoch, 0)
        epoch = int(epoch)
        pending = self._resume
        if self._finishing(epoch):
            # The state was taken after epoch `epoch`'s last batch, and a framework whose own counters
            # say that epoch is not over (Lightning, on another number of ranks) asks for it again:
            # nothing of it is left, so this pass is empty and the next one is the saved epoch.
            self._resume = {"epoch": epoch, "ranges": []}
            self.control.epoch, self.pass_flags.epoch_chosen, self._steps_before = epoch, True, 0
            return
        if self.control.resuming and (pending is None or pending["epoch"] != epoch):
            if pending is not None and self.pass_flags.resume_fresh:
                warnings.warn(
                    f"set_epoch({epoch}) drops the pending resume of epoch {pending['epoch']} "
                    "(load_state_dict): that epoch's unseen samples will not be delivered",
                    stacklevel=2,
                )
            self.drop_resume()
        if not self.control.resuming:  # the epoch from its start: no longer as it was resumed
            self.resumed_epochs.pop(epoch, None)
        self.control.epoch = epoch
        self.pass_flags.epoch_chosen = True

    def _finishing(self, epoch: int) -> bool:
        """A fresh resume names the start of ``epoch + 1``: the state was taken at the end of ``epoch``."""
        pending = self._resume
        if not (self.control.resuming and self.pass_flags.resume_fresh and pending is not None):
            return False
        if pending["epoch"] != epoch + 1:
            return False
        return RangeList(pending["ranges"]).as_list() == [[0, len(self.plan(epoch + 1))]]

    def drop_resume(self) -> None:
        """Forget a resume (the next pass of its epoch delivers the whole epoch)."""
        self.control.resuming = False
        if self._resume is not None and self.pass_flags.resume_fresh:  # never delivered
            self.resumed_epochs.pop(self._resume["epoch"], None)
        self._resume, self.pass_flags.resume_fresh, self._steps_before = None, False, 0

    def identity(self) -> dict:
        """What identifies this stream's plan in a state (plain data): each source's name, size
        and fingerprint (and selection), the mix, and every option that changes the plan."""
        if self._identity is None:
            self._identity = plan_identity(self)
        return self._identity

    def plan(self, epoch: int | None = None):
        """The epoch plan: ``len(plan)`` positions, ``plan.lookup(positions) -> (source, index)``
        (packing: positions are rows, ``plan.samples(rows)`` their samples)."""
        e = self.epoch if epoch is None else epoch
        if self.packer is not None:
            return self.packer.plan(self._sample_plan(e), self.seed, e)
        return self._sample_plan(e)

    def _sample_plan(self, epoch: int):
        return self.order.plan(
            None if self.mix is not None else len(self.datasets[0]),
            self.mix,
            epoch,
            self.batch_size,
            **(self.lengths.order_options(self) if self.lengths is not None else {}),
        )

    def prepare(self) -> None:
        """Work a pass's workers would each repeat, done once in the training process before they
        start (they inherit it): packing's token counts and the epoch's rows."""
        if self.packer is not None:
            self.packer.prepare()
            self.plan()

    def _visit(self, plan, epoch: int) -> RangeList:
        r = self._resume
        if self.control.resuming and r is not None and r["epoch"] == epoch:
            return RangeList(r["ranges"])
        return RangeList([(0, len(plan))])

    def _per_rank(self, plan, visit: RangeList, world: int, rank: int = 0) -> int:
        return self.batching.per_rank(len(visit), plan.unit, world, rank)

    def _layout(self, epoch: int | None = None):
        """(rank, world, plan, visit, samples per rank) of the current (or given) epoch."""
        rank, world = self.where()
        e = self.epoch if epoch is None else epoch
        plan = self.plan(e)
        visit = self._visit(plan, e)
        per_rank = self._per_rank(plan, visit, world, rank)
        if per_rank == 0 and len(visit) and not self._warned_empty and torch.utils.data.get_worker_info() is None:
            self._warned_empty = True  # once per stream, in the training process
            warnings.warn(
                f"Stream(drop_last=True): {len(visit)} {'rows' if self.packer is not None else 'samples'} cannot "
                f"fill one batch of {self.batch_size} on each of {world} ranks, so this pass delivers nothing; "
                "use drop_last=False (pads by repeating samples) or a smaller batch_size",
                stacklevel=3,
            )
        return rank, world, plan, visit, per_rank

    def geometry(self) -> dict[str, int]:
        """Plan length, samples and batches per rank for the current epoch and world."""
        rank, world, plan, visit, per_rank = self._layout()
        return {
            "plan": len(plan),
            "visit": len(visit),
            "world": world,
            "rank": rank,
            "samples_per_rank": per_rank,
            "batches_per_rank": batches_per_rank(per_rank, self.batch_size),
            "padding": (
                sum(
                    rows - share
                    for _s, share, rows in (
                        unrepeated_share(len(visit), world, r, self.batch_size) for r in range(world)
                    )
                )
                if self.padding == "mask"
                else max(per_rank * world - len(visit), 0)
            ),
        }

    def __len__(self) -> int:
        """Batches per rank of the epoch when batching, else samples per rank.

        Frameworks read this once per fit as the epoch's length and stop each epoch there
        (Lightning), counting the steps a resumed epoch took before its state was saved. So
        while a resume is pending or delivering it is the larger of the epoch's whole count in
        this world and the resumed epoch's steps (those taken before, in the world that saved
        the state, plus :meth:`remaining`): a resume onto fewer ranks (fewer steps taken
        before than this world's epoch has) keeps every later epoch whole, one onto more ranks
        (more steps) lets the resumed epoch finish. Without a resume the two are equal."""
        resumed = self._steps_before + self.remaining()
        if not self.control.resuming:
            self._len_read = resumed
            return resumed
        return max(resumed, self.epoch_length())

    def epoch_length(self) -> int:
        """Batches (samples unbatched) per rank of the current epoch delivered whole, in this world."""
        rank, world = self.where()
        plan = self.plan()
        whole = self._per_rank(plan, RangeList([(0, len(plan))]), world, rank)
        return batches_per_rank(whole, self.batch_size) if self.batch_size else whole

    def remaining(self) -> int:
        """Batches (samples unbatched) per rank that the current pass delivers."""
        g = self.geometry()
        return g["batches_per_rank"] if self.batch_size else g["samples_per_rank"]

    def progress(self, batches_seen: int, epoch_done: bool = False, next_epoch: int | None = None) -> dict:
        """A resumable state after this rank delivered ``batches_seen`` batches of the current
        epoch (all ranks step together). ``epoch_done``: the epoch's last batch was delivered,
        so the state points at the start of the next epoch (``next_epoch``, default the one after)."""
        epoch = (self.epoch + 1 if next_epoch is None else int(next_epoch)) if epoch_done else self.epoch
        _rank, world, plan, visit, per_rank = self._layout(epoch)
        if epoch_done:
            visit = RangeList([(0, len(plan))])
            per_rank = self._per_rank(plan, visit, world, _rank)
        state = progress_state(
            seed=self.seed,
            epoch=epoch,
            world=world,
            plan_len=len(plan),
            ranges=visit.as_list(),
            samples_per_rank=per_rank,
            consumed=0 if epoch_done else batches_seen * (self.batch_size or 1),
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            steps=0 if epoch_done else self._steps_before + batches_seen,
            plan=self.identity(),
            unrepeated=self.padding == "mask",
        )
        if epoch_done:  # what a framework restored from this checkpoint counts of the epoch that ended
            state["ended_after_steps"] = self._steps_before + batches_seen
        elif self.control.resuming and self._resume is not None and self._resume["epoch"] == epoch:
            # steps counted from the epoch before (see resume); delivered under an earlier plan (replan)
            state.update({k: self._resume[k] for k in ("step_offset", "carried") if self._resume.get(k)})
        return state

    def check_resume(self, state: dict) -> list[tuple[int, int]]:
        """The plan ranges ``state`` leaves to visit of its epoch in this world; raises
        :class:`mmloader.errors.ResumeError` if it does not fit this stream
        (:class:`mmloader.errors.PlanChangedError` for another plan, unless ``on_change``
        says what to do: then the ranges that choice visits, empty for ``"next_epoch"``)."""
        return self._resume_target(state, report=False)[1] or []

    def _resume_target(
        self, state: dict, report: bool = True
    ) -> tuple[int, list[tuple[int, int]] | None, int, list[dict]]:
        """(epoch, ranges to visit or None: from its start, steps before, samples carried: :mod:`.replan`)."""
        _rank, world = self.where()
        state = upgraded(state, self.identity())
        check_fields(state) if isinstance(state, dict) and "version" in state else None  # before planning
        steps = int(state.get("steps", state.get("consumed", 0) // (state.get("batch_size") or 1)))
        try:
            ranges = resume_ranges(
                state, seed=self.seed, plan_len=len(self.plan(state["epoch"])), world=world, plan=self.identity()
            )
            return int(state["epoch"]), ranges, steps, list(state.get("carried") or [])
        except PlanChangedError as changed:
            if self.on_change == "error":
                raise
            return changed_plan_target(self, state, changed, report)

    def resume(self, state: dict) -> None:
        """Continue ``state``'s epoch with only the samples it had not delivered.

        Same world size: the remaining batches are exactly those of an uninterrupted
        run. Another world size or worker count: every unseen sample exactly once.
        A state of another plan follows ``on_change`` (see the class docstring).
        """
        state = upgraded(state, self.identity())
        epoch, ranges, steps, carried = self._resume_target(state)
        if ranges is None:  # on_change="next_epoch": the new plan, from the start of an epoch
            self.drop_resume()
            self.control.epoch = epoch
            self.pass_flags.epoch_chosen = True
            return
        self.control.epoch = epoch
        offset = min(int(state.get("step_offset", 0)), steps)  # steps a framework counted on from the epoch before
        self._resume = {"epoch": epoch, "ranges": ranges, "carried": carried, "step_offset": offset}
        self.control.resuming = True
        self.pass_flags.resume_fresh = True
        self._steps_before = steps
        entire = bool(ranges) and tuple(ranges[0]) == (0, len(self.plan(epoch)))  # (+ a same world's padding)
        if not entire or steps > offset:  # mid-epoch (a changed plan may visit all of it): what
            # the ledger answers from, numbering the epoch's own steps (a framework's offset is none of them)
            self.resumed_epochs[epoch] = {"ranges": ranges, "steps": steps - offset, "state": state}
        ended_after = int(state.get("ended_after_steps", 0))
        if not steps and ended_after and entire:
            # Taken at the end of an epoch of `ended_after` steps, shorter than an epoch here (another
            # world, or a resumed epoch): Lightning keeps counting from there instead of starting the
            # next epoch at 0, so the next epoch's steps are counted on top, to let it finish.
            if ended_after < self.epoch_length():
                self._steps_before = self._resume["step_offset"] = ended_after
        warn_if_a_framework_cuts_the_epoch(self, state)

    def python_work(self) -> list[str]:
        """What in this pipeline runs user Python per sample or batch (transforms, custom
        decoders or readers, a custom collate): it holds the GIL, so worker processes suit it
        better than threads. Empty when only built-in decoders run."""
        reasons = [
            why
            for ds in self.datasets
            for why in getattr(ds, "python_work", lambda: [f"a dataset of type {type(ds).__name__}"])()  # noqa: B023
        ]
        if self.collate_fn is not collate and type(self.collate_fn) is not Collate:  # a subclass is user code
            reasons.append("a custom collate_fn")
        return list(dict.fromkeys(reasons))

    # -- iteration (runs in the DataLoader workers) ---------------------------
    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.iter_worker(worker, workers, seed_globals=info is not None and self.seed_workers)

    def iter_worker(self, worker: int, workers: int, seed_globals: bool = False) -> Iterator[Any]:
        """The batches (or samples) worker ``worker`` of ``workers`` produces: j % workers == worker."""
        for build in self.batch_tasks(worker, workers, seed_globals):
            yield build()

    def batch_tasks(
        self, worker: int = 0, workers: int = 1, seed_globals: bool = False, readers: int | None = None
    ) -> Iterator[Callable[[], Any]]:
        """What :meth:`iter_worker` yields, as zero-argument callables that build each batch
        (or sample) when called: planning stays in order here, building can happen on any
        thread (the thread backend's producers take them from one shared sequence).
        ``readers`` does not change a stored plan (it is part of :class:`~.protocol.StreamLike`).
        ``seed_globals``: also reseed the process-wide RNGs per batch (worker processes only),
        when user Python runs in the batch: nothing else draws from them (built-in randomness
        uses :func:`mmloader.rng`), and reseeding costs ~1 us a sample of a raw batch's ~8."""
        seed_globals = seed_globals and bool(self.python_work())
        for plan, positions, sources, indices, seed, valid in self.planned(worker, workers):
            yield functools.partial(self._build, plan, positions, sources, indices, seed, seed_globals, valid)

    def planned(self, worker: int = 0, workers: int = 1) -> Iterator[tuple]:
        """What each batch (or sample) of worker ``worker`` of ``workers`` is, in order, before it
        is built: ``(plan, positions, sources, indices, seed, valid)``; ``seed`` an int or a
        callable computing it, ``valid`` the rows that count (``padding="mask"``) or None."""
        rank, world, plan, visit, per_rank = self._layout()
        spans = worker_batches(per_rank, self.batch_size, workers, worker)
        yield from self.specs(plan, visit, self.epoch, rank, world, per_rank, spans)

    def specs(
        self, plan, visit: RangeList, epoch: int, rank: int, world: int, per_rank: int, spans: Iterable[tuple[int, int]]
    ) -> Iterator[tuple]:
        """What :meth:`planned` yields, for the batch ``spans`` (offsets within the rank) of any
        epoch, rank and world: a pure function of them (the data ledger asks for any step)."""
        if self.padding == "mask":
            start, share, _rows = unrepeated_share(len(visit), world, rank, self.batch_size)
            for a, b in spans:
                virtual, valid = unrepeated_positions(start, share, a, b)
                positions = visit.take(virtual)
                sources, indices = plan.lookup(positions)
                first: Callable[[], int] | int = functools.partial(
                    batch_seed, self.seed, epoch, rank, int(positions[0])
                )
                yield plan, positions, sources, indices, first, valid
            return
        batches = planned_batches(spans, visit, plan, rank, world, per_rank)
        if self.packer is not None and self.packer.balance:  # each global step's rows dealt by cost
            batches = balanced_batches(spans, visit, plan, rank, world, per_rank, self.packer.balance)
        for positions, sources, indices in batches:
            seed = functools.partial(batch_seed, self.seed, epoch, rank, int(positions[0])) if len(positions) else 0
            yield plan, positions, sources, indices, seed, None

    def build_planned(self, plan, spec: tuple, seed_globals: bool = False) -> Any:
        """Build one batch :meth:`planned` described, from ``spec`` (its tuple after the plan):
        what a process elsewhere (the Ray backend's builders) runs with its copy of the stream."""
        positions, sources, indices, seed, valid = spec
        return self._build(plan, positions, sources, indices, seed, seed_globals, valid)

    def deliver(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches a loader's pass hands to training, from what its backend built (here: all
        of them; a live stream agrees with the other ranks on each, see :mod:`mmloader.live_sources`)."""
        return batches

    def _build(
        self,
        plan,
        positions,
        sources,
        indices,
        seed: int | Callable[[], int],
        seed_globals: bool,
        valid: np.ndarray | None = None,
    ) -> Any:
        enter_batch(seed, seed_globals)
        clock = self.control.batch_clock()
        if self.packer is not None:
            out = self.packer.build(self.builder, plan, positions)
        else:
            out = self.builder.build(plan, positions, sources, indices, batched=bool(self.batch_size))
        clock.done()
        if valid is not None and isinstance(out, dict):  # padding="mask": which rows count
            out["__valid__"] = torch.from_numpy(valid.copy()) if self.batch_size else bool(valid[0])
        return out
