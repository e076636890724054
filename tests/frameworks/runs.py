"""What the framework tests share: running a framework's script, reading what its training steps
received, counting samples per epoch, and the dataset (the ``data`` fixture, imported by each
test module). The scripts live beside this file; each records the batches its training steps
received, per rank, and the tests count samples from those records."""

from __future__ import annotations

import json
import os
import shutil
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


def run_script(script: str, *args: str, nproc: int | None = None, timeout: float = 240) -> None:
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


def seen(out: Path, ranks: int = 2) -> list[list[dict]]:
    return [[json.loads(line) for line in (out / f"seen-rank{r}.jsonl").read_text().splitlines()] for r in range(ranks)]


def per_epoch(rows: list[list[dict]], **where) -> Counter:
    """(epoch, key) -> how many times training received it, over all ranks."""
    c: Counter = Counter()
    for rank_rows in rows:
        for row in rank_rows:
            if all(row.get(k) == v for k, v in where.items()):
                c.update((row["epoch"], key) for key in row["keys"])
    return c


def assert_each_epoch_exactly_once(counts: Counter, epochs: list[int]) -> None:
    for e in epochs:
        keys = {k: n for (ep, k), n in counts.items() if ep == e}
        assert len(keys) == SAMPLES and set(keys.values()) == {1}, (e, sorted(keys.items())[:5], len(keys))


def seen_all(out: Path) -> list[list[dict]]:
    """The records of every rank that trained into ``out`` (a run before a resume and after it)."""
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(out.glob("seen-rank*.jsonl"))]


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    pytest.importorskip("lightning")
    return make_dataset(tmp_path_factory.mktemp("fw") / "data")
