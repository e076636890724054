"""Nodes between the loader and the loop (mmloader/loading/nodes/): the contract's shared
save/load check on each backend and under a read-ahead stage, and the errors that keep ranks in
step (a node that reads two batches for one, or ends a pass early) and checkpoints honest."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from state_check import check_save_load

import mmloader
from mmloader.errors import MMLoaderError, ResumeError


class StepCount:
    """A stateful batch function: numbers the batches across passes and resumes."""

    def __init__(self):
        self.n = 0

    def __call__(self, batch):
        batch["step"], self.n = self.n, self.n + 1
        return batch

    def state(self):
        return {"n": self.n}

    def reset(self, state):
        self.n = (state or {}).get("n", 0)


def even_text(batch):
    return [len(t) % 2 == 0 for t in batch["t"]]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("nodes") / "a.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(23):
            w.write({"__key__": f"k{i:03d}", "txt": "x" * (i % 7), "cls": i})
    return mmloader.zip(t=mmloader.TextReader(path), label=mmloader.LabelReader(path))


def make(ds, backend="thread", nodes=None, **kw):
    nodes = [mmloader.Map(StepCount()), mmloader.Filter(even_text)] if nodes is None else nodes
    return mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=1), num_workers=2, backend=backend, nodes=nodes, **kw)


@pytest.mark.parametrize("at", [0, 1, 3, 6])
def test_nodes_resume_with_the_loader_on_threads(ds, at):
    check_save_load(lambda: make(ds), at)


@pytest.mark.process
@pytest.mark.parametrize("at", [2, 6])
def test_nodes_resume_with_the_loader_on_worker_processes(ds, at):
    check_save_load(lambda: make(ds, "process", persistent_workers=False), at)


@pytest.mark.parametrize("at", [0, 2, 5])
def test_a_read_ahead_stage_checkpoints_the_nodes_as_of_the_batch_held(ds, at):
    """ToDevice reads one batch ahead: its state is the loader's and the nodes' as of the batch
    the caller holds, never the one read ahead (resuming from it delivers that one again)."""
    check_save_load(lambda: mmloader.ToDevice(make(ds), "cpu"), at)


def test_a_filter_masks_rows_and_keeps_batches_whole(ds):
    plain_batches = list(make(ds, nodes=[]))
    filtered = list(make(ds, nodes=[mmloader.Filter(even_text)]))
    assert len(filtered) == len(plain_batches) == 6
    for a, b in zip(plain_batches, filtered):
        assert a["__key__"] == b["__key__"]
        assert b["__valid__"].tolist() == [len(t) % 2 == 0 for t in a["t"]]
    counted = mmloader.Filter(lambda b: torch.tensor([False] * len(b["__key__"])))
    list(make(ds, nodes=[counted]))
    assert counted.masked == 23  # every row (one rank: the last batch is short, nothing pads)


def test_a_filter_keeps_padding_masked(ds):
    stream = mmloader.Stream(ds, batching=mmloader.Batching(11, padding="mask"), seed=1)
    stream.set_world(1, 2)
    batches = list(
        mmloader.loader(
            stream, num_workers=1, backend="thread", nodes=[mmloader.Filter(lambda b: [True] * len(b["t"]))]
        )
    )
    plain = mmloader.Stream(ds, batching=mmloader.Batching(11, padding="mask"), seed=1)
    plain.set_world(1, 2)
    want = list(mmloader.loader(plain, num_workers=1, backend="thread"))
    assert [b["__valid__"].tolist() for b in batches] == [b["__valid__"].tolist() for b in want]
    assert not all(
        v for b in want for v in b["__valid__"].tolist()
    )  # (rank 1 of 2: 11 samples on 2 batches, a padding row)


@pytest.mark.parametrize(
    "answer",
    [
        lambda b: [True],  # too few
        lambda b: torch.full((len(b["t"]),), 0.5),  # not a flag
        lambda b: [float("nan")] * len(b["t"]),
        lambda b: ["False"] * len(b["t"]),
        lambda b: torch.ones(2, len(b["t"]) // 2, dtype=torch.bool),  # not 1-D
        lambda b: None,
        lambda b: [2] * len(b["t"]),
    ],
)
def test_a_filter_refuses_what_is_not_one_flag_per_row_naming_itself(ds, answer):
    with pytest.raises(
        MMLoaderError, match=r"mmloader.Filter\(.*\): the predicate gave .* first key 'k0.*one bool per row"
    ):
        next(iter(make(ds, nodes=[mmloader.Filter(answer)])))


def test_a_filter_takes_bools_and_zero_one_integers_and_unbatched_samples(ds):
    for answer in (lambda b: np.array([1, 0, 1, 0]), lambda b: torch.tensor([True, False, True, False])):
        batch = next(iter(make(ds, nodes=[mmloader.Filter(answer)])))
        assert batch["__valid__"].tolist() == [True, False, True, False]
    samples = mmloader.loader(
        mmloader.Stream(ds, seed=1),
        num_workers=1,
        backend="thread",
        nodes=[mmloader.Filter(lambda s: s["label"] % 2 == 0)],
    )
    flags = [(int(s["label"]), s["__valid__"]) for s in samples]
    assert len(flags) == 23 and all(valid is (label % 2 == 0) for label, valid in flags)
    unbatched = mmloader.loader(
        mmloader.Stream(ds, seed=1), num_workers=1, backend="thread", nodes=[mmloader.Filter(lambda s: [False])]
    )
    with pytest.raises(MMLoaderError, match="one bool \\(an unbatched sample\\)"):
        next(iter(unbatched))


def test_a_filter_says_what_batches_it_takes(ds):
    listed = mmloader.Stream(ds, batching=mmloader.Batching(4, collate_fn=list), seed=1)
    with pytest.raises(MMLoaderError, match="masks rows of dict batches, counted by their __key__; got a list"):
        next(iter(mmloader.loader(listed, num_workers=1, backend="thread", nodes=[mmloader.Filter(even_text)])))
    inputs_only = mmloader.Map(lambda b: {"t": b["t"]}, name="inputs")
    with pytest.raises(MMLoaderError, match="got a dict without __key__: keep __key__"):
        next(iter(make(ds, nodes=[inputs_only, mmloader.Filter(even_text)])))


class TakesTwo(mmloader.Node):
    def next(self):
        self.source.next()
        return self.source.next()


class EndsEarly(mmloader.Node):
    def __init__(self):
        self.seen = 0

    def next(self):
        self.seen += 1
        if self.seen > 2:
            raise StopIteration
        return self.source.next()


def test_a_node_that_would_put_ranks_out_of_step_is_stopped_by_name(ds):
    with pytest.raises(MMLoaderError, match=r"node TakesTwo read 2 batches to hand on one"):
        next(iter(make(ds, nodes=[TakesTwo()])))
    with pytest.raises(MMLoaderError, match=r"node among \['EndsEarly', 'even_text'\] ended the pass"):
        list(make(ds, nodes=[EndsEarly(), mmloader.Filter(even_text)]))


def test_a_checkpoint_resumes_only_into_the_nodes_it_was_saved_with(ds):
    first = make(ds)
    it = iter(first)
    next(it)
    state = first.state_dict()
    it.close()
    assert state["nodes"] == [{"node": "StepCount", "state": {"n": 1}}, {"node": "even_text", "state": {}}]
    with pytest.raises(ResumeError, match=r"checkpoint's nodes are \['StepCount', 'even_text'\], this loader's \[\]"):
        make(ds, nodes=[]).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"this loader's \['even_text', 'StepCount'\]"):
        make(ds, nodes=[mmloader.Filter(even_text), mmloader.Map(StepCount())]).load_state_dict(state)
    renamed = make(ds, nodes=[mmloader.Map(StepCount(), name="steps"), mmloader.Filter(even_text)])
    with pytest.raises(ResumeError, match="by name and in order"):
        renamed.load_state_dict(state)
    # saved before any node was put in: the nodes start afresh, and a warning says so
    bare = make(ds, nodes=[])
    it = iter(bare)
    next(it)
    old = bare.state_dict()
    it.close()
    counted = StepCount()
    counted.n = 5
    later = make(ds, nodes=[mmloader.Map(counted)])
    with pytest.warns(UserWarning, match="saved without nodes"):
        later.load_state_dict(old)
    assert [b["step"] for b in later] == [0, 1, 2, 3, 4]


def test_what_loader_nodes_takes(ds):
    with pytest.raises(TypeError, match="item 0 is a function, not an mmloader.Node; wrap"):
        make(ds, nodes=[even_text])
    twice = mmloader.Map(StepCount())
    with pytest.raises(ValueError, match="a node appears twice"):
        make(ds, nodes=[twice, twice])
    with pytest.raises(TypeError, match="fn must be callable"):
        mmloader.Map(3)


def test_node_states_cross_epochs_and_a_pass_left_early(ds):
    loader = make(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = [b["step"] for b in loader]
        it = iter(loader)
        left = [next(it)["step"] for _ in range(2)]
        it.close()
        rest = [b["step"] for b in loader]  # the same epoch, from its next unseen batch
    assert first == list(range(6)) and left == [6, 7] and rest == [8, 9, 10, 11]
    assert loader.state_dict()["nodes"][0]["state"] == {"n": 12}


def test_a_read_ahead_stage_failing_ahead_keeps_the_state_of_the_batch_never_handed_over(ds):
    """ToDevice takes batch 2 before it hands over batch 1; when a node fails on batch 2, the
    caller never got batch 1: the state says so (the nodes' too), so a resume delivers it."""

    def fail_second(batch):
        if batch["step"] == 1:
            raise RuntimeError("bad batch")
        return batch

    stage = mmloader.ToDevice(make(ds, nodes=[mmloader.Map(StepCount()), mmloader.Map(fail_second)]), "cpu")
    with pytest.raises(RuntimeError, match="bad batch"):
        next(iter(stage))
    state = stage.state_dict()
    assert state["steps"] == 0 and state["nodes"][0]["state"] == {"n": 0}


def test_a_map_that_returns_nothing_or_a_state_that_is_not_plain_data_is_named(ds):
    def forgets(batch):
        batch["x"] = 1

    with pytest.raises(MMLoaderError, match=r"mmloader.Map\(.*forgets\): the function returned None"):
        next(iter(make(ds, nodes=[mmloader.Map(forgets)])))

    class NumpyCount(StepCount):
        def state(self):
            return {"n": np.int64(self.n)}

    loader = make(ds, nodes=[mmloader.Map(NumpyCount())])
    it = iter(loader)
    next(it)
    with pytest.raises(MMLoaderError, match=r"node NumpyCount: its state\(\) is not plain data .*int64"):
        loader.state_dict()

    class Broken(StepCount):
        def state(self):
            raise NotImplementedError("no state")

    with pytest.raises(MMLoaderError, match=r"node Broken: its state\(\) failed: NotImplementedError: no state"):
        next(iter(make(ds, nodes=[mmloader.Map(Broken())])))


def test_states_are_copies_both_ways(ds):
    """A node whose state() hands out its own dict: the checkpoint must not change after it was
    taken (nor the state ToDevice keeps for the batch held), nor a reset keep the caller's dict."""

    class Live:
        def __init__(self):
            self.own = {"n": 0}

        def __call__(self, batch):
            self.own["n"] += 1
            batch["n"] = self.own["n"]
            return batch

        def state(self):
            return self.own

        def reset(self, state):
            self.own = state if state is not None else {"n": 0}

    loader = make(ds, nodes=[mmloader.Map(Live())])
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    next(it)
    assert saved["nodes"][0]["state"] == {"n": 1}
    it.close()
    again = make(ds, nodes=[mmloader.Map(Live())])
    again.load_state_dict(saved)
    assert [b["n"] for b in again] == [2, 3, 4, 5, 6]
    assert saved["nodes"][0]["state"] == {"n": 1}  # the reset node counted on in its own copy
    staged = mmloader.ToDevice(make(ds, nodes=[mmloader.Map(Live())]), "cpu")
    it = iter(staged)
    got = [next(it)["n"] for _ in range(2)]
    state = staged.state_dict()
    it.close()
    later = mmloader.ToDevice(make(ds, nodes=[mmloader.Map(Live())]), "cpu")
    later.load_state_dict(state)
    assert got + [b["n"] for b in later] == [1, 2, 3, 4, 5, 6]


def test_a_node_reads_from_one_loader(ds):
    node = mmloader.Map(StepCount())
    first = make(ds, nodes=[node])
    with pytest.raises(ValueError, match=r"node 0 \(StepCount\) already reads from another loader"):
        make(ds, nodes=[node])
    del first  # gone: the node may go into another loader
    assert [b["step"] for b in make(ds, nodes=[node])] == list(range(6))


def test_nodes_is_a_list_and_a_map_is_stateful_with_both_halves(ds):
    with pytest.raises(TypeError, match="takes a list of mmloader.Node, got a Map"):
        make(ds, nodes=mmloader.Map(StepCount()))

    class ResetOnly:
        def __call__(self, batch):
            return batch

        def reset(self):  # not the protocol's reset(state): a function object of another kind
            raise AssertionError("called")

    half = mmloader.Map(ResetOnly())
    assert half.state() == {} and half.name == "ResetOnly"
    half.reset({"n": 1})
    import functools

    assert mmloader.Map(functools.partial(StepCount())).name == "StepCount"
    counted = mmloader.Map(functools.partial(StepCount()))
    assert counted.state() == {"n": 0}  # the partial's function is checkpointed


def test_a_datamodule_gives_its_validation_loader_copies_of_the_nodes(ds):
    pytest.importorskip("lightning")
    from mmloader.frameworks.lightning import DataModule

    node = mmloader.Map(StepCount())
    dm = DataModule(
        mmloader.Stream(ds, batch_size=4, seed=1),
        mmloader.Stream(ds, batch_size=4, seed=2),
        num_workers=1,
        backend="thread",
        nodes=[node],
    )
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert [b["step"] for b in train] == list(range(6)) and [b["step"] for b in val] == list(range(6))
    assert node.state() == {"n": 6} and train.state_dict()["nodes"][0]["state"] == {"n": 6}


def test_an_old_pass_closed_late_leaves_the_newer_one_whole(ds):
    def remaining(nodes):
        loader = make(ds, nodes=nodes)
        old = iter(loader)
        next(old)
        new = iter(loader)
        next(new)
        old.close()  # (or collected late)
        return [b["__key__"] for b in new]

    assert remaining([mmloader.Map(StepCount())]) == remaining([]) and len(remaining([])) == 4


def test_nodes_are_told_apart_by_identity_and_a_failed_loader_call_keeps_none(ds):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Tag(mmloader.Node):  # frozen: unhashable by identity, equal to any other Tag
        label: str = "t"

        def next(self):
            batch = self.source.next()
            batch["tag"] = self.label
            return batch

    assert [b["tag"] for b in make(ds, nodes=[Tag()])][0] == "t"
    keep = [make(ds, nodes=[Tag()]), make(ds, nodes=[Tag()])]  # two equal nodes: two loaders
    assert all(len(list(k)) == 6 for k in keep)
    node = mmloader.Map(StepCount())
    with pytest.raises(TypeError, match="prefetch_factr"):
        make(ds, nodes=[node], prefetch_factr=2)
    assert [b["step"] for b in make(ds, nodes=[node])] == list(range(6))  # not bound by the failed call


def test_a_stage_left_in_its_last_read_ahead_window_rewinds_the_nodes_on_set_epoch(ds):
    node = mmloader.Map(StepCount())
    staged = mmloader.ToDevice(make(ds, nodes=[node]), "cpu")
    it = iter(staged)
    got = [next(it)["step"] for _ in range(5)]  # the 6th and last batch is read ahead
    staged.set_epoch(1)
    it.close()
    assert got == [0, 1, 2, 3, 4] and node.state() == {"n": 5}
    assert [b["step"] for b in staged] == [5, 6, 7, 8, 9, 10]


def test_a_stage_hands_out_a_new_copy_of_the_state_each_time(ds):
    staged = mmloader.ToDevice(make(ds), "cpu")
    it = iter(staged)
    next(it)
    first = staged.state_dict()
    first["nodes"][0]["state"]["n"] = 99
    assert staged.state_dict()["nodes"][0]["state"] == {"n": 1}
    it.close()


def test_a_node_that_fails_a_batch_leaves_the_nodes_as_before_it(ds):
    class FailsOnce:
        failed = False

        def __call__(self, batch):
            if batch["step"] == 2 and not self.failed:
                self.failed = True
                raise RuntimeError("once")
            return batch

    for wrap in (lambda loader: loader, lambda loader: mmloader.ToDevice(loader, "cpu")):
        loader = wrap(make(ds, nodes=[mmloader.Map(StepCount()), mmloader.Map(FailsOnce())]))
        steps = []
        with pytest.raises(RuntimeError, match="once"):
            for batch in loader:  # (under ToDevice it fails reading batch 2 ahead, before batch 1 is handed over)
                steps.append(batch["step"])
        steps += [b["step"] for b in loader]  # the batches not handed over again, with the same steps
        assert steps == list(range(6))


def test_a_state_json_would_change_is_refused_only_when_a_checkpoint_is_taken(ds):
    class Pairs(StepCount):
        def state(self):
            return {"n": self.n, "last": (self.n, self.n)}  # a tuple comes back from JSON a list

    loader = make(ds, nodes=[mmloader.Map(Pairs())])
    it = iter(loader)
    next(it)
    it.close()
    assert len(list(loader)) == 5  # a pass left early and continued: no checkpoint asked for
    with pytest.raises(MMLoaderError, match="node Pairs: its state\\(\\) is not plain data \\(JSON would change it"):
        loader.state_dict()
