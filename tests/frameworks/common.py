"""What the framework scripts share: the dataset, the stream, and the record of trained batches.

Each script appends one JSON line per batch a training step received, per rank, to
``<out>/seen-rank<r>.jsonl``: the tests count samples from these files, so a batch read
ahead but never trained is not counted as delivered.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

if os.environ.get("MMLOADER_TEST_HANG_DUMP"):  # a hung run prints every thread's stack, then exits
    faulthandler.dump_traceback_later(float(os.environ["MMLOADER_TEST_HANG_DUMP"]), exit=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, as in the tests

import mmloader  # noqa: E402

SAMPLES, BATCH = 96, 8


def make_dataset(path: str | Path) -> Path:
    """96 text samples in 3 tar shards (keys k0000..k0095)."""
    path = Path(path)
    if not (path / "index.json").exists():
        with mmloader.ShardWriter(path, shard_size=32) as w:
            for i in range(SAMPLES):
                w.write({"__key__": f"k{i:04d}", "txt": f"caption {i}"})
    return path


def stream(path: str | Path, shuffle: bool = True, **kw) -> "mmloader.Stream":
    ds = mmloader.zip(caption=mmloader.TextReader(str(path)))
    order = mmloader.Order(shuffle=shuffle, seed=3, block_size=4, window_blocks=2)
    return mmloader.Stream(ds, batch_size=BATCH, order=order, **kw)


def record(out: str | Path, rank: int, **fields) -> None:
    with open(Path(out) / f"seen-rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")
        f.flush()
        os.fsync(f.fileno())
