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

import functools
import logging
import sys
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.utils.data

from ..align.mix import LiveMix
from ..errors import LiveSourceError, PlanChangedError, ResumeError, SampleError
from ..loading.building import BatchBuilder
from ..loading.control import Controlled, SharedControl
from ..loading.distributed import data_parallel_group
from ..loading.stages import Batching, Bucketing, Errors, Order, Packing
from ..loading.stages.options import shortcut_stages, unknown_options
from ..loading.stages.values import choice
from ..loading.stream import ON_CHANGE, Stream
from ..readers.seeding import batch_seed, enter_batch
from .agree import ENDED, FAILED, READY, agree, agreement_group
from .fetch import Fetcher
from .source import LiveSource

log = logging.getLogger("mmloader")

STATE_KIND = "mmloader.live/1"
_EMPTY = np.zeros(0, dtype=np.int64)


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
        self._epoch_chosen = False
        self._resume_fresh = False
        self._steps_before = 0  # batches of the current epoch delivered before a resume
        self._slices: dict[str, Any] = {}  # slice -> its source's state after the last delivered batch
        self._layout: dict | None = None  # {"world", "workers"} of the slices in _slices
        self._slices_before_last: dict[str, Any] = {}
        self._delivered = 0  # batches delivered in the current pass
        self._fetchers: dict[str, Fetcher] = {}  # this process's open readers (closed when a pass ends)
        self._warned_layout = self._warned_resume = self._warned_cut = False
        self._restarted_passes = 0  # passes after which a source that cannot say where it is restarts
        self.ended: str | None = None  # why the last pass ended before its length, if it did

    # -- the protocol the loaders share with Stream ---------------------------
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
        self._epoch_chosen = True

    _resume_epoch: int | None = None

    def drop_resume(self) -> None:
        """Forget a resume's place in its epoch (the live slices keep their positions)."""
        if self.stored is not None:
            self.stored.drop_resume()
        self.control.resuming = False
        self._resume_fresh, self._steps_before, self._resume_epoch = False, 0, None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_fetchers"] = {}  # threads stay in the process that started them
        return state

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
    def _is_live_step(self, step: int) -> bool:
        """Whether step ``step`` of an epoch is a live batch (``batch_composition="source"``)."""
        return int(np.floor((step + 1) * self.share)) > int(np.floor(step * self.share))

    def _stored_steps(self, steps: int) -> int:
        """Stored batches among an epoch's first ``steps`` steps."""
        if self.composition == "sample":
            return steps
        return steps - int(np.floor(steps * self.share))

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
            done = self._stored_steps(self._steps_before)
            lo, hi = 0, int((left + 1) / (1 - self.share)) + 2
            while lo < hi:  # the fewest steps after steps_before holding `left` stored batches
                mid = (lo + hi) // 2
                if self._stored_steps(self._steps_before + mid) - done >= left:
                    hi = mid
                else:
                    lo = mid + 1
            left = lo
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
        slices = self._slices_before_last if batches_seen == self._delivered - 1 else self._slices
        stored = None
        if self.stored is not None:
            seen = self._stored_steps(self._steps_before + batches_seen) - self._stored_steps(self._steps_before)
            stored = self.stored.progress(seen, epoch_done=epoch_done, next_epoch=next_epoch)
        return {
            "kind": STATE_KIND,
            "epoch": epoch,
            "steps": 0 if epoch_done else self._steps_before + batches_seen,
            "plan": self.identity(),
            "live": {
                "source": self.live_name,
                "slices": dict(slices),
                "layout": self._layout,
                # None: no live batch delivered yet, so nothing to say
                "checkpointable": all(v is not None for v in slices.values()) if slices else None,
            },
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
        live = state.get("live") or {}
        saved_slices = dict(live.get("slices") or {})
        # (a pass that continues its own epoch resumes from this stream's own state: no news)
        if live.get("checkpointable") is False and saved_slices != self._slices and not self._warned_resume:
            self._warned_resume = True
            log.warning(
                "resume: live source %r cannot say where it is (its iterables have no state_dict()): "
                "it goes on from its own position; samples in flight when the checkpoint was taken are "
                "not delivered again (at-most-once)",
                self.live_name,
            )
        self._slices, self._layout = saved_slices, live.get("layout")
        self._slices_before_last = dict(self._slices)
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
        self._resume_fresh = True

    # -- delivering (the training process) -------------------------------------
    def deliver(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches of this pass, each only once every rank has one (see the module docstring).
        A rank that leaves the pass early (a ``break``) says so to the others, which end it at
        the same step rather than wait for it."""
        rank, world = self._where()
        group = agreement_group(self.group) if world > 1 else None
        uncapped = self._uncapped()
        total = self._capped(uncapped)
        self._delivered, self.ended = 0, None
        self._warn_steps_cut(total, uncapped)
        expected, last_short = 0, None
        try:
            while expected < total:
                code, error, batch, info, why = READY, None, None, None, ""
                try:
                    batch, info = next(batches)
                    if info.get("ended"):
                        code, why = ENDED, self._why_ended(info)
                    elif info["step"] != expected:  # a reader ended: later steps must not go first
                        code, why = ENDED, f"a reader of the source ended before batch {expected + 1} of the pass"
                except StopIteration:  # the readers' last batches were short: the last one says why
                    code, why = (
                        ENDED,
                        (
                            self._why_ended({**last_short, "ended": last_short["short"]})
                            if last_short is not None
                            else "its readers ran out of samples or waited too long for one"
                        ),
                    )
                except Exception as e:
                    code, error = FAILED, e
                agreed, who = agree(code, group, world, rank)
                if agreed == READY:
                    assert info is not None  # (READY: this rank had a batch, with its info)
                    last_short = info if info.get("short") else last_short
                    self._record(info)
                    expected += 1
                    yield batch
                    continue
                if error is not None:
                    raise error
                if agreed == FAILED:
                    raise LiveSourceError(
                        f"live source {self.live_name!r}: the loader of rank {who} failed (its error is in its "
                        f"log); rank {rank} ends its pass too, after {expected} batches"
                    )
                self.ended = (
                    f"on rank {who}, {why}"
                    if who == rank
                    else f"rank {who}'s source ran out, waited too long for a sample, or its loop left the pass"
                    " (its log says which)"
                )
                normal_end = self.steps is None and who == rank and "ran out of samples" in why
                (log.info if normal_end else log.warning)(  # a pass without steps= ends with its source
                    "live source %r: every rank ends this pass after %d of %s batches, together so that no "
                    "rank waits for another: %s%s",
                    self.live_name,
                    expected,
                    total if total != sys.maxsize else "unbounded",
                    self.ended,
                    "; the stored part's epoch goes on in the next pass, unless set_epoch chooses another"
                    if self.stored is not None
                    else "",
                )
                return
        except GeneratorExit:
            if group is not None and expected < total:  # left early: the others must not wait for us
                agree(ENDED, group, world, rank)
            raise
        finally:
            # The thread backend's readers first (workers' die with them): a producer waiting in
            # one returns at once, so stopping the backend's producers waits for none of them.
            for fetcher in list(self._fetchers.values()):
                fetcher.close()
            self._fetchers.clear()
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            if any(state is None for state in self._slices.values()):
                self._restarted_passes += 1  # its next pass starts sources that cannot say where they are

    def _why_ended(self, info: dict) -> str:
        """What happened to the reader that could not fill its batch, and what to do, in words."""
        rank, part = info["slice"].split("/")
        if getattr(self.source, "split", None) == "deal":  # one stream, dealt to every reader
            reader = f"the source's one stream (dealt to the readers; here rank={rank}, worker={part}'s turn)"
        else:
            reader = f"the source's reader for rank={rank}, worker={part} (what it yields for those arguments)"
        at = f"batch {info['step'] + 1} of the pass"
        if info["ended"] == "stalled":
            return (
                f"{reader} got no sample for {self.source.timeout:g} s at {at} (the source's timeout=): "
                "its producer is slow or stuck; give live(..., timeout=) more seconds, or on_stall='raise' "
                "to fail instead of ending the pass"
            )
        if self.steps is None:  # a pass that runs until the source ends: nothing to mend
            return f"{reader} ran out of samples at {at} (its iterable ended, or its queue closed)"
        more = "the stream" if getattr(self.source, "split", None) == "deal" else "every reader"
        return (
            f"{reader} ran out of samples at {at}, before steps={self.steps} (its iterable ended, or its "
            f"queue closed): give {more} enough samples for the pass, or fewer steps="
        )

    def _warn_steps_cut(self, total: int, stored_steps: int) -> None:
        """Say once that ``steps=`` cuts the stored part's epoch (the rest of it is not delivered)."""
        if self.stored is None or self.steps is None or self._warned_cut:
            return
        if stored_steps > total:
            self._warned_cut = True
            log.warning(
                "live stream: steps=%d cuts each pass short of the stored part's epoch (%d batches here): "
                "the rest of each stored epoch is not delivered; steps=None makes a pass the stored epoch",
                self.steps,
                stored_steps + self._steps_before,
            )

    def _record(self, info: dict) -> None:
        self._slices_before_last = dict(self._slices)
        if info.get("layout") != self._layout:  # another worker count: the old slices are gone
            if any(v is not None for v in self._slices.values()) and not self._warned_layout:
                self._warned_layout = True
                log.warning(
                    "live source %r: its positions were saved for %s readers, this pass reads with %s, so "
                    "each reader started from the source's own position: pin num_workers= (its default "
                    "follows the CPU count) for an exact resume",
                    self.live_name,
                    self._layout,
                    info.get("layout"),
                )
            self._slices, self._layout = {}, info.get("layout")
        if info.get("slice") is not None:
            self._slices[info["slice"]] = info.get("state")
        self._delivered += 1

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
        seed_globals = seed_globals and bool(self.python_work())
        rank, world = self._where()
        total, before, epoch = self.remaining(), self._steps_before, self.epoch
        stored = self._stored_parts(worker, workers, before)
        slices = readers or workers
        layout = {"world": world, "workers": slices}
        fetchers: dict[int, Fetcher] = {}
        tickets: dict[int, int] = {}
        try:
            for j in range(worker, total, workers):
                # Step g of the epoch reads slice g % slices, whichever worker builds it: a pass
                # always starts at worker 0 (the DataLoader's round robin), a resumed one at `before`.
                part = (before + j) % slices
                slice_key = f"{rank}/{part}"
                fetcher = fetchers.get(part)
                if fetcher is not None and fetcher.finished:  # its source ended or stalled: no later step
                    return
                step = before + j
                live_step = self.composition == "sample" or self._is_live_step(step)
                n_live = (self.live_rows if self.composition == "sample" else self.batch_size) if live_step else 0
                planned = None
                if self.stored is not None and n_live < self.batch_size:
                    planned = next(stored, None)
                    if planned is None:  # (never: the pass is no longer than the stored epoch)
                        return
                if n_live and fetcher is None:
                    fetcher = fetchers[part] = self._open(rank, world, part, slices, slice_key, layout)
                if planned is not None:
                    plan, positions, sources, indices, seed, _valid = planned
                else:
                    plan, positions, sources, indices = None, _EMPTY, _EMPTY, _EMPTY
                    seed = functools.partial(batch_seed, self.seed, epoch, rank, step)
                info = {"step": j, "slice": slice_key if n_live else None, "layout": layout}
                yield functools.partial(
                    self._build,
                    plan,
                    positions,
                    sources,
                    indices,
                    n_live,
                    fetcher if n_live else None,
                    tickets.get(part, 0) if n_live else None,
                    seed,
                    seed_globals,
                    info,
                )
                if n_live:
                    tickets[part] = tickets.get(part, 0) + 1
        except GeneratorExit:  # the pass was left: nothing will take what is read
            for opened in fetchers.values():
                opened.close()
            raise

    def _stored_parts(self, worker: int, workers: int, before: int) -> Iterator[tuple | None]:
        """The stored part of each of this reader's steps that has one, in order."""
        if self.stored is None:
            return iter(())
        if self.composition == "sample":  # stored batch j is step j's, built by the same reader
            return self.stored.planned(worker, workers)
        return self._stored_by_step(worker, workers, before)

    def _stored_by_step(self, worker: int, workers: int, before: int) -> Iterator[tuple | None]:
        assert self.stored is not None
        done = self._stored_steps(before)
        plans = self.stored.planned(0, 1)
        k = 0  # stored batches of this pass taken from `plans` so far
        for j in range(worker, sys.maxsize, workers):
            if self._is_live_step(before + j):
                continue
            want = self._stored_steps(before + j + 1) - done - 1  # step j holds stored batch `want` of the pass
            part = None
            while k <= want:
                part = next(plans, None)
                if part is None:
                    return
                k += 1
            yield part

    def _open(self, rank: int, world: int, part: int, workers: int, slice_key: str, layout: dict) -> Fetcher:
        """This reader's slice: a new iterable from the factory (made in the reader's thread, so
        its wait is bounded too), put back at the slice's last delivered position if it has one."""
        old = self._fetchers.pop(slice_key, None)
        if old is not None:
            old.close()
        where = f"live source {self.live_name!r} (rank {rank}, reader {part} of {workers})"
        same = self._layout == layout
        saved = self._slices.get(slice_key) if same else None
        deal = (rank * workers + part, world * workers) if self.source.split == "deal" else (0, 1)
        fetcher = Fetcher(
            functools.partial(self.source.open, rank, world, part, workers),
            where,
            self.source.buffer,
            deal,
            saved=saved,
            restarts=same and slice_key in self._slices and saved is None and self._restarted_passes == 1,
        )
        self._fetchers[slice_key] = fetcher
        return fetcher

    def _build(
        self,
        plan,
        positions,
        sources,
        indices,
        n_live: int,
        fetcher: Fetcher | None,
        ticket: int | None,
        seed: int | Callable[[], int],
        seed_globals: bool,
        info: dict,
    ) -> tuple[Any, dict]:
        """``(batch, info)``; ``(None, info)`` with ``info["ended"]`` when the source ended or
        stalled before the batch could be made (the loader then ends the pass)."""
        enter_batch(seed, seed_globals)
        samples: list = []
        info = dict(info)
        if fetcher is not None:
            taken = fetcher.take(n_live, self.source.timeout, self.source.on_stall, ticket)
            samples, info["state"] = taken.samples, taken.state
            if taken.short is not None:
                log.info("%s %s at step %d", fetcher.where, taken.short, info["step"])
                if not samples or self.drop_last or plan is not None:
                    info["ended"] = taken.short
                    return None, info
                info["short"] = taken.short
        keys = [f"{self.live_name}/{info['slice']}/{info['step']}/{i}" for i in range(len(samples))]
        rows = [row for row in (self._row(sample, key) for sample, key in zip(samples, keys)) if row is not None]
        if samples and not rows and plan is None:
            raise LiveSourceError(
                f"live source {self.live_name!r}: every sample of step {info['step']} failed to decode"
            )
        return self.builder.build_with_rows(plan, positions, sources, indices, rows), info

    def _row(self, sample: Any, key: str) -> dict | None:
        """One live sample decoded; with ``on_error="skip"`` a bad one is left out of its batch
        (counted in :attr:`skipped`, logged with its key) and None returned: a replacement would
        come from later in the source, outside the batch's checkpointed position."""
        try:
            row = self.source.decode_sample(sample, key)
        except SampleError as e:
            if self.on_error == "raise":
                raise
            self.control.skip("live sample (its batch is one row short)", e)
            return None
        if self.stored is not None:
            row["__source__"] = self.live_name
        return row
