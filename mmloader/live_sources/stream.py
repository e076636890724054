"""``LiveStream(live_source, steps=...)``: a live source (alone or mixed with stored data) streamed
to one rank's loader, with the guarantees of a stored stream where they can hold.

* **Steps, not epochs.** A pass ("epoch") is ``steps`` batches; with a stored part, the
  stored epoch (capped at ``steps``). Without ``steps`` and without a stored part a pass runs
  until the source ends.
* **All ranks end together.** Before each batch the ranks agree (one ``all_reduce`` of an
  integer, :mod:`mmloader.live_sources.agree`) that each has one; when a rank's source ends or stalls
  past its timeout, every rank ends the pass at the same batch; when one fails, every rank raises.
* **Readers.** Each rank reads ``num_workers`` slices ``factory(rank, world, worker, workers)``,
  on either backend (a DataLoader worker each, or the thread backend's producers in turn);
  batches record which slice and step they are, so the loader only delivers an unbroken run
  of steps.
* **Checkpoints.** A slice whose iterable has ``state_dict()`` is resumed exactly: the state
  after the last sample of the last delivered batch is kept per slice, saved in
  ``state_dict()`` and handed back (``load_state_dict``) to the slice's next iterable, at a
  resume and at every new pass. Any other source restarts from its own position (a queue,
  a server): at-most-once (what was in flight at the end of a pass is not delivered again),
  said in one log line at a resume.
* **Mixed with stored data**: the stored part is a :class:`mmloader.Stream` of its own, planned
  exactly once per epoch and resumed by arithmetic as ever.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Iterator

import torch
import torch.utils.data

from ..align.mix import LiveMix
from ..errors import PlanChangedError, ResumeError
from ..loading.building import BatchBuilder
from ..loading.control import Controlled, SharedControl
from ..loading.distributed import data_parallel_group
from ..loading.protocol import PassFlags
from ..loading.stages import Batching, Bucketing, Errors, Order, Packing
from ..loading.stages.options import shortcut_stages, unknown_options
from ..loading.stages.values import choice
from ..loading.stream import ON_CHANGE, Stream
from . import delivery, feeding
from .positions import SlicePositions
from .source import LiveSource
from .steps import steps_holding, stored_steps

log = logging.getLogger("mmloader")

STATE_KIND = "mmloader.live/1"


class LiveStream(Controlled, torch.utils.data.IterableDataset):
    """A live source streamed by steps: ``mmloader.LiveStream(source_or_mix, batch_size=..., steps=...)``.

    Args:
        source: a :func:`mmloader.live` source, or a :func:`mmloader.mix` of one with stored datasets.
        batch_size: samples per batch (required).
        shuffle: shuffle the stored part (as for :class:`mmloader.Stream`).
        seed: the stored part's plan and every batch's seed.
        drop_last: as for :class:`mmloader.Stream`; also drops a short last batch when a source ends.
        steps: batches per pass (per epoch); None: a stored part's epoch, or until the source ends.
        order: the stored part's :class:`mmloader.Order`.
        batching: a :class:`mmloader.Batching` (its ``collate_fn`` builds the mixed batches);
            ``padding="mask"`` does not apply (a live stream has no epoch to cover exactly once).
        lengths: a :class:`mmloader.Bucketing` of the stored part; packing does not apply.
        errors: ``"raise"``, or ``"skip"``: a bad live sample is left out of its batch (counted,
            logged with its key); stored samples as for :class:`mmloader.Stream`.
        group: the data-parallel process group (or a 1-D ``DeviceMesh``), as for :class:`mmloader.Stream`.
        on_change: ``"error"`` or ``"next_epoch"`` for a state of another plan (the stored part
            may also ``"continue"``).
        seed_workers: as for :class:`mmloader.Stream`.
    """

    #: Each pass starts its readers afresh (see :class:`~mmloader.loading.protocol.StreamLike`).
    restarts_each_pass = True

    def __init__(
        self,
        source: LiveSource | LiveMix,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        seed: int | None = None,
        drop_last: bool | None = None,
        *,
        steps: int | None = None,
        order: Order | None = None,
        batching: Batching | None = None,
        lengths: Bucketing | None = None,
        errors: Errors | str = "raise",
        group: Any = None,
        on_change: str = "error",
        seed_workers: bool = True,
        **unknown: Any,
    ):
        if unknown:
            raise TypeError(unknown_options("LiveStream", unknown))
        order, batching = shortcut_stages(order, batching, batch_size, shuffle, seed, drop_last)
        error_policy = Errors.of(errors)
        batch_size = batching.size
        if batch_size is None:
            raise ValueError("a live stream needs batch_size= (an integer >= 1), got None")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps={steps!r}: expected an integer >= 1 (batches per pass) or None")
        if batching.padding != "repeat":
            raise ValueError("padding='mask' (evaluation over a stored dataset) does not apply to a live stream")
        if isinstance(lengths, Packing):
            raise ValueError(
                "Packing (token-budget packing) plans rows over a stored epoch; it does not apply to a "
                "live stream: pack the live samples in your collate_fn, or pack the stored data on its own"
            )
        if lengths is not None and not isinstance(lengths, Bucketing):
            raise TypeError(f"lengths={lengths!r}: expected mmloader.Bucketing(...) for a live stream's stored part")
        choice("on_change", on_change, ON_CHANGE)
        self.batch_size, self.steps, self.seed = batch_size, steps, int(order.seed)
        self.drop_last, self.on_change = batching.drop_last, on_change
        self.seed_workers, self.collate_fn, self.on_error = seed_workers, batching.collate_fn, error_policy.policy
        collate_fn = batching.collate_fn
        self.group = data_parallel_group(group)
        self.stored: Stream | None = None
        if isinstance(source, LiveMix):
            self.source, self.share, self.composition = source.live, source.share, source.composition
            live_rows = round(batch_size * self.share) if self.composition == "sample" else 0
            if self.composition == "sample" and not 0 < live_rows < batch_size:
                raise ValueError(
                    f"mix(): a live share of {self.share:.3g} gives {live_rows} live samples in a batch of "
                    f"{batch_size}; use batch_composition='source' (whole batches alternate) or another batch_size"
                )
            if self.composition == "sample" and abs(live_rows / batch_size - self.share) > 0.01:
                log.warning(
                    "mix(): batches of %d hold %d live samples: a share of %.3f, not the %.3f asked",
                    batch_size,
                    live_rows,
                    live_rows / batch_size,
                    self.share,
                )
            self.live_rows = live_rows
            self.stored = Stream(
                source.stored,
                order=order,
                batching=Batching(
                    batch_size - live_rows if self.composition == "sample" else batch_size,
                    batching.drop_last,
                    collate_fn=collate_fn,
                ),
                lengths=lengths,
                errors=error_policy,
                seed_workers=seed_workers,
                group=group,
                on_change=on_change,
            )
            self.live_name = source.live_name
            self.control = self.stored.control
            self.builder = BatchBuilder(
                self.stored.datasets,
                source.names,
                collate_fn,
                error_policy,
                self.control,
                packed_also=self.source.packed_modalities,
            )
        elif getattr(source, "is_live_source", False):
            if lengths is not None:
                raise TypeError(
                    "a live stream without stored data has no stored part to bucket: lengths= does not apply"
                )
            self.source, self.share, self.composition, self.live_rows = source, 1.0, "sample", batch_size
            self.live_name = source.name
            self.control = SharedControl()
            self.builder = BatchBuilder([], None, collate_fn, error_policy, self.control, self.source.packed_modalities)
        else:
            raise TypeError(
                f"LiveStream needs an mmloader.live source or a mix with one, got {type(source).__name__}: "
                "a stored dataset streams with mmloader.Stream"
            )
        self.pass_flags = PassFlags()
        self._steps_before = 0  # batches of the current epoch delivered before a resume
        self.slices = SlicePositions(self.source, self.live_name)  # where each live slice is
        self._warned_cut = False
        self.ended: str | None = None  # why the last pass ended before its length, if it did

    # -- the protocol the loaders share with Stream ---------------------------
    @property
    def longest_wait_s(self) -> float:
        """How long a batch may rightly wait for its live samples (each waits up to the source's
        ``timeout``): a loader's deadline for its builders is never shorter by default."""
        return self.source.timeout * (self.batch_size or 1)  # (at most: a batch of live samples)

    @property
    def datasets(self) -> list[Any]:
        """The stored datasets and the live source (what the loaders ask about decoding)."""
        return [*(self.stored.datasets if self.stored is not None else []), self.source]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (pass) the next pass delivers, from its start (the live source goes on
        from where it is); a resume pending for this same epoch is kept."""
        epoch = int(epoch)
        if self.control.resuming and self._resume_epoch != epoch:
            self.drop_resume()
        if self.stored is not None:
            self.stored.set_epoch(epoch)
        self.control.epoch = epoch
        self.pass_flags.epoch_chosen = True

    _resume_epoch: int | None = None

    def drop_resume(self) -> None:
        """Forget a resume's place in its epoch (the live slices keep their positions)."""
        if self.stored is not None:
            self.stored.drop_resume()
        self.control.resuming = False
        self.pass_flags.resume_fresh, self._steps_before, self._resume_epoch = False, 0, None

    def python_work(self) -> list[str]:
        """What runs user Python per sample: the live source always does (its iterables)."""
        return [*(self.stored.python_work() if self.stored is not None else []), *self.source.python_work()]

    def identity(self) -> dict:
        """What identifies this stream's plan in a state (plain data)."""
        return {
            "live": self.live_name,
            "share": self.share,
            "composition": self.composition,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "seed": self.seed,
        }

    # -- how long a pass is -----------------------------------------------------
    def remaining(self) -> int:
        """Batches this pass delivers unless the source ends first (``sys.maxsize``: no bound)."""
        return self._capped(self._uncapped())

    def _capped(self, uncapped: int) -> int:
        """A pass of ``uncapped`` batches under the ``steps`` cap."""
        return uncapped if self.steps is None else max(min(self.steps - self._steps_before, uncapped), 0)

    def _uncapped(self) -> int:
        """The pass without the ``steps`` cap: the rest of the stored epoch, or no bound."""
        if self.stored is None:
            return sys.maxsize
        left = self.stored.remaining()
        if self.composition == "source":  # steps until the stored epoch's last batch
            left = steps_holding(left, self._steps_before, self.share)
        return left

    def __len__(self) -> int:
        """Batches per pass (for frameworks); a stream without a bound has no length."""
        left = self.remaining()
        if left == sys.maxsize:
            raise TypeError("a live stream without steps= (and without stored data) has no length")
        return self._steps_before + left

    # -- states -------------------------------------------------------------------
    def progress(self, batches_seen: int, epoch_done: bool = False, next_epoch: int | None = None) -> dict:
        """A resumable state after this rank delivered ``batches_seen`` batches of this pass."""
        epoch = (self.epoch + 1 if next_epoch is None else int(next_epoch)) if epoch_done else self.epoch
        stored = None
        if self.stored is not None:
            before, share, composition = self._steps_before, self.share, self.composition
            seen = stored_steps(before + batches_seen, share, composition) - stored_steps(before, share, composition)
            stored = self.stored.progress(seen, epoch_done=epoch_done, next_epoch=next_epoch)
        return {
            "kind": STATE_KIND,
            "epoch": epoch,
            "steps": 0 if epoch_done else self._steps_before + batches_seen,
            "plan": self.identity(),
            "live": self.slices.state(batches_seen),
            "stored": stored,
        }

    def check_resume(self, state: dict) -> list[tuple[int, int]]:
        """Check that ``state`` fits this stream (raises :class:`mmloader.errors.ResumeError` or
        :class:`mmloader.errors.PlanChangedError`); the stored part's ranges, if any."""
        self._changed(state)
        if self.stored is not None and state.get("stored") is not None:
            return self.stored.check_resume(state["stored"])
        return []

    def _changed(self, state: dict) -> list[str]:
        if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
            raise ResumeError(
                f"this state is not a live stream's (kind {state.get('kind') if isinstance(state, dict) else None!r}): "
                f"a live stream over {self.live_name!r} resumes from its own state_dict()"
            )
        saved, now = state.get("plan") or {}, self.identity()
        changes = [f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in now if saved.get(k) != now[k]]
        if changes and self.on_change == "error":
            raise PlanChangedError(
                f"the state belongs to another live plan ({'; '.join(changes)}); "
                "Stream(on_change='next_epoch') starts the new plan at the next epoch",
                changes,
            )
        if (state.get("stored") is None) != (self.stored is None):
            raise ResumeError(
                "the state is of a live stream " + ("without" if self.stored else "with") + " stored data"
            )
        return changes

    def resume(self, state: dict) -> None:
        """Continue ``state``'s epoch at its next step: the stored part by arithmetic, each live
        slice from its saved position (exactly, when the source can say where it is)."""
        changes = self._changed(state)
        self.slices.load(state.get("live") or {})
        epoch, steps = int(state["epoch"]), int(state.get("steps", 0))
        if changes:  # on_change="next_epoch" (or "continue": the stored part's own choice)
            log.warning("resume: the live plan changed (%s): the new plan starts at the next epoch", "; ".join(changes))
            epoch, steps = epoch + (1 if steps else 0), 0
        if self.stored is not None:
            if changes:
                self.stored.drop_resume()
                self.stored.control.epoch = epoch
            else:
                self.stored.resume(state["stored"])
                epoch = self.stored.epoch
                steps = steps if self.stored.control.resuming else 0
        self.control.epoch = epoch
        self.control.resuming = bool(steps)
        self._steps_before, self._resume_epoch = steps, epoch
        self.pass_flags.resume_fresh = True

    # -- delivering (the training process) -------------------------------------
    def deliver(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches of this pass, each only once every rank has one (see the module docstring).
        A rank that leaves the pass early (a ``break``) says so to the others, which end it at
        the same step rather than wait for it."""
        return delivery.deliver(self, batches)

    # -- building (DataLoader workers, or the thread backend's producers) -------
    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for build in self.batch_tasks(worker, workers, seed_globals=info is not None and self.seed_workers):
            yield build()

    def batch_tasks(
        self, worker: int = 0, workers: int = 1, seed_globals: bool = False, readers: int | None = None
    ) -> Iterator[Callable[[], Any]]:
        """Zero-argument callables building this builder's batches, in step order: step ``j`` of
        the pass is built by worker ``j % workers`` and reads slice ``(before + j) % readers`` of
        its rank (``readers``: default ``workers``; the thread backend, one builder, passes its
        ``num_workers``, so both backends read the same slices in the same order). Each builds
        ``(batch, info)``; a batch takes its live samples when it is built, in the order it was
        planned (a ticket per slice), so a slow source holds back no batch already built."""
        return feeding.batch_tasks(self, worker, workers, seed_globals, readers)
