"""Shared fixtures: small real datasets written with mmloader's own writers."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mmloader

pytest_plugins = ["kinds"]

FOREIGN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "foreign-shards"


def jpeg_bytes(seed: int, size=(48, 32), **save) -> bytes:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8)
    im = Image.fromarray(base).resize(size, Image.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=save.pop("quality", 90), **save)
    return buf.getvalue()


def write_pairs_folder(root: Path, count: int, px: int) -> Path:
    """A raw pairs folder of ``count`` identical ``px``-square JPEGs with distinct captions."""
    root.mkdir(parents=True, exist_ok=True)
    blob = jpeg_bytes(0, size=(px, px))
    for i in range(count):
        (root / f"{i:05d}.jpg").write_bytes(blob)
        (root / f"{i:05d}.txt").write_text(f"t{i}")
    return root


def make_samples(n: int, start: int = 0, prefix: str = "s"):
    for i in range(start, start + n):
        yield {
            "__key__": f"{prefix}{i:05d}",
            "jpg": jpeg_bytes(i),
            "txt": f"caption number {i} é",
            "cls": i % 7,
            "json": {"i": i, "tags": ["a", "b"]},
            "npy": np.arange(i % 5, dtype=np.float32),
        }


def write_dataset(path: Path, n: int, fmt: str, shard_size: int = 4, **kw) -> Path:
    opts = {"shard_size": shard_size} if fmt == "tar" else {}
    with mmloader.writer_for(path, fmt, **opts, **kw) as w:
        for s in make_samples(n):
            w.write(s)
    return path


def train_tokenizer(lines: list[str], path: Path) -> None:
    """A small byte-level BPE with BOS/EOS, trained on the test's own lines (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    tok.save(str(path))


@pytest.fixture(scope="session")
def lmdb_ds(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("lmdb") / "ds.lmdb", 23, "lmdb")


@pytest.fixture(scope="session")
def tar_ds(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tar") / "shards", 23, "tar", shard_size=5)


@pytest.fixture(params=["lmdb", "tar"])
def any_ds(request, lmdb_ds, tar_ds) -> Path:
    return lmdb_ds if request.param == "lmdb" else tar_ds


@pytest.fixture
def foreign() -> Path:
    if not FOREIGN.is_dir():
        pytest.skip(f"foreign shards not found at {FOREIGN} (../shared/data/foreign-shards)")
    return FOREIGN
