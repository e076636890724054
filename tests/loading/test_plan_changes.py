"""Runs whose experiment changed: a resume state names its plan and a mismatch never passes
silently (error, on_change="next_epoch" or "continue"); selections and schedules keep every
guarantee (exactly once, equal batches, resume at every step onto worlds 1-4); evaluation
without repeats across 2 real DDP ranks; a drop_last epoch that plans nothing says so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from conftest import jpeg_bytes, rank_streams

import mmloader
from mmloader.errors import PlanChangedError


def _write(path: Path, prefix: str, n: int) -> str:
    with mmloader.LMDBWriter(path) as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}{i:03d}", "txt": f"{prefix}{i}", "json": {"q": i % 10}})
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("changes")
    return {name: _write(root / f"{name}.lmdb", name, 100) for name in ("a", "b", "c")}


def _zip(path):
    return mmloader.zip(t=mmloader.TextReader(path))


def _mix(data, weights, names=("a", "b"), **kw):
    return mmloader.mix([_zip(data[n]) for n in names], weights, epoch_size=100, names=list(names), **kw)


def _keys(batches):
    return [k for b in batches for k in b["__key__"]]


def _first(stream, batches):
    loader = mmloader.loader(stream, num_workers=0)
    it = iter(loader)
    got = _keys(next(it) for _ in range(batches))
    return got, json.loads(json.dumps(loader.state_dict()))  # a checkpoint is plain data


def test_the_issue_repro_a_changed_mix_of_the_same_length_fails_loudly(data):
    first, state = _first(mmloader.Stream(_mix(data, [0.5, 0.5]), batch_size=10, seed=0), 5)
    resumed = mmloader.loader(mmloader.Stream(_mix(data, [0.8, 0.2]), batch_size=10, seed=0), num_workers=0)
    with pytest.raises(PlanChangedError, match=r"mix weights: \[0.5, 0.5\] -> \[0.8, 0.2\]") as e:
        resumed.load_state_dict(state)
    assert e.value.changes == ["mix weights: [0.5, 0.5] -> [0.8, 0.2]"]


def test_a_dataset_swapped_for_another_of_the_same_size_fails_loudly(data):
    _first_keys, state = _first(mmloader.Stream(_mix(data, [0.5, 0.5]), batch_size=10), 3)
    swapped = mmloader.mix([_zip(data["a"]), _zip(data["c"])], [0.5, 0.5], epoch_size=100, names=["a", "b"])
    with pytest.raises(PlanChangedError, match="source 'b': other samples, same count"):
        mmloader.loader(mmloader.Stream(swapped, batch_size=10), num_workers=0).load_state_dict(state)
    one, state1 = _first(mmloader.Stream(_zip(data["a"]), batch_size=10), 2)
    with pytest.raises(PlanChangedError, match="other samples"):
        mmloader.Stream(_zip(data["c"]), batch_size=10).resume(state1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_another_batch_size_fails_loudly_or_continues_without_losing_a_sample(tmp_path, drop_last):
    """The issue's loss: 40 samples, world 2, state at batch 4 resumed with batch 3."""
    path = _write(tmp_path / "d.lmdb", "k", 40)
    per_rank_first = {}
    state = None
    for rank in range(2):
        s = mmloader.Stream(_zip(path), batch_size=4, drop_last=drop_last, seed=2)
        s.set_world(rank, 2)
        per_rank_first[rank], st = _first(s, 4)
        state = state or st
    with pytest.raises(PlanChangedError, match="batch_size: 4 -> 3"):
        mmloader.Stream(_zip(path), batch_size=3, drop_last=drop_last, seed=2).resume(state)
    for world in (2, 3):
        rest = []
        counts = set()
        for rank in range(world):
            s = mmloader.Stream(_zip(path), batch_size=3, drop_last=drop_last, seed=2, on_change="continue")
            s.set_world(rank, world)
            loader = mmloader.loader(s, num_workers=0)
            loader.load_state_dict(state)
            batches = list(loader)
            counts.add(len(batches))
            rest += _keys(batches)
        assert len(counts) == 1  # equal batches on every rank
        before = per_rank_first[0] + per_rank_first[1]
        assert not set(before) & set(rest)  # nothing delivered twice
        left = 40 - len(set(before))
        if drop_last:  # drop_last drops less than a batch per rank of what is left, never more
            assert left - world * 3 < len(set(rest)) <= left
        else:
            assert set(before) | set(rest) == {f"k{i:03d}" for i in range(40)}


def test_on_change_next_epoch_and_continue_after_a_weight_change(data, caplog):
    first, state = _first(mmloader.Stream(_mix(data, [0.5, 0.5]), batch_size=10, seed=0), 5)
    nxt = mmloader.loader(mmloader.Stream(_mix(data, [0.8, 0.2]), batch_size=10, seed=0, on_change="next_epoch"))
    nxt.load_state_dict(state)
    assert nxt.epoch == 1
    keys = _keys(nxt)
    assert Counter(k[0] for k in keys) == {"a": 80, "b": 20} and len(set(keys)) == 100  # the new plan, whole
    assert "on_change='next_epoch'" in caplog.text and "mix weights" in caplog.text
    cont = mmloader.loader(mmloader.Stream(_mix(data, [0.8, 0.2]), batch_size=10, seed=0, on_change="continue"))
    cont.load_state_dict(state)
    rest = _keys(cont)
    assert cont.epoch == 0 and not set(first) & set(rest) and len(set(rest)) == len(rest)
    # the rest is the new plan's epoch without what was delivered
    new_epoch = _keys(mmloader.loader(mmloader.Stream(_mix(data, [0.8, 0.2]), batch_size=10, seed=0)))
    assert sorted(rest) == sorted(set(new_epoch) - set(first))
    state_after = cont.state_dict()
    assert state_after["epoch"] == 1 and state_after["consumed"] == 0  # then epochs go on as usual


def test_continue_with_a_source_added_and_a_selection_changed(data):
    ds_a = _zip(data["a"])
    first, state = _first(mmloader.Stream(mmloader.select(ds_a, "t != 'a5'", cache_dir=False), batch_size=10), 4)
    changed = mmloader.mix(
        [mmloader.select(ds_a, "t != 'a7'", cache_dir=False), _zip(data["c"])],
        [1, 1],
        mode="repeat",  # each source once
        names=["dataset", "c"],
    )
    stream = mmloader.Stream(changed, batch_size=10, on_change="continue")
    loader = mmloader.loader(stream, num_workers=0)
    loader.load_state_dict(state)
    rest = _keys(loader)
    assert not set(first) & set(rest)  # a-samples delivered before are not delivered again
    assert {k for k in rest if k.startswith("a")} == {f"a{i:03d}" for i in range(100)} - set(first) - {"a007"}
    assert {k for k in rest if k.startswith("c")} <= {f"c{i:03d}" for i in range(100)}  # the new source joins


CONFIG_RUN = textwrap.dedent(
    """
    import json, sys, mmloader
    # one job per on_change mode: config, state file, result file, batches (a fresh loader each)
    for config, state_file, out, batches in json.loads(sys.argv[1]):
        loader = mmloader.loader(mmloader.from_config(config), num_workers=2, backend="thread")
        try:
            loader.load_state_dict(json.load(open(state_file)))
        except FileNotFoundError:
            pass
        except mmloader.errors.PlanChangedError as e:
            json.dump({"error": str(e)}, open(out, "w"))
            continue
        keys = []
        for i, batch in enumerate(loader):
            keys += batch["__key__"]
            if i + 1 == batches:
                break
        json.dump(loader.state_dict(), open(state_file, "w"))
        json.dump({"keys": keys, "epoch": loader.epoch}, open(out, "w"))
    """
)
ON_CHANGE = ["error", "next_epoch", "continue"]


@pytest.fixture(scope="module")
def two_runs(data, tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """For each on_change mode: a run of 4 batches, then, in another process, the rest of the epoch
    after the config was edited (a source added, a filter on another). Two processes in all: each
    runs every mode's loader in turn, from that mode's own config and state file."""
    root = tmp_path_factory.mktemp("on-change")
    script = root / "run.py"
    script.write_text(CONFIG_RUN)

    def cfg(on_change: str, weights: dict, filters: dict) -> dict:
        return {
            "seed": 3,
            "batch_size": 10,
            "on_change": on_change,
            "mix": {"epoch_size": 100},
            "sources": {
                n: {
                    "path": data[n],
                    "weight": w,
                    "modalities": {"t": {"field": "txt"}, "meta": {"field": "json"}},
                    **({"filter": filters[n]} if n in filters else {}),
                }
                for n, w in weights.items()
            },
        }

    def run(configs: dict[str, dict], batches: int, step: str) -> dict[str, dict]:
        jobs = []
        for mode, config in configs.items():
            (root / mode).mkdir(exist_ok=True)
            (root / mode / "exp.yaml").write_text(json.dumps(config))  # JSON is YAML
            jobs.append([str(root / mode / f) for f in ("exp.yaml", "state.json", f"{step}.json")] + [batches])
        subprocess.run([sys.executable, str(script), json.dumps(jobs)], check=True, timeout=120)
        return {mode: json.loads((root / mode / f"{step}.json").read_text()) for mode in configs}

    first = run({m: cfg(m, {"a": 0.5, "b": 0.5}, {}) for m in ON_CHANGE}, 4, "first")
    second = run({m: cfg(m, {"a": 0.5, "b": 0.3, "c": 0.2}, {"a": "meta.q < 8"}) for m in ON_CHANGE}, 1000, "second")
    return {m: (first[m], second[m]) for m in ON_CHANGE}


@pytest.mark.process
@pytest.mark.parametrize("on_change", ON_CHANGE)
def test_each_on_change_mode_across_a_config_edit_between_two_runs(two_runs, on_change):
    first, second = two_runs[on_change]
    if on_change == "error":
        assert "source 'c' added" in second["error"] and "source 'a': selection" in second["error"]
        return
    whole = [k for k in second["keys"]]
    if on_change == "next_epoch":
        assert second["epoch"] == 1 and len(whole) == 100 and len(set(whole)) == 100
        assert {k[0] for k in whole} == {"a", "b", "c"}
    else:
        assert second["epoch"] == 0 and not set(first["keys"]) & set(whole) and len(set(whole)) == len(whole)
        assert {k for k in whole if k.startswith("a")} and all(int(k[1:]) % 10 < 8 for k in whole if k[0] == "a")


# -- every guarantee over a selection and a schedule ------------------------------------------


def _all_ranks(streams, state=None, limit=None):
    out = []
    for s in streams:
        loader = mmloader.loader(s, num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        batches = [b for _, b in zip(range(limit if limit is not None else 10**9), it)]
        out.append((batches, loader.state_dict()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["selection", "schedule"])
def test_resume_at_every_step_onto_worlds_1_to_4(data, kind):
    if kind == "selection":
        selected = mmloader.select(_zip(data["a"]), keys=[f"a{i:03d}" for i in range(0, 100, 3)])

        def make():
            return mmloader.Stream(selected, batch_size=4, seed=7)

        universe = Counter(selected.keys)
    else:
        schedule = {"interpolate": "linear", "points": [{"at": 0, "weights": [1, 0]}, {"at": 1, "weights": [0, 1]}]}

        def make():
            return mmloader.Stream(_mix(data, None, schedule=schedule), batch_size=4, seed=7)

        universe = Counter(_keys(mmloader.loader(make(), num_workers=0)))  # the epoch, uninterrupted
        assert sum(universe.values()) == 100 and max(universe.values()) == 1
    later = make()
    later.set_epoch(1)
    next_universe = Counter(_keys(mmloader.loader(later, num_workers=0)))
    for world in (1, 2, 3, 4):
        full = _all_ranks(rank_streams(make, world))
        steps = len(full[0][0])
        assert {len(b) for b, _ in full} == {steps}
        delivered = Counter(_keys(b for bs, _ in full for b in bs))
        assert set(delivered) == set(universe) and sum(delivered.values()) - len(universe) < world * 4
        for k in range(steps + 1):
            part = _all_ranks(rank_streams(make, world), limit=k)
            before = Counter(_keys(b for bs, _ in part for b in bs))
            for world2 in (1, 2, 3, 4):
                rest = _all_ranks(rank_streams(make, world2), state=part[0][1])
                assert len({len(b) for b, _ in rest}) == 1  # equal batches after the resume
                after = Counter(_keys(b for bs, _ in rest for b in bs))
                if k == steps:  # a state after the epoch's last batch: the next epoch, whole
                    assert set(after) == set(next_universe) and part[0][1]["epoch"] == 1
                    continue
                assert set(before) | set(after) == set(universe)  # every sample of the epoch
                if world2 == world:  # the same world: exactly the uninterrupted batches
                    assert [_keys(bs) for bs, _ in rest] == [_keys(bs[k:]) for bs, _ in full]


# -- evaluation without repeats ---------------------------------------------------------------


def _eval_rank(rank: int, init: str, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    stream = mmloader.Stream(mmloader.zip(t=mmloader.TextReader(path)), batching=mmloader.Batching(4, padding="mask"))
    loader = mmloader.loader(stream, num_workers=2, backend="process", multiprocessing_context="fork")
    total, valid_keys = torch.zeros(2), []
    for batch in loader:
        values = torch.tensor([float(k[1:]) for k in batch["__key__"]])
        total += torch.stack([(values * batch["__valid__"]).sum(), batch["__valid__"].sum()])
        step = torch.ones(1)
        dist.all_reduce(step)  # a metric synced every step: hangs if batch counts differed
        valid_keys += [k for k, v in zip(batch["__key__"], batch["__valid__"].tolist()) if v]
    dist.all_reduce(total)
    Path(out, f"eval{rank}.json").write_text(json.dumps({"total": total.tolist(), "keys": valid_keys}))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.process
def test_two_rank_ddp_evaluation_sums_to_exactly_the_dataset(tmp_path):
    path = _write(tmp_path / "e.lmdb", "e", 37)
    tmp.spawn(_eval_rank, args=(str(tmp_path / "init"), path, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"eval{r}.json").read_text()) for r in range(2)]
    assert results[0]["total"] == [float(sum(range(37))), 37.0] == results[1]["total"]
    keys = results[0]["keys"] + results[1]["keys"]
    assert sorted(keys) == [f"e{i:03d}" for i in range(37)]


def test_padding_mask_refuses_drop_last_and_resumes_mid_pass(tmp_path):
    path = _write(tmp_path / "m.lmdb", "m", 11)
    with pytest.raises(ValueError, match="drop_last"):
        mmloader.Stream(_zip(path), batching=mmloader.Batching(4, drop_last=True, padding="mask"))
    first = _all_ranks(
        rank_streams(lambda: mmloader.Stream(_zip(path), batching=mmloader.Batching(2, padding="mask")), 2), limit=2
    )
    state = first[0][1]
    seen = [k for bs, _ in first for b in bs for k, v in zip(b["__key__"], b["__valid__"]) if v]
    for world2 in (1, 2, 3):
        rest = _all_ranks(
            rank_streams(lambda: mmloader.Stream(_zip(path), batching=mmloader.Batching(2, padding="mask")), world2),
            state,
        )
        after = [k for bs, _ in rest for b in bs for k, v in zip(b["__key__"], b["__valid__"]) if v]
        assert sorted(seen + after) == [f"m{i:03d}" for i in range(11)]


# -- smaller things the issue found ----------------------------------------------------------


def test_drop_last_epoch_with_nothing_to_deliver_warns(tmp_path):
    path = _write(tmp_path / "s.lmdb", "s", 7)
    stream = mmloader.Stream(_zip(path), batch_size=4, drop_last=True)
    stream.set_world(0, 2)
    with pytest.warns(UserWarning, match="7 samples cannot fill one batch of 4 on each of 2 ranks"):
        assert list(mmloader.loader(stream, num_workers=0)) == []


@pytest.mark.parametrize("cache", [False, True])
def test_a_batch_with_a_bad_sample_runs_each_transform_once(tmp_path, cache, caplog):
    p = tmp_path / "bad.lmdb"
    with mmloader.LMDBWriter(p) as w:
        for i in range(20):
            w.write(
                {"__key__": f"k{i:02d}", "jpg": b"\xff\xd8\xffjunk" if i % 4 == 1 else jpeg_bytes(i, size=(16, 16))}
            )
    calls = []
    reader = mmloader.ImageReader(str(p), size=(16, 16), transform=lambda x: calls.append(1) or x)
    ds = mmloader.zip(image=reader, cache=mmloader.SampleCache(1 << 20) if cache else None)
    stream = mmloader.Stream(ds, batch_size=4, shuffle=False, errors="skip")
    delivered = sum(len(b["__key__"]) for b in mmloader.loader(stream, num_workers=0))
    assert delivered == 20 and len(calls) == 20  # one transform per delivered sample (was 25)


@pytest.mark.process
def test_mmloader_plan_prints_the_selection_and_the_schedules_totals(data, tmp_path):
    cfg = {
        "batch_size": 10,
        "mix": {
            "epoch_size": 1000,
            "schedule": {
                "by": "samples",
                "interpolate": "linear",
                "points": [
                    {"at": 0, "weights": {"web": 0.9, "hq": 0.1}},
                    {"at": 2700, "weights": {"web": 0.9, "hq": 0.1}},
                    {"at": 3000, "weights": {"web": 0.2, "hq": 0.8}},
                ],
            },
        },
        "sources": {
            "web": {
                "path": data["a"],
                "filter": "meta.q < 8",
                "modalities": {"t": {"field": "txt"}, "meta": {"field": "json"}},
            },
            "hq": {"path": data["b"], "modalities": {"t": {"field": "txt"}}},
        },
    }
    (tmp_path / "exp.yaml").write_text(json.dumps(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "mmloader.cli", "plan", str(tmp_path / "exp.yaml"), "--world", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "selection of web: 80 of 100 samples pass (where -> 80); filter 'meta.q < 8'" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert rows["0"] == ["900", "100"] and rows["1"] == ["900", "100"] and rows["3"] == ["200", "800"]
    assert rows["2"] == ["795", "205"]  # 700 at 10%, then a ramp to 80% over the last 300
    assert rows["total"][:2] == ["2795", "1205"] and "epochs from 4 keep the last point's weights" in out


def test_a_dataset_with_the_same_keys_and_other_content_is_another_dataset(tmp_path):
    def write(path, word):
        with mmloader.LMDBWriter(path) as w:
            for i in range(40):
                w.write({"__key__": f"{i:04d}", "txt": f"{word} {i}"})  # converters number keys alike
        return str(path)

    one, other = write(tmp_path / "one.lmdb", "cat"), write(tmp_path / "two.lmdb", "dog")
    _keys_before, state = _first(mmloader.Stream(_zip(one), batch_size=4), 3)
    with pytest.raises(PlanChangedError, match="other samples, same count"):
        mmloader.Stream(_zip(other), batch_size=4).resume(state)
    mmloader.Stream(_zip(one), batch_size=4).resume(state)  # the same dataset, opened again: fine


def test_a_dataset_that_cannot_be_identified_resumes_with_a_warning():
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"__key__": str(i), "x": i * i}

    _keys_before, state = _first(mmloader.Stream(Squares(), batch_size=4), 2)
    with pytest.warns(UserWarning, match=r"\['dataset'\] cannot be identified"):
        mmloader.Stream(Squares(), batch_size=4).resume(state)


def test_continue_twice_within_one_epoch_never_repeats(data):
    ds = _zip(data["a"])
    delivered = []
    state = None
    for batch_size, stop in ((10, 3), (7, 2), (5, None)):
        stream = mmloader.Stream(ds, batch_size=batch_size, seed=1, on_change="continue")
        loader = mmloader.loader(stream, num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        batches = list(it) if stop is None else [next(it) for _ in range(stop)]
        delivered += _keys(batches)
        state = json.loads(json.dumps(loader.state_dict()))
    assert sorted(delivered) == [f"a{i:03d}" for i in range(100)]  # every sample once, over 3 plans


def test_continue_from_one_source_to_a_mix_recognises_the_source(data):
    single = {"batch_size": 10, "sources": {"a": {"path": data["a"], "modalities": {"t": {"field": "txt"}}}}}
    first, state = _first(mmloader.from_config(single), 5)
    two = {
        **single,
        "on_change": "continue",
        "mix": {"mode": "repeat"},
        "sources": {**single["sources"], "c": {"path": data["c"], "modalities": {"t": {"field": "txt"}}}},
    }
    loader = mmloader.loader(mmloader.from_config(two), num_workers=0)
    loader.load_state_dict(state)
    rest = [(s, k) for b in loader for s, k in zip(b["__source__"], b["__key__"])]
    assert not {k for s, k in rest if s == "a"} & set(first)  # 'dataset' then is 'a' now
    assert {k for s, k in rest if s == "a"} | set(first) == {f"a{i:03d}" for i in range(100)}
    assert len({k for s, k in rest if s == "c"}) == 100


def test_continue_into_single_source_batches_keeps_them_single_source(data):
    def stream(composition, on_change="error"):
        m = mmloader.mix(
            [_zip(data["a"]), _zip(data["b"])],
            [0.5, 0.5],
            names=["a", "b"],
            epoch_size=100,
            batch_composition=composition,
        )
        return mmloader.Stream(m, batch_size=10, on_change=on_change)

    first = mmloader.loader(stream("sample"), num_workers=0)
    it = iter(first)
    before = [(s, k) for b in (next(it), next(it)) for s, k in zip(b["__source__"], b["__key__"])]
    resumed = mmloader.loader(stream("source", "continue"), num_workers=0)
    resumed.load_state_dict(first.state_dict())
    batches = list(resumed)
    assert batches and all(len(set(b["__source__"])) == 1 for b in batches)
    rest = [(s, k) for b in batches for s, k in zip(b["__source__"], b["__key__"])]
    assert not set(before) & set(rest) and len(set(rest)) == len(rest)


def test_another_bucketing_function_is_a_plan_change(data):
    ds = _zip(data["a"])
    _keys_before, state = _first(mmloader.Stream(ds, batch_size=10, lengths=mmloader.Bucketing(lambda i: i % 7)), 2)
    with pytest.raises(PlanChangedError, match="bucket_by"):
        mmloader.Stream(ds, batch_size=10, lengths=mmloader.Bucketing(lambda i: i % 5)).resume(state)


def _length_mod_7(i):
    return i % 7


def test_a_bucketed_epoch_continues_under_another_batch_size_with_its_lengths(data):
    ds = _zip(data["a"])
    before, state = _first(mmloader.Stream(ds, batch_size=10, lengths=mmloader.Bucketing(_length_mod_7)), 2)
    resumed = mmloader.loader(
        mmloader.Stream(ds, batch_size=6, lengths=mmloader.Bucketing(_length_mod_7), on_change="continue"),
        num_workers=0,
    )
    resumed.load_state_dict(state)
    rest = _keys(resumed)
    assert not set(before) & set(rest) and sorted(before + rest) == sorted(ds[i]["__key__"] for i in range(len(ds)))


def test_a_schedule_and_weights_together_are_refused(data):
    schedule = {"points": [{"at": 0, "weights": [1, 1]}]}
    with pytest.raises(ValueError, match="not both"):
        _mix(data, [0.5, 0.5], schedule=schedule)
