"""mmloader inside real training frameworks, in real processes: Lightning (ddp, ddp_spawn, a
preemption and resume from its checkpoint), accelerate and transformers.Trainer under torchrun,
and a 2x2 DeviceMesh. The scripts live in tests/frameworks/; each records the batches its
training steps received, per rank, and the tests count samples from those records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import TESTS

HERE = TESTS / "frameworks"
sys.path.insert(0, str(HERE))
from common import BATCH, SAMPLES, make_dataset  # noqa: E402

PER_RANK = SAMPLES // 2 // BATCH  # batches per rank and epoch with 2 ranks


def _run(script: str, *args: str, nproc: int | None = None, timeout: float = 240) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "MMLOADER_TEST_HANG_DUMP": str(timeout - 15),  # stacks in the failure, not a bare timeout
    }
    cmd = [
        sys.executable,
        *(["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc else []),
        str(HERE / script),
        *args,
    ]
    done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _seen(out: Path, ranks: int = 2) -> list[list[dict]]:
    return [[json.loads(line) for line in (out / f"seen-rank{r}.jsonl").read_text().splitlines()] for r in range(ranks)]


def _per_epoch(rows: list[list[dict]], **where) -> Counter:
    """(epoch, key) -> how many times training received it, over all ranks."""
    c: Counter = Counter()
    for rank_rows in rows:
        for row in rank_rows:
            if all(row.get(k) == v for k, v in where.items()):
                c.update((row["epoch"], key) for key in row["keys"])
    return c


def _assert_each_epoch_exactly_once(counts: Counter, epochs: list[int]) -> None:
    for e in epochs:
        keys = {k: n for (ep, k), n in counts.items() if ep == e}
        assert len(keys) == SAMPLES and set(keys.values()) == {1}, (e, sorted(keys.items())[:5], len(keys))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    pytest.importorskip("lightning")
    return make_dataset(tmp_path_factory.mktemp("fw") / "data")


@pytest.fixture(scope="module")
def lightning_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    _run("lightning_fit.py", str(data), str(out))
    return out


def test_lightning_ddp_epochs_advance_in_new_orders_each_exactly_once(lightning_run):
    rows = _seen(lightning_run)
    assert [len(r) for r in rows] == [2 * PER_RANK] * 2
    _assert_each_epoch_exactly_once(_per_epoch(rows), [0, 1])
    for r in rows:  # a new order in epoch 1 (Lightning never called our loader's set_epoch before)
        assert r[0]["keys"] != r[PER_RANK]["keys"]
    stats = json.loads((lightning_run / "stats-rank0.json").read_text())["logged"]
    assert stats["batches"] == 2 and stats["compute_s"] > 0 and 0 <= stats["wait_fraction"] < 1


def test_lightning_preempted_mid_epoch_resumes_from_its_checkpoint(data, lightning_run, lightning_preempted, tmp_path):
    out = _copy_run(lightning_preempted[2], tmp_path / "run")  # preempted after step 4 on 2 ranks
    assert [len(r) for r in _seen(out)] == [4, 4]
    _run("lightning_fit.py", str(data), str(out), "--resume", str(out / "preempt.ckpt"))
    both = _seen(out)
    _assert_each_epoch_exactly_once(_per_epoch(both), [0, 1])  # epoch 1 whole, not the tail of epoch 0
    uninterrupted = _seen(lightning_run)
    for r in range(2):  # and in the order an uninterrupted run trains
        assert [row["keys"] for row in both[r]] == [row["keys"] for row in uninterrupted[r]]


def test_lightning_ddp_spawn_datamodule_with_limit_train_batches(data, lightning_run, tmp_path):
    """Process backend with persistent workers: Lightning leaves each epoch after 3 batches, makes
    the next iterator and only then sets the epoch."""
    _run(
        "lightning_fit.py",
        str(data),
        str(tmp_path),
        "--strategy",
        "ddp_spawn",
        "--datamodule",
        "--limit-train-batches",
        "3",
        "--max-epochs",
        "2",
        "--backend",
        "process",
    )
    rows, full = _seen(tmp_path), _seen(lightning_run)
    for r in range(2):
        assert [row["epoch"] for row in rows[r]] == [0, 0, 0, 1, 1, 1]
        # epoch 1 starts at its own beginning (Lightning's set_epoch), not after epoch 0's 3 batches
        assert [row["keys"] for row in rows[r][:6]] == [row["keys"] for row in full[r][:3] + full[r][PER_RANK:][:3]]
    assert not {k for row in rows[0][:3] for k in row["keys"]} & {k for row in rows[1][:3] for k in row["keys"]}


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_accelerate_prepare_leaves_the_sharding_to_mmloader(data, tmp_path, backend):
    pytest.importorskip("accelerate")
    _run("accelerate_loop.py", str(data), str(tmp_path), "--backend", backend, nproc=2)
    info = json.loads((tmp_path / "info-rank0.json").read_text())
    assert info["same_object"] and info["len"] == PER_RANK
    rows = _seen(tmp_path)
    _assert_each_epoch_exactly_once(_per_epoch(rows, run="train"), [0, 1])
    resumed = _per_epoch(rows, run="resumed")  # load_state after step 1 of epoch 1: its 4 last batches
    trained = _per_epoch([[row for row in r if row["run"] == "train" and row["epoch"] == 1][2:] for r in rows])
    assert resumed == trained and sum(resumed.values()) == SAMPLES - 2 * 2 * BATCH


def test_hf_trainer_resumes_at_the_next_unseen_batch(data, hf_preempted, tmp_path):
    out = _copy_run(hf_preempted[2], tmp_path / "run")  # preempted after step 4 on 2 ranks
    assert [len(r) for r in _seen(out)] == [4, 4]
    state = json.loads((out / "run" / "checkpoint-4" / "mmloader-loader-rank1.json").read_text())
    assert (state["epoch"], state["steps"]) == (0, 4)
    _run("hf_trainer_fit.py", str(data), str(out), "--resume", nproc=2)
    rows = _seen(out)
    assert [len(r) for r in rows] == [2 * PER_RANK] * 2
    _assert_each_epoch_exactly_once(_per_epoch(rows), [0, 1])


def test_device_mesh_tp_peers_get_the_same_batches_dp_ranks_split_the_data(data, tmp_path):
    _run("mesh_loop.py", str(data), str(tmp_path), nproc=4)
    info = [json.loads((tmp_path / f"info-rank{r}.json").read_text()) for r in range(4)]
    assert all("2-D mesh" in i["two_d_error"] for i in info)
    rows = _seen(tmp_path, ranks=4)
    for backend in ("thread", "process"):
        by_rank = [[row for row in r if row["backend"] == backend] for r in rows]
        by_dp: dict[int, list] = {}
        for i, r in zip(info, by_rank):
            by_dp.setdefault(i["dp"], []).append([(row["epoch"], row["keys"]) for row in r])
        for dp, peers in by_dp.items():
            assert len(peers) == 2 and peers[0] == peers[1], (backend, dp)  # tp peers: identical
        one_per_dp = [by_rank[next(r for r, i in enumerate(info) if i["dp"] == dp and i["tp"] == 0)] for dp in (0, 1)]
        _assert_each_epoch_exactly_once(_per_epoch(one_per_dp), [0, 1])
        assert one_per_dp[0][0]["keys"] != one_per_dp[0][PER_RANK]["keys"]


def test_lightning_validates_and_fits_with_mmloader_val_loaders(data):
    """Lightning reads batch_sampler beside sampler on eval loaders (its shuffle check)."""
    import lightning.pytorch as pl
    import torch

    sys.path.insert(0, str(HERE))
    from common import stream

    import mmloader

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer, self.seen = torch.nn.Linear(1, 1), []

        def training_step(self, batch, batch_idx):
            return self.layer(torch.ones(len(batch["__key__"]), 1)).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.seen += list(batch["__key__"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Model()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    for backend in ("thread", "process"):
        model.seen = []
        trainer.validate(
            model,
            dataloaders=mmloader.loader(stream(data, shuffle=False), backend=backend, num_workers=1),
            verbose=False,
        )
        assert sorted(model.seen) == [f"k{i:04d}" for i in range(SAMPLES)]


# -- resumes onto another world size: every later epoch whole, the resumed one exactly once -------


def _seen_all(out: Path) -> list[list[dict]]:
    """The records of every rank that trained into ``out`` (a run before a resume and after it)."""
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(out.glob("seen-rank*.jsonl"))]


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


@pytest.fixture(scope="module")
def lightning_preempted(data, tmp_path_factory):
    """Lightning checkpoints after step 4 of epoch 0: on 2 ranks (the loader returned by the
    module's own train_dataloader) and on 1 (a DataModule)."""
    runs = {}
    for world, how in ((2, []), (1, ["--datamodule"])):
        out = tmp_path_factory.mktemp(f"lightning-preempted-{world}")
        _run("lightning_fit.py", str(data), str(out), "--preempt-after", "4", "--devices", str(world), *how)
        runs[world] = out
    return runs


@pytest.mark.parametrize(
    "saved, resumed, how, backend",
    [
        (2, 1, "plain", "thread"),  # fewer ranks: Lightning's epoch length must stay the whole epoch's
        (2, 1, "datamodule", "process"),
        (1, 2, "datamodule", "thread"),  # more ranks: the resumed epoch takes more steps than a fresh one
        (1, 2, "datamodule", "process"),
    ],
)
def test_lightning_resumed_onto_another_world_trains_every_epoch_exactly_once(
    data, lightning_preempted, tmp_path, saved, resumed, how, backend
):
    out = _copy_run(lightning_preempted[saved], tmp_path / "run")
    assert sum(len(r) for r in _seen_all(out)) == 4 * saved
    args = ["--resume", str(out / "preempt.ckpt"), "--devices", str(resumed), "--max-epochs", "3"]
    _run(
        "lightning_fit.py",
        str(data),
        str(out),
        *args,
        "--backend",
        backend,
        *(["--datamodule"] if how != "plain" else []),
    )
    _assert_each_epoch_exactly_once(_per_epoch(_seen_all(out)), [0, 1, 2])
    assert json.loads((out / "warnings-rank0.json").read_text()) == []


def test_lightning_own_loader_resumed_onto_more_ranks_says_the_epoch_is_cut(data, lightning_preempted, tmp_path):
    """Lightning reads len() before it loads the loader's state; a loader returned by the module
    itself cannot be loaded first, so a resume needing more steps than that length is said."""
    out = _copy_run(lightning_preempted[1], tmp_path / "run")
    _run("lightning_fit.py", str(data), str(out), "--resume", str(out / "preempt.ckpt"), "--devices", "2")
    said = json.loads((out / "warnings-rank0.json").read_text())
    assert any("needs 8 steps per rank" in w and "len() was 6" in w and "DataModule" in w for w in said), said


@pytest.fixture(scope="module")
def hf_preempted(data, tmp_path_factory):
    """transformers.Trainer checkpoints at step 4 of epoch 0, saved on 2 ranks and on 1."""
    pytest.importorskip("transformers")
    runs = {}
    for world in (2, 1):
        out = tmp_path_factory.mktemp(f"hf-preempted-{world}")
        _run("hf_trainer_fit.py", str(data), str(out), "--preempt-after", "4", nproc=world)
        runs[world] = out
    return runs


@pytest.mark.parametrize("saved, resumed", [(2, 1), (1, 2)])
def test_hf_trainer_resumed_onto_another_world_trains_every_epoch_exactly_once(
    data, hf_preempted, tmp_path, saved, resumed
):
    out = _copy_run(hf_preempted[saved], tmp_path / "run")
    assert sum(len(r) for r in _seen_all(out)) == 4 * saved
    _run("hf_trainer_fit.py", str(data), str(out), "--resume", nproc=resumed)
    _assert_each_epoch_exactly_once(_per_epoch(_seen_all(out)), [0, 1])


def test_lightning_checkpoint_at_an_epochs_last_batch_resumed_onto_fewer_ranks(data, tmp_path):
    """Saved after the last of epoch 0's 6 steps on 2 ranks: on 1 rank Lightning counts those 6
    steps as done of an epoch of 12 and carries on, so the next epoch's length must count them."""
    out = tmp_path / "run"
    out.mkdir()
    _run("lightning_fit.py", str(data), str(out), "--preempt-after", str(PER_RANK), "--datamodule")
    args = ["--resume", str(out / "preempt.ckpt"), "--devices", "1", "--max-epochs", "3", "--datamodule"]
    _run("lightning_fit.py", str(data), str(out), *args)
    _assert_each_epoch_exactly_once(_per_epoch(_seen_all(out)), [0, 1, 2])


def test_hf_trainer_refuses_a_resume_it_would_count_as_another_epoch(data, tmp_path):
    """The Trainer numbers epochs by global_step // steps per epoch of the new world: past the
    first epoch another world size would train the wrong epoch, so it is refused, by name; a
    state taken at an epoch's end resumes (the Trainer finishes that epoch with an empty pass)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from common import stream

    import mmloader
    from mmloader.errors import ResumeError
    from mmloader.frameworks.hf_trainer import _make_room_for_the_resumed_epoch

    def state_after(world: int, passes: int, limit: int | None) -> dict:
        s = stream(data)
        s.set_world(0, world)
        loader = mmloader.loader(s, num_workers=0)
        for _ in range(passes):
            list(loader)
        if limit:
            for _, _batch in zip(range(limit), loader):
                pass
        return loader.state_dict()

    def resumed(world: int, state: dict):
        s = stream(data)
        s.set_world(0, world)
        loader = mmloader.loader(s, num_workers=0)
        loader.load_state_dict(state)
        return loader

    args = SimpleNamespace(max_steps=-1, gradient_accumulation_steps=1, num_train_epochs=2)
    saved = state_after(1, 1, 4)  # epoch 1, step 4 of 12: global step 16
    with pytest.raises(ResumeError, match="resumes at global step 16 as epoch 2"):
        _make_room_for_the_resumed_epoch(resumed(2, saved), args, SimpleNamespace(global_step=16, max_steps=12))
    at_end = state_after(2, 1, None)  # epoch 0's last step on 2 ranks: global step 6
    budget = SimpleNamespace(global_step=PER_RANK, max_steps=4 * PER_RANK)
    _make_room_for_the_resumed_epoch(resumed(1, at_end), args, budget)
    assert budget.max_steps == 4 * PER_RANK
