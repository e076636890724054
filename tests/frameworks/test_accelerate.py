"""accelerate under torchrun: prepare() leaves the sharding to mmloader, and save_state /
load_state carry the loader's position."""

from __future__ import annotations

import json

import pytest
from runs import (
    BATCH,
    PER_RANK,
    SAMPLES,
    assert_each_epoch_exactly_once,
    data,  # noqa: F401 (a fixture)
    per_epoch,
    run_script,
    seen,
)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_accelerate_prepare_leaves_the_sharding_to_mmloader(data, tmp_path, backend):
    pytest.importorskip("accelerate")
    run_script("accelerate_loop.py", str(data), str(tmp_path), "--backend", backend, nproc=2)
    info = json.loads((tmp_path / "info-rank0.json").read_text())
    assert info["same_object"] and info["len"] == PER_RANK
    rows = seen(tmp_path)
    assert_each_epoch_exactly_once(per_epoch(rows, run="train"), [0, 1])
    resumed = per_epoch(rows, run="resumed")  # load_state after step 1 of epoch 1: its 4 last batches
    trained = per_epoch([[row for row in r if row["run"] == "train" and row["epoch"] == 1][2:] for r in rows])
    assert resumed == trained and sum(resumed.values()) == SAMPLES - 2 * 2 * BATCH
