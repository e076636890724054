"""Lightning resumed onto another world size from a checkpoint taken mid-epoch: every later epoch
whole, the resumed one exactly once, with the DataModule and with a loader the module returns
itself (tests of mmloader/frameworks/lightning.py)."""

from __future__ import annotations

import json

import pytest
from runs import (
    assert_each_epoch_exactly_once,
    copy_run,
    data,  # noqa: F401 (a fixture)
    per_epoch,
    run_script,
    seen_all,
)

# -- resumes onto another world size: every later epoch whole, the resumed one exactly once -------


@pytest.fixture(scope="module")
def lightning_preempted(data, tmp_path_factory):
    """Lightning checkpoints after step 4 of epoch 0: on 2 ranks (the loader returned by the
    module's own train_dataloader) and on 1 (a DataModule)."""
    runs = {}
    for world, how in ((2, []), (1, ["--datamodule"])):
        out = tmp_path_factory.mktemp(f"lightning-preempted-{world}")
        run_script("lightning_fit.py", str(data), str(out), "--preempt-after", "4", "--devices", str(world), *how)
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
    out = copy_run(lightning_preempted[saved], tmp_path / "run")
    assert sum(len(r) for r in seen_all(out)) == 4 * saved
    args = ["--resume", str(out / "preempt.ckpt"), "--devices", str(resumed), "--max-epochs", "3"]
    run_script(
        "lightning_fit.py",
        str(data),
        str(out),
        *args,
        "--backend",
        backend,
        *(["--datamodule"] if how != "plain" else []),
    )
    assert_each_epoch_exactly_once(per_epoch(seen_all(out)), [0, 1, 2])
    assert json.loads((out / "warnings-rank0.json").read_text()) == []


def test_lightning_own_loader_resumed_onto_more_ranks_says_the_epoch_is_cut(data, lightning_preempted, tmp_path):
    """Lightning reads len() before it loads the loader's state; a loader returned by the module
    itself cannot be loaded first, so a resume needing more steps than that length is said."""
    out = copy_run(lightning_preempted[1], tmp_path / "run")
    run_script("lightning_fit.py", str(data), str(out), "--resume", str(out / "preempt.ckpt"), "--devices", "2")
    said = json.loads((out / "warnings-rank0.json").read_text())
    assert any("needs 8 steps per rank" in w and "len() was 6" in w and "DataModule" in w for w in said), said
