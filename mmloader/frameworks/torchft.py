"""Training that does not stop for a lost replica group (torchft), every sample exactly once.

With torchft, replica groups join a quorum at each step; a group that fails is replaced and
rejoins a few steps later, receiving its state from a healthy peer. :class:`QuorumLoader` deals
each step's batches to the groups of that step's quorum and moves on only when the step
commits, so every sample of an epoch lands in exactly one committed step, whatever happens to
the quorum::

    manager = torchft.Manager(pg=..., load_state_dict=..., state_dict=..., ...)
    loader = QuorumLoader(stream, manager)        # its state travels with the manager's
    batches = iter(loader)
    while loader.epoch < num_epochs:               # the same answer in every group
        optimizer.zero_grad()                      # (torchft's OptimizerWrapper) starts the quorum
        batch = next(batches)                      # this quorum's share of the step
        loss(model(batch)).backward()
        optimizer.step()                           # commits, or not: the loader sees which

The rule, step by step (:mod:`mmloader.planning.quorum`): a step starting at ``base`` (the
epoch's positions committed so far) gives participant ``p`` of ``P`` (``participating_rank()``,
``num_participants()``), rank ``g`` of its group, the positions ``base + (p * G + g) * b``
onwards. When the step commits (the manager's step advances) ``base`` moves past the whole step;
when it does not, the next quorum is dealt the same positions again. The loader goes from one
epoch to the next by itself, at the step the epoch's last samples commit (never between a
quorum and its commit, where a healing group's state would be lost). A group that heals receives
the loader's state from its peer with the rest of the manager's state (``register_state_dict_fn``);
while it heals it does not participate, and its batch is all not valid. Every batch carries
``__valid__``: the rows that count (the epoch's last step pads with repeats, not valid).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Any

try:
    import torchft  # noqa: F401  (the manager this module reads)
except ImportError as e:
    raise ImportError("mmloader.frameworks.torchft needs torchft: pip install 'mmloader[torchft]'") from e

from ..errors import PlanChangedError, ResumeError
from ..loading.ledger import _keys
from ..planning.quorum import deal, step_width
from ..planning.resume import plan_changes
from ..readers.seeding import batch_seed

log = logging.getLogger("mmloader")
STATE_VERSION = 1


@dataclass(frozen=True)
class _Deal:
    """A step dealt and not yet settled: the manager's step it ran at, where it started, how wide."""

    step: int
    base: int
    width: int
    participants: int


class QuorumLoader:
    """Batches of a stored :class:`mmloader.Stream`, dealt step by step to a torchft quorum.

    Args:
        stream: the stream (its ``batch_size`` is each rank's; its own rank split is not used:
            the quorum's is).
        manager: this rank's ``torchft.Manager``; the loader registers its state with it under
            ``key``, so a healing group receives it from a peer.
        group_rank: this rank in its replica group (default: ``$RANK``, as torchft reads it).
        group_world_size: ranks per replica group (default: ``$WORLD_SIZE``).
        key: the name of the loader's state among the manager's.
        prefetch: build the next step's batch ahead, guessing it commits in the same quorum (a
            wrong guess is dropped and the batch built when asked).
    """

    def __init__(
        self,
        stream: Any,
        manager: Any,
        *,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        key: str = "mmloader",
        prefetch: bool = True,
    ):
        if not hasattr(stream, "build_planned"):
            raise TypeError(f"QuorumLoader deals the batches of a stored mmloader.Stream; got {type(stream).__name__}")
        if not getattr(stream, "batch_size", None):
            raise ValueError("QuorumLoader deals batches: give the Stream a batch_size (each rank's)")
        if stream.drop_last:
            raise ValueError(
                "QuorumLoader pads the epoch's last step (its repeats are flagged not valid in __valid__): "
                "drop_last=True has no fixed meaning when the quorum's size changes from step to step"
            )
        self.stream, self.manager = stream, manager
        self.group_rank = int(os.environ.get("RANK", 0)) if group_rank is None else int(group_rank)
        self.group_world = int(os.environ.get("WORLD_SIZE", 1)) if group_world_size is None else int(group_world_size)
        if not 0 <= self.group_rank < self.group_world:
            raise ValueError(f"group_rank={self.group_rank} outside a replica group of {self.group_world} ranks")
        self._lock = threading.Lock()
        self._epoch = int(stream.epoch)
        self._consumed = 0  # positions of the epoch committed
        self._ledger: list[tuple[int, int, int]] = []  # (step, base, participants) of each committed step
        self._finished: tuple[int, list[tuple[int, int, int]]] | None = None  # the last epoch ended: its ledger
        self._deal: _Deal | None = None
        self._plans: tuple[int, Any] = (-1, None)
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mmloader-quorum") if prefetch else None
        )
        self._ahead: tuple[tuple, concurrent.futures.Future] | None = None
        self._quorum: Any = None  # the quorum the last step was dealt in (torchft's future of it)
        try:
            manager.register_state_dict_fn(key, self.load_state_dict, self.state_dict)
        except AssertionError:
            raise ValueError(
                f"the manager already holds a state named {key!r}: give each QuorumLoader of a manager its own key="
            ) from None

    # -- the epoch ---------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next step deals from, once the step before is settled: the same in every
        group between a step's commit and the next quorum (a loop's test: ``while loader.epoch < n``)."""
        with self._lock:
            self._settle()
            return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the first epoch, before the first step. The loader then goes from epoch to epoch
        by itself (a loaded state says where it stands)."""
        with self._lock:
            if self._ledger or self._deal is not None or self._consumed:
                raise ResumeError(
                    f"set_epoch({epoch}): the QuorumLoader goes from epoch to epoch by itself, at the step an "
                    f"epoch's last samples commit (now: epoch {self._epoch}, {self._consumed} samples committed); "
                    "choose the first epoch before the first step"
                )
            self._epoch = int(epoch)

    def _plan(self, epoch: int) -> Any:
        """The epoch's plan (kept for the epoch: asked at every step)."""
        plans = self._plans  # (one read: the prefetch thread may replace it)
        if plans[0] != epoch:
            plans = self._plans = (epoch, self.stream.plan(epoch))
        return plans[1]

    def _total(self) -> int:
        return len(self._plan(self._epoch))

    def __len__(self) -> int:
        """Steps left in the epoch if every step commits in the current quorum's size."""
        participants = max(self.manager.num_participants(), 1)
        width = step_width(participants, self.group_world, self.stream.batch_size)
        with self._lock:
            self._settle()
            return -(-(self._total() - self._consumed) // width)

    def __iter__(self) -> QuorumLoader:
        """Steps, epoch after epoch: the loop decides when to stop (``loader.epoch``)."""
        return self

    def __next__(self) -> Any:
        return self._next()

    # -- one step ----------------------------------------------------------------------------
    def _settle(self) -> None:
        """Account for the step last dealt once it committed (the manager's step advanced): the
        epoch moves on past it, to the next epoch after its last samples. A deal not (yet)
        committed stays (the next step deals it again). Not in a new quorum this group heals in
        before its step is dealt: its step count is its peer's then, and its state arrives with
        the peer's (``_next`` drops that deal). Under the lock."""
        d = self._deal
        if d is None or self.manager.current_step() <= d.step:
            return
        if not self.manager.is_participating() and getattr(self.manager, "_quorum_future", None) is not self._quorum:
            return  # a quorum this group heals in, not dealt yet: its step count is already its peer's
        total = self._total()
        self._ledger.append((d.step, d.base, d.participants))
        self._consumed = min(d.base + d.width, total)
        self._deal = None
        if self._consumed >= total:
            log.info("epoch %d: %d samples committed in %d steps", self._epoch, total, len(self._ledger))
            self._finished = (self._epoch, self._ledger)
            self._epoch, self._consumed, self._ledger = self._epoch + 1, 0, []

    def _next(self) -> Any:
        # the quorum first, without the lock: a peer's state is read under it by torchft's quorum thread
        participants = self.manager.num_participants()
        participant = self.manager.participating_rank()  # None: healing from a peer this step
        step = self.manager.current_step()
        quorum = getattr(self.manager, "_quorum_future", None)  # which quorum this step runs in
        if participants == 0 or (quorum is not None and quorum is self._quorum):
            raise ResumeError(
                "a step's batch is taken after its quorum started, once: call optimizer.zero_grad() (torchft's "
                "OptimizerWrapper) or manager.start_quorum() before next(loader), and take one batch per step"
            )
        self._quorum = quorum
        with self._lock:
            if participant is not None:  # (a group behind its peers has its last deal settled by the state they send)
                self._settle()
            # the new deal replaces one not committed (dealt again) or a healing group's stale one
            total = self._total()
            width = step_width(participants, self.group_world, self.stream.batch_size)
            base, epoch = self._consumed, self._epoch
            self._deal = _Deal(step, base, width, participants)
        spec = self._spec(epoch, base, participants, participant)
        batch = self._built(spec)
        if self._pool is not None and participant is not None and base + width < total:
            self._start_ahead(self._spec(epoch, base + width, participants, participant))
        return batch

    def _spec(self, epoch: int, base: int, participants: int, participant: int | None) -> tuple:
        positions, valid = deal(
            base,
            len(self._plan(epoch)),
            participants,
            participant,
            self.group_world,
            self.group_rank,
            self.stream.batch_size,
        )
        return epoch, positions, valid

    def _build(self, spec: tuple) -> Any:
        epoch, positions, valid = spec
        plan = self._plan(epoch)
        sources, indices = plan.lookup(positions)
        # seeded by position, not by who builds it: a step dealt again is the same batch
        seed = batch_seed(self.stream.seed, epoch, 0, int(positions[0]))
        return self.stream.build_planned(plan, (positions, sources, indices, seed, valid))

    @staticmethod
    def _spec_key(spec: tuple) -> tuple:
        epoch, positions, valid = spec
        return epoch, positions.tobytes(), valid.tobytes()

    def _start_ahead(self, spec: tuple) -> None:
        assert self._pool is not None
        self._ahead = (self._spec_key(spec), self._pool.submit(self._build, spec))

    def _built(self, spec: tuple) -> Any:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == self._spec_key(spec):
            return ahead[1].result()
        return self._build(spec)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the epoch stands after the steps this group committed (plain data): the epoch,
        the positions committed, the manager's step, the committed steps (the ledger) and the
        plan's identity. torchft hands it to a healing group; a checkpoint of the whole job
        holds it too."""
        with self._lock:
            self._settle()
            return {
                "version": STATE_VERSION,
                "epoch": self._epoch,
                "consumed": self._consumed,
                "step": self.manager.current_step(),
                "ledger": [list(x) for x in self._ledger],
                "plan": self.stream.identity(),
            }

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` stands: from a peer (torchft's healing) or a checkpoint. A
        state of another plan is refused (:class:`~mmloader.errors.PlanChangedError`)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ResumeError(f"not a QuorumLoader state (version {STATE_VERSION}): {str(state)[:200]}")
        for name in ("epoch", "consumed", "step"):
            value = state.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ResumeError(f"QuorumLoader state: {name}={value!r}: expected an integer >= 0")
        if not isinstance(state.get("ledger"), list):
            raise ResumeError("QuorumLoader state: no ledger list: not a state QuorumLoader.state_dict() wrote")
        total = len(self._plan(int(state["epoch"])))
        if state["consumed"] > total:
            raise ResumeError(
                f"QuorumLoader state: consumed={state['consumed']} is past the end of epoch {state['epoch']} "
                f"({total} samples): a state of another dataset?"
            )
        changes = plan_changes(state.get("plan"), self.stream.identity())
        if changes:
            raise PlanChangedError(
                "the QuorumLoader state belongs to another plan: "
                + "; ".join(changes)
                + ": resume with the stream it was saved from",
                changes,
            )
        with self._lock:
            self._epoch, self._consumed = int(state["epoch"]), int(state["consumed"])
            self._ledger = [tuple(x) for x in state["ledger"]]  # type: ignore[misc]
            # a step dealt here at the step the state was taken at (this group healing in it) is settled
            # as its peers settle it; one dealt at another step is not this state's
            # (dealt from where the state stands: the peers dealt that step from there)
            if self._deal is not None and self._deal.step != int(state["step"]):
                self._deal = None
            elif self._deal is not None:
                self._deal = replace(self._deal, base=self._consumed)
            self._ahead = None

    # -- the ledger --------------------------------------------------------------------------
    def committed_steps(self, epoch: int | None = None) -> list[tuple[int, int, int]]:
        """``(step, base, participants)`` of each committed step of ``epoch`` (the current one, or
        the one that ended last): the manager's step, the epoch's positions committed before it,
        the groups in its quorum."""
        with self._lock:
            self._settle()
            if epoch is None or epoch == self._epoch:
                return list(self._ledger)
            if self._finished is not None and self._finished[0] == epoch:
                return list(self._finished[1])
        raise KeyError(f"epoch {epoch}: the loader keeps the ledger of the current epoch and the last one ended")

    def keys_at(self, step: int, participant: int, group_rank: int = 0, epoch: int | None = None) -> list:
        """The ``__key__`` of each valid row rank ``group_rank`` of ``participant`` trained at the
        committed ``step`` (the manager's step number) of ``epoch`` (see :meth:`committed_steps`)."""
        e = self.epoch if epoch is None else epoch
        for s, base, participants in self.committed_steps(e):
            if s == step:
                plan = self._plan(e)
                positions, valid = deal(
                    base, len(plan), participants, participant, self.group_world, group_rank, self.stream.batch_size
                )
                kept = positions[valid]
                if not len(kept):
                    return []
                sources, indices = plan.lookup(kept)
                return list(_keys(self.stream, plan, kept, sources, indices))
        raise KeyError(f"step {step} is not a committed step of epoch {e}")

    def close(self) -> None:
        """Stop the prefetch thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["QuorumLoader"]
