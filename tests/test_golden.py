"""Golden batches: the keys every rank and worker gets for a few configurations, per epoch and
after a resume, pinned by digest. A refactoring that is meant to change nothing must keep
them; a change that means to reorder batches updates them on purpose:
``MMLOADER_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` (and says so in its commit)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from conftest import write_dataset

import mmloader

GOLDEN = Path(__file__).parent / "golden" / "streams.json"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("golden")
    return {
        "lmdb": write_dataset(root / "a.lmdb", 37, "lmdb"),
        "tar": write_dataset(root / "b", 29, "tar", shard_size=6),
        "tokens": _token_store(root / "tokens.lmdb", 41),
    }


def _token_store(path: Path, n: int) -> Path:
    with mmloader.writer_for(path) as w:
        for i in range(n):
            w.write({"__key__": f"t{i:03d}", "npy": np.arange(1 + (i * 7) % 19, dtype=np.int32)})
    return path


def _zip(path: Path) -> Any:
    return mmloader.zip(caption=mmloader.TextReader(path, field="txt"), label=mmloader.LabelReader(path, field="cls"))


CONFIGS: dict[str, Callable[[dict[str, Path]], mmloader.Stream]] = {
    "plain": lambda s: mmloader.Stream(_zip(s["lmdb"]), batch_size=4, seed=3),
    "in-order-drop-last": lambda s: mmloader.Stream(_zip(s["tar"]), batch_size=5, shuffle=False, drop_last=True),
    "small-blocks": lambda s: mmloader.Stream(
        _zip(s["tar"]), batch_size=3, order=mmloader.Order(seed=1, block_size=4, window_blocks=2)
    ),
    "mix": lambda s: mmloader.Stream(mmloader.mix([_zip(s["lmdb"]), _zip(s["tar"])], [0.7, 0.3]), batch_size=4, seed=5),
    "select": lambda s: mmloader.Stream(
        mmloader.select(_zip(s["lmdb"]), "label != 3", cache_dir=False, progress=False), batch_size=4, seed=2
    ),
    "bucketed": lambda s: mmloader.Stream(
        _zip(s["lmdb"]), batch_size=4, seed=4, lengths=mmloader.Bucketing("caption", window=4)
    ),
    "packed": lambda s: mmloader.Stream(
        mmloader.zip(tokens=mmloader.ArrayReader(s["tokens"], field="npy")),
        batch_size=2,
        seed=6,
        lengths=mmloader.Packing(24, length_by="tokens"),
    ),
}


def _keys(batch: Any) -> list:
    """What a batch delivered, in order: keys, or (for packed rows) the keys of each row."""
    if isinstance(batch, dict) and "__key__" in batch:
        return list(batch["__key__"])
    return [repr(batch)]


def _delivered(make: Callable[[], mmloader.Stream], world: int, workers: int, epochs=(0, 1)) -> list:
    out = []
    for epoch in epochs:
        for rank in range(world):
            stream = make()
            stream.set_world(rank, world)
            stream.set_epoch(epoch)
            for worker in range(workers):
                out.append([_keys(b) for b in stream.iter_worker(worker, workers)])
    return out


def _resumed(make: Callable[[], mmloader.Stream], world: int, after: int, new_world: int) -> list:
    """Keys after a resume: ``after`` batches of epoch 0 on each of ``world`` ranks, then the
    rest of the epoch on ``new_world`` ranks."""
    states = []
    for rank in range(world):
        stream = make()
        stream.set_world(rank, world)
        stream.set_epoch(0)
        batches = iter(stream)
        for _ in range(after):
            next(batches)
        states.append(stream.progress(after))
    out = []
    for rank in range(new_world):
        stream = make()
        stream.set_world(rank, new_world)
        stream.resume(states[0])
        stream.set_epoch(0)
        out.append([_keys(b) for b in stream])
    return out


def _digests(stores: dict[str, Path]) -> dict[str, str]:
    digests = {}
    for name, config in CONFIGS.items():

        def make(config=config):
            return config(stores)

        seen = {
            "world1": _delivered(make, 1, 1),
            "world2x2": _delivered(make, 2, 2),
            "world3": _delivered(make, 3, 1, epochs=(2,)),
            "resume2to1": _resumed(make, 2, 1, 1),
        }
        digests[name] = hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()
    return digests


def test_the_same_seeds_deliver_the_same_batches_as_pinned(stores):
    got = _digests(stores)
    if os.environ.get("MMLOADER_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    changed = sorted(name for name in set(want) | set(got) if want.get(name) != got.get(name))
    assert not changed, (
        f"batches changed for {changed}: a change meant to keep them must not; see this file's docstring"
    )
