"""Datasets prepared by the real ``energon prepare`` (megatron-energon, non-interactive) on shards
that the real ``webdataset`` wrote, opened directly: every split as Energon's own loader reads
it, excludes honoured, through mmloader.open, readers, configs and DataLoader workers."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import mmloader
from mmloader.errors import FormatError
from mmloader.storage import EnergonStore, open_store
from mmloader.storage.foreign.energon import expand_braces

wds = pytest.importorskip("webdataset")
energon = pytest.importorskip("megatron.energon")
ENERGON = Path(sys.executable).parent / "energon"
pytestmark = pytest.mark.filterwarnings("ignore:.pin_memory. argument")  # Energon's own loader, on a CPU
SHARDS, PER_SHARD = 4, 6


def _jpeg(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((8 + i % 3, 8, 3), i * 7 % 256, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _prepare(root: Path, *args: str) -> None:
    subprocess.run(
        [str(ENERGON), "prepare", str(root), "--non-interactive", "--no-progress", "--num-workers", "1", *args],
        check=True,
        capture_output=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("energon") / "ds"
    root.mkdir()
    for s in range(SHARDS):
        with wds.TarWriter(str(root / f"part_{s:03d}.tar")) as w:
            for i in range(PER_SHARD):
                n = s * PER_SHARD + i
                w.write({"__key__": f"k{n:04d}", "jpg": _jpeg(n), "txt": f"caption {n}", "json": {"n": n}})
    _prepare(
        root,
        "--split-parts",
        "train:part_{000..001}.tar",
        "--split-parts",
        "val:part_002.tar",
        "--split-parts",
        "test:part_003.tar",
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        '{"image": "jpg", "caption": "txt"}',
    )
    return root


def _energon_reads(root: Path, split: str) -> list[tuple[str, str]]:
    """(key, caption) of every sample of ``split`` as Energon's own loader gives them."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(str(root), batch_size=None, worker_config=wc, split_part=split)
    return [(s.__key__, getattr(s, "caption", None) or s.text) for s in get_loader(ds)]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_each_split_as_energon_reads_it(prepared, split):
    store = mmloader.open(prepared, split=split)
    assert isinstance(store, EnergonStore)
    ours = [(store.key(i), store[i]["txt"].decode()) for i in range(len(store))]
    assert sorted(ours) == sorted(_energon_reads(prepared, split))
    assert store.metadata["field_counts"] == {"jpg": len(store), "json": len(store), "txt": len(store)}
    for i in range(len(store)):
        assert store.index_of(store.key(i)) == i
    n = int(store.key(2)[1:])
    assert store[2]["jpg"] == _jpeg(n) and json.loads(store[2]["json"]) == {"n": n}


def test_readers_configs_and_workers(prepared, tmp_path):
    store = open_store(prepared)  # train by default
    ds = mmloader.zip(image=mmloader.ImageReader(store), text=mmloader.TextReader(store, field="txt"))
    assert tuple(ds[0]["image"].shape[:1]) == (3,)
    copy = pickle.loads(pickle.dumps(ds))
    seen = [
        k
        for b in mmloader.loader(mmloader.Stream(copy, batch_size=4, seed=2), num_workers=2, backend="process")
        for k in b["__key__"]
    ]
    assert sorted(seen) == sorted(store.key(i) for i in range(len(store))) and len(seen) == 2 * PER_SHARD
    config = tmp_path / "exp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "batch_size": 3,
                "sources": {"coco": {"path": str(prepared), "split": "val", "modalities": {"text": {"field": "txt"}}}},
            }
        )
    )
    stream = mmloader.from_config(config)
    texts = sorted(t for b in mmloader.loader(stream, num_workers=0) for t in b["text"])
    assert texts == sorted(f"caption {n}" for n in range(2 * PER_SHARD, 3 * PER_SHARD))


def test_excludes_and_brace_patterns(prepared, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(prepared, root)
    split = root / ".nv-meta" / "split.yaml"
    spec = yaml.safe_load(split.read_text())
    spec["split_parts"]["train"] = ["part_{000..002}.tar"]
    spec["exclude"] = ["part_001.tar", "part_002.tar/k0013"]
    split.write_text(yaml.safe_dump(spec))
    store = open_store(root)
    keys = [store.key(i) for i in range(len(store))]
    want = [k for k, _c in _energon_reads(root, "train")]
    assert sorted(keys) == sorted(want) and "k0013" not in keys and "k0006" not in keys
    assert len(store) == 2 * PER_SHARD - 1 and store.metadata["field_counts"]["txt"] == len(store)
    assert store.index_of("k0013") is None and store.index_of("k0006") is None
    assert expand_braces("a{1..3}") == ["a1", "a2", "a3"]


def test_a_preparation_without_index_sqlite_walks_headers(prepared, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(prepared, root)
    (root / ".nv-meta" / "index.sqlite").unlink()
    old, new = open_store(prepared, split="val"), open_store(root, split="val")
    assert [new.key(i) for i in range(len(new))] == [old.key(i) for i in range(len(old))]
    assert all(new[i]["jpg"] == old[i]["jpg"] for i in range(len(new)))


def test_clear_errors(prepared, tmp_path):
    with pytest.raises(FormatError, match=r"no split 'dev' in split.yaml \(splits: train, val, test\)"):
        open_store(prepared, split="dev")
    with pytest.raises(TypeError, match="split= applies to Energon datasets"):
        open_store(tmp_path, split="val")
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(prepared, root)
    with open(root / "part_000.tar", "r+b") as f:  # a shard changed after it was prepared
        f.truncate(3 * 1024)
    store = open_store(root)
    with pytest.raises(Exception, match="part_000.tar"):
        [store[i] for i in range(len(store))]


def test_verify_checks_energons_index_against_the_tars(prepared, tmp_path):
    import shutil
    import sqlite3

    from mmloader.cli.verify import verify

    assert verify(prepared, progress=False).ok
    root = tmp_path / "ds"
    shutil.copytree(prepared, root)
    with sqlite3.connect(root / ".nv-meta" / "index.sqlite") as db:  # one part's offset off by a block
        db.execute("UPDATE sample_parts SET content_byte_offset = content_byte_offset + 512 WHERE sample_index = 1")
    report = verify(root, progress=False)
    assert not report.ok and "offset index does not match the tar" in report.summary()


def test_excluded_keys_with_slashes_and_fields_of_later_shards(tmp_path):
    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    for s in range(2):
        with wds.TarWriter(str(root / "train" / f"s{s}.tar")) as w:
            for i in range(4):
                extra = {"json": {"i": i}} if s == 1 else {}  # a field only the later shard has
                w.write({"__key__": f"dir{i % 2}/k{s}_{i}", "txt": f"t{s}{i}", **extra})
    _prepare(
        root,
        "--split-parts",
        "train:train/s{0..1}.tar",
        "--split-parts",
        "val:train/s1.tar",
        "--sample-type",
        "TextSample",
        "--field-map",
        '{"text": "txt"}',
    )
    split = root / ".nv-meta" / "split.yaml"
    spec = yaml.safe_load(split.read_text())
    spec["exclude"] = ["train/s0.tar/dir1/k0_1"]
    split.write_text(yaml.safe_dump(spec))
    store = open_store(root)
    keys = sorted(store.key(i) for i in range(len(store)))
    assert keys == sorted(k for k, _c in _energon_reads(root, "train")) and "dir1/k0_1" not in keys
    assert store.index_of("dir1/k0_1") is None and store.metadata["field_counts"]["json"] == 4
    (root / ".nv-meta" / "index.sqlite").unlink()  # an older preparation: the headers walked
    old = open_store(root)
    assert sorted(old.key(i) for i in range(len(old))) == keys and old.metadata["field_counts"]["json"] == 4
    # two splits of one folder are two stores, zipped or in a config
    val = mmloader.TextReader(open_store(root, split="val"), field="txt")
    train = mmloader.TextReader(open_store(root, split="train"), field="txt")
    with pytest.raises(mmloader.errors.AlignmentError):
        mmloader.zip(v=val, t=train)  # 4 val samples vs 7 train: not the same samples


def test_a_modalitys_own_path_takes_the_split(prepared, tmp_path):
    config = {
        "batch_size": 4,
        "sources": {
            "coco": {
                "split": "val",
                "modalities": {
                    "text": {"path": str(prepared), "field": "txt"},
                    "image": {"path": str(prepared), "field": "jpg"},
                },
            }
        },
    }
    stream = mmloader.from_config(config)
    texts = sorted(t for b in mmloader.loader(stream, num_workers=0) for t in b["text"])
    assert texts == sorted(f"caption {n}" for n in range(2 * PER_SHARD, 3 * PER_SHARD))
