"""Exactly once under fault-tolerant training: real torchft (a Lighthouse, managers, gloo), replica
groups SIGKILLed mid-epoch, during should_commit, and for good, each step's keys and commit logged
by every rank; every sample lands in exactly one committed step. The same checks run over
torchft's own DistributedSampler find the samples it loses and repeats (the negative control)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_dataset

pytest.importorskip("torchft")

HERE = Path(__file__).parent
N, BATCH = 300, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ft") / "pairs.lmdb", N, "lmdb")


def run(tmp_path: Path, data: Path, **spec) -> list[dict]:
    """Run a torchft job (torchft_scenario.py) in a network namespace holding only loopback, and
    return every rank's log records."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("the torchft tests run torchft's managers in a network namespace: unshare and ip are needed")
    log = tmp_path / "log.jsonl"
    spec = {"data": str(data), "log": str(log), "groups": 3, "group_world": 1, "batch": BATCH, **spec}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    script = HERE / "torchft_scenario.py"
    cmd = [
        "unshare",
        "-n",
        "sh",
        "-c",
        f'ip link set lo up && exec "{sys.executable}" "{script}" "$0"',
        str(tmp_path / "spec.json"),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=spec.get("deadline_s", 150) + 30, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def committed(
    records: list[dict], group_world: int = 1, strict: bool = True
) -> tuple[dict[int, dict], collections.Counter]:
    """Each committed step's batches as delivered, ``{step: {(participant, rank): keys}}``, and how
    often each key was in a committed step. A step is committed when a group's should_commit said
    so; its batches are those its quorum was dealt (every participant's, whether or not that
    group lived to commit: its gradients were in the step's allreduce). ``strict``: a slot dealt
    twice in a step got the same keys, and every slot of the quorum was dealt (a loader that is not
    dealt by the quorum, the sampler, is only counted)."""
    last_deal: dict[int, dict] = {}  # each process's deal the next commit answers
    quorums: dict[int, set] = collections.defaultdict(set)  # a committed step -> its quorum's size
    for r in records:
        if r["event"] == "deal":
            last_deal[r["pid"]] = r
        elif r["event"] == "commit" and r["committed"]:
            assert last_deal[r["pid"]]["step"] == r["step"], r
            quorums[r["step"]].add(last_deal[r["pid"]]["participants"])
    steps: dict[int, dict] = {}
    for step in sorted(quorums):
        deals_by = [r for r in records if r["event"] == "deal" and r["step"] == step]
        if strict:  # the committing groups were dealt by one quorum
            assert len(quorums[step]) == 1, (step, quorums[step])
        slots: dict[tuple, list] = {}
        for r in deals_by:
            if r["participant"] is None or r["participants"] not in quorums[step]:
                continue  # healing, or an attempt of this step in another quorum
            slot = (r["participant"], r["rank"]) if strict else (r["participant"], r["rank"], r["participants"])
            if strict:
                assert slots.setdefault(slot, r["keys"]) == r["keys"], (step, slot)  # a step dealt again is the same
            else:
                slots[slot] = r["keys"]  # the last attempt's
        if strict:
            size = next(iter(quorums[step]))
            assert sorted(slots) == [(p, g) for p in range(size) for g in range(group_world)], (step, sorted(slots))
        steps[step] = slots
    seen = collections.Counter(k for slots in steps.values() for keys in slots.values() for k in keys)
    return steps, seen


def check_exactly_once(records: list[dict], group_world: int = 1) -> dict[int, dict]:
    steps, seen = committed(records, group_world)
    assert len(seen) == N and set(seen.values()) == {1}, (N - len(seen), sum(v > 1 for v in seen.values()))
    for step, slots in steps.items():  # equal batches: full ones, but in the epoch's last step
        sizes = [len(keys) for keys in slots.values()]
        last = step == max(steps)
        assert all(s == BATCH for s in sizes) or last, (step, sizes)
        flat = [k for keys in slots.values() for k in keys]
        assert len(flat) == len(set(flat)), step  # no sample twice in a step
    return steps


def test_groups_lost_mid_epoch_during_commit_and_for_good_every_sample_once(tmp_path, data):
    """Group 2 is SIGKILLed before its forward pass at step 4 and started again 3 committed steps
    later (it heals from a peer, the loader's state with the model's); group 1 is SIGKILLed during
    the commit of step 12 (its gradients already in the allreduce) and stays down."""
    events = [
        {"group": 2, "die": "4:forward", "restart_after": 3},
        {"group": 1, "die": "12:commit", "restart_after": None},
    ]
    records = run(tmp_path, data, events=events)
    steps = check_exactly_once(records)
    sizes = {s: len(slots) for s, slots in steps.items()}
    # quorums of 3, then 2 while group 2 is down, 3 again once it healed, and 2 after group 1 is lost
    assert set(sizes.values()) == {3, 2} and sizes[max(sizes)] == 2 and sizes[min(sizes)] == 3, sizes
    # the loader's ledger (every surviving rank's, at the end) names what was delivered
    for done in (r for r in records if r["event"] == "done"):
        ledger = {step: {tuple(map(int, k.split(","))): v for k, v in slots.items()} for step, slots in done["ledger"]}
        assert ledger == {s: slots for s, slots in steps.items()}, done["group"]


def test_two_ranks_per_group(tmp_path, data):
    """Two groups of two ranks, one lost and started again: a majority of 2 would stop the job, so
    a quorum of one group may go on (started together at step 0, no second quorum forms)."""
    events = [{"group": 1, "die": "3:forward", "restart_after": 2}]
    records = run(tmp_path, data, groups=2, group_world=2, min_replicas=1, events=events)
    check_exactly_once(records, group_world=2)


def test_the_whole_job_restarted_from_a_checkpoint_mid_epoch(tmp_path, data):
    """Every group stops at step 10 (the loader's and the manager's state checkpointed) and the job
    starts again from the checkpoint: new processes, new managers, the epoch goes on."""
    records = run(tmp_path, data, stop_at=10)
    assert {r["step"] for r in records if r["event"] == "stopped"} == {10}
    steps = check_exactly_once(records)
    assert min(steps) == 0 and 10 in steps  # before and after the restart
    assert len({r["pid"] for r in records if r["event"] == "ready"}) == 6  # two jobs of 3 groups
    for done in (r for r in records if r["event"] == "done"):  # the ledger goes on across the restart
        assert sorted(step for step, _slots in done["ledger"]) == sorted(steps)


def test_torchfts_own_sampler_loses_and_repeats_samples_in_the_same_job(tmp_path, data):
    """The negative control: the same job and checks over torchft.data.DistributedSampler."""
    events = [
        {"group": 2, "die": "4:forward", "restart_after": 3},
        {"group": 1, "die": "12:commit", "restart_after": None},
    ]
    records = run(tmp_path, data, events=events, sampler=True, min_replicas=1)  # (its groups end apart)
    _steps, seen = committed(records, strict=False)
    lost, repeated = N - len(seen), sum(v - 1 for v in seen.values() if v > 1)
    assert lost > 0 and repeated > 0, (lost, repeated)
