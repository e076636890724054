"""QuorumLoader over random quorum histories (Hypothesis): groups join and miss quorums, die and
come back, heal from a peer, commit or fail steps alone or together, across epoch boundaries and a
restart of the whole job from a checkpoint.

The quorum is :class:`Quorums`, a model of the torchft 0.2 manager's step semantics as QuorumLoader
reads them (``num_participants``, ``participating_rank``, ``current_step``, ``is_participating``,
``register_state_dict_fn``; a group behind the quorum's step takes that step at once and its peer's
user state at ``should_commit``). tests/frameworks/test_torchft.py runs the same loader against the
real torchft; this test covers histories no real job can be steered through in seconds."""

from __future__ import annotations

import collections
import os
from concurrent.futures import Future

import pytest
from conftest import write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmloader
from mmloader.errors import ResumeError

pytest.importorskip("torchft")
from mmloader.frameworks.torchft import QuorumLoader  # noqa: E402

#: The contract test's profiles (MMLOADER_CONTRACT): fast in `make test-fast`, ci in `make test`
#: (derandomized: the same run every time), deep in `make soak`.
PROFILE = os.environ.get("MMLOADER_CONTRACT", "ci")
EXAMPLES = {"fast": 40, "ci": 200, "deep": 5000}
settings.register_profile(
    f"quorum-{PROFILE}",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=PROFILE != "deep",
    database=None if PROFILE != "deep" else settings.default.database,
    print_blob=True,
    max_examples=EXAMPLES[PROFILE],
)


class Manager:
    """One replica group's manager, as QuorumLoader sees it (see the module docstring)."""

    def __init__(self):
        self.step, self.rank, self.size, self.healing = 0, None, 0, False
        self._quorum_future: Future | None = None
        self.fns: dict = {}
        self.pending: dict | None = None

    def register_state_dict_fn(self, key, load, save):
        assert key not in self.fns
        self.fns[key] = (load, save)

    def num_participants(self) -> int:
        return self.size

    def participating_rank(self):
        return self.rank

    def current_step(self) -> int:
        return self.step

    def is_participating(self) -> bool:
        return self.rank is not None and not self.healing


class Quorums:
    """Groups of one rank each and the steps they take together; ``log`` and ``commits`` (shared
    by the jobs of a run) record every batch and every commit."""

    def __init__(self, stream_factory, groups: int, log: list, commits: list, state: dict | None = None):
        self.make, self.log, self.commits = stream_factory, log, commits
        self.managers: dict[int, Manager] = {}
        self.loaders: dict[int, QuorumLoader] = {}
        for g in range(groups):
            self.start(g, state)

    def start(self, g: int, state: dict | None = None) -> None:
        m = self.managers[g] = Manager()
        loader = self.loaders[g] = QuorumLoader(self.make(), m, group_rank=0, group_world_size=1, prefetch=False)
        if state is not None:  # a whole job restarted from its checkpoint
            m.step = state["manager"]
            loader.load_state_dict(state["loader"])

    def front(self) -> int:
        return max(m.step for m in self.managers.values())

    def step(self, joiners: list[int], outcome: str, dies: int | None) -> None:
        """One quorum of ``joiners`` (one of them at the front step): each takes a batch, then
        ``outcome`` says who commits (``all``, ``none``, ``first``: the first participant alone)."""
        attempt = len(self.commits) + len(self.log)
        top = max(self.managers[g].step for g in joiners)
        ranked = sorted(g for g in joiners if self.managers[g].step == top)
        sender = ranked[0]
        for g in joiners:
            m = self.managers[g]
            m._quorum_future = Future()
            m.size, m.healing = len(ranked), m.step < top
            m.rank = ranked.index(g) if g in ranked else None
            if m.healing:  # torchft: the step at once, the peer's state (read now) at should_commit
                m.step = top
                m.pending = {k: save() for k, (_load, save) in self.managers[sender].fns.items()}
        for g in joiners:
            self.loaders[g].committed_steps()  # the ledger read after the quorum formed (it settles)
            batch = next(self.loaders[g])
            m = self.managers[g]
            assert len(batch["__key__"]) == len(batch["__valid__"])
            keys = [k for k, v in zip(batch["__key__"], batch["__valid__"].tolist()) if v]
            self.log.append((attempt, top, m.rank, len(batch["__key__"]), keys))
        for g in joiners:
            if g == dies:  # killed before should_commit (its gradients were in the allreduce)
                del self.managers[g], self.loaders[g]
                continue
            m = self.managers[g]
            if m.pending is not None:
                for k, (load, _save) in m.fns.items():
                    load(m.pending[k])
                m.pending = None
            ok = outcome == "all" or (outcome == "first" and g == sender)
            self.commits.append((attempt, ok))
            if ok:
                m.step += 1


def epochs(log: list, commits: list, n: int) -> list[collections.Counter]:
    """The committed attempts' keys, step after step, cut into epochs of ``n`` samples."""
    done = {a for a, ok in commits if ok}
    steps: dict[int, dict] = {}
    for attempt, step, participant, rows, keys in log:
        if attempt in done and participant is not None:
            slots = steps.setdefault(step, {"attempt": attempt, "slots": {}})
            assert slots["attempt"] == attempt, step  # one committed attempt per step
            slots["slots"][participant] = (rows, keys)
    out = [collections.Counter()]
    for step in sorted(steps):
        rows = {r for r, _k in steps[step]["slots"].values()}
        assert len(rows) == 1, (step, rows)  # every participant a batch of the same size
        keys = [k for _r, ks in steps[step]["slots"].values() for k in ks]
        if len(out[-1]) == n:
            out.append(collections.Counter())
        out[-1].update(keys)
        assert set(out[-1].values()) == {1} and len(out[-1]) <= n, (step, keys)  # never twice in an epoch
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("quorum") / "d.lmdb", 37, "lmdb")


events = st.lists(
    st.tuples(
        st.sets(st.integers(0, 3), min_size=1),  # who joins (of the groups alive)
        st.sampled_from(["all", "all", "none", "first"]),  # who commits
        st.one_of(st.none(), st.integers(0, 3)),  # who dies before should_commit
        st.booleans(),  # the dead groups come back (fresh processes: they heal)
    ),
    min_size=1,
    max_size=60,
)


@settings(settings.get_profile(f"quorum-{PROFILE}"))
@given(events=events, groups=st.integers(1, 4), batch=st.integers(1, 5), restart_at=st.integers(0, 40))
def test_every_sample_once_per_epoch_whatever_the_quorums(data, events, groups, batch, restart_at):
    make = lambda: mmloader.Stream(mmloader.zip(label=mmloader.LabelReader(data, "cls")), batch_size=batch, seed=1)  # noqa: E731
    log: list = []
    commits: list = []
    q = Quorums(make, groups, log, commits)
    for i, (joining, outcome, dies, back) in enumerate(events):
        if i == restart_at and q.loaders:  # the whole job again, from a checkpoint of a group at the front
            front = next(g for g, m in q.managers.items() if m.step == q.front())
            q = Quorums(make, groups, log, commits, {"manager": q.front(), "loader": q.loaders[front].state_dict()})
        if back:
            for g in range(groups):
                if g not in q.loaders:
                    q.start(g)
        joiners = sorted(g for g in joining if g in q.loaders)
        if not joiners or max(q.managers[g].step for g in joiners) < q.front():
            continue  # torchft goes on only with a group at the front (a majority, in practice)
        q.step(joiners, outcome, dies if dies in joiners and len(joiners) > 1 else None)
    cut = epochs(log, commits, 37)
    assert all(len(c) == 37 for c in cut[:-1])  # an epoch that ended holds every sample once


def test_a_batch_before_the_quorum_or_twice_in_a_step_is_refused(data):
    m = Manager()
    loader = QuorumLoader(
        mmloader.Stream(mmloader.zip(label=mmloader.LabelReader(data, "cls")), batch_size=4), m, prefetch=False
    )
    with pytest.raises(ResumeError, match="after its quorum started, once"):
        next(loader)  # no quorum yet
    m._quorum_future, m.size, m.rank = Future(), 1, 0
    next(loader)
    with pytest.raises(ResumeError, match="after its quorum started, once"):
        next(loader)  # the same quorum: a second batch of the step
    with pytest.raises(ResumeError, match="goes from epoch to epoch by itself"):
        loader.set_epoch(3)
    with pytest.raises(ValueError, match="already holds a state named 'mmloader'"):
        QuorumLoader(mmloader.Stream(mmloader.zip(label=mmloader.LabelReader(data, "cls")), batch_size=4), m)
