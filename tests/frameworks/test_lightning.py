"""mmloader inside Lightning, in real processes: ddp and ddp_spawn, a preemption and resume
from its checkpoint, a checkpoint at an epoch's last batch, mmloader's validation loaders (tests
of mmloader/frameworks/lightning.py and of the loaders inside Lightning's loops; resumes onto
another world size are in test_lightning_resume.py, so that two workers run them side by side)."""

from __future__ import annotations

import json
import sys

import pytest
from runs import (
    HERE,
    PER_RANK,
    SAMPLES,
    assert_each_epoch_exactly_once,
    data,  # noqa: F401 (a fixture)
    per_epoch,
    run_script,
    seen,
    seen_all,
)


@pytest.fixture(scope="module")
def lightning_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    run_script("lightning_fit.py", str(data), str(out))
    return out


def test_lightning_ddp_epochs_advance_in_new_orders_each_exactly_once(lightning_run):
    rows = seen(lightning_run)
    assert [len(r) for r in rows] == [2 * PER_RANK] * 2
    assert_each_epoch_exactly_once(per_epoch(rows), [0, 1])
    for r in rows:  # a new order in epoch 1 (Lightning never called our loader's set_epoch before)
        assert r[0]["keys"] != r[PER_RANK]["keys"]
    stats = json.loads((lightning_run / "stats-rank0.json").read_text())["logged"]
    assert stats["batches"] == 2 and stats["compute_s"] > 0 and 0 <= stats["wait_fraction"] < 1


def test_lightning_preempted_mid_epoch_resumes_from_its_checkpoint(data, lightning_run, tmp_path):
    out = tmp_path
    run_script("lightning_fit.py", str(data), str(out), "--preempt-after", "4")
    assert [len(r) for r in seen(out)] == [4, 4]
    run_script("lightning_fit.py", str(data), str(out), "--resume", str(out / "preempt.ckpt"))
    both = seen(out)
    assert_each_epoch_exactly_once(per_epoch(both), [0, 1])  # epoch 1 whole, not the tail of epoch 0
    uninterrupted = seen(lightning_run)
    for r in range(2):  # and in the order an uninterrupted run trains
        assert [row["keys"] for row in both[r]] == [row["keys"] for row in uninterrupted[r]]


def test_lightning_ddp_spawn_datamodule_with_limit_train_batches(data, lightning_run, tmp_path):
    """Process backend with persistent workers: Lightning leaves each epoch after 3 batches, makes
    the next iterator and only then sets the epoch."""
    run_script(
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
    rows, full = seen(tmp_path), seen(lightning_run)
    for r in range(2):
        assert [row["epoch"] for row in rows[r]] == [0, 0, 0, 1, 1, 1]
        # epoch 1 starts at its own beginning (Lightning's set_epoch), not after epoch 0's 3 batches
        assert [row["keys"] for row in rows[r][:6]] == [row["keys"] for row in full[r][:3] + full[r][PER_RANK:][:3]]
    assert not {k for row in rows[0][:3] for k in row["keys"]} & {k for row in rows[1][:3] for k in row["keys"]}


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


def test_lightning_checkpoint_at_an_epochs_last_batch_resumed_onto_fewer_ranks(data, tmp_path):
    """Saved after the last of epoch 0's 6 steps on 2 ranks: on 1 rank Lightning counts those 6
    steps as done of an epoch of 12 and carries on, so the next epoch's length must count them."""
    out = tmp_path / "run"
    out.mkdir()
    run_script("lightning_fit.py", str(data), str(out), "--preempt-after", str(PER_RANK), "--datamodule")
    args = ["--resume", str(out / "preempt.ckpt"), "--devices", "1", "--max-epochs", "3", "--datamodule"]
    run_script("lightning_fit.py", str(data), str(out), *args)
    assert_each_epoch_exactly_once(per_epoch(seen_all(out)), [0, 1, 2])
