"""img2dataset's output opened directly: a real img2dataset run (the command-line tool, from its
own venv: ``make test`` builds it and names it in ``MMLOADER_IMG2DATASET``) downloads images from
a static HTTP server on 127.0.0.1, two of its URLs missing, and writes webdataset shards with
their Parquet tables and statistics."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from remote_servers import RangeServer

import mmloader
from mmloader.errors import FormatError
from mmloader.storage import Img2DatasetStore, open_store

URLS, MISSING, PER_SHARD = 26, (4, 17), 8


def _tool() -> str:
    tool = os.environ.get("MMLOADER_IMG2DATASET") or str(ROOT / ".venv-tools" / "bin" / "img2dataset")
    if not Path(tool).is_file():
        pytest.skip(f"img2dataset is not installed at {tool}: `make test` installs it (make .venv-tools/.installed)")
    return tool


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    from PIL import Image

    work = tmp_path_factory.mktemp("img2dataset")
    (work / "images").mkdir()
    for i in range(URLS):
        if i not in MISSING:
            Image.fromarray(np.full((16 + i, 20, 3), i * 9, np.uint8)).save(work / "images" / f"{i}.jpg", quality=95)
    server = RangeServer(work / "images")
    try:
        with open(work / "urls.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["url", "caption"])
            for i in range(URLS):
                w.writerow([f"{server.url}/{i}.jpg", f"caption {i}"])
        subprocess.run(
            [
                _tool(),
                "--url_list", str(work / "urls.csv"),
                "--input_format", "csv",
                "--url_col", "url",
                "--caption_col", "caption",
                "--output_format", "webdataset",
                "--output_folder", str(work / "out"),
                "--processes_count", "1",
                "--thread_count", "4",
                "--resize_mode", "no",
                "--number_sample_per_shard", str(PER_SHARD),
                "--distributor", "multiprocessing",
                "--enable_wandb", "False",
            ],
            check=True,
            capture_output=True,
            timeout=240,
            env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"},
        )  # fmt: skip
    finally:
        server.stop()
    return work / "out"


def _parquet_rows(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [row for p in sorted(out.glob("*.parquet")) for row in pq.read_table(p).to_pylist()]


def test_opens_directly_with_every_downloaded_sample(output):
    store = mmloader.open(output)
    assert isinstance(store, Img2DatasetStore) and not (output / "index.json").exists()
    rows = _parquet_rows(output)
    ok = [r for r in rows if r["status"] == "success"]
    assert len(rows) == URLS and len(ok) == len(store) == URLS - len(MISSING)
    assert {store.key(i) for i in range(len(store))} == {r["key"] for r in ok}
    assert store.fields == ["jpg", "json", "txt"] and store.metadata["field_counts"]["json"] == len(store)
    for i in range(len(store)):
        meta = json.loads(store[i]["json"])
        n = int(meta["url"].rsplit("/", 1)[1].split(".")[0])
        assert meta["status"] == "success" and meta["key"] == store.key(i) and store.index_of(store.key(i)) == i
        assert store[i]["txt"].decode() == meta["caption"] == f"caption {n}"
        assert (meta["height"], meta["width"]) == (16 + n, 20)


def test_metadata_as_a_field_and_a_filter(output):
    ds = mmloader.zip(
        image=mmloader.ImageReader(output), text=mmloader.TextReader(output), meta=mmloader.JSONReader(output)
    )
    sample = ds[3]
    assert tuple(sample["image"].shape[1:]) == (sample["meta"]["height"], sample["meta"]["width"])
    tall = mmloader.select(ds, where="meta.height >= 30 and meta.status == 'success'", progress=False)
    heights = sorted(tall[i]["meta"]["height"] for i in range(len(tall)))
    assert heights == [16 + n for n in range(14, URLS) if n not in MISSING]


def test_streams_exactly_once_to_workers(output):
    ds = mmloader.zip(image=mmloader.ImageReader(output), text=mmloader.TextReader(output))
    got = []
    for rank in (0, 1):
        stream = mmloader.Stream(ds, batch_size=3, seed=5)
        stream.set_world(rank, 2)
        got += [t for b in mmloader.loader(stream, num_workers=2, backend="process") for t in b["text"]]
    want = {f"caption {n}" for n in range(URLS) if n not in MISSING}
    assert set(got) == want and len(got) == 2 * 4 * 3  # 24 samples: 4 batches of 3 per rank, none padded


def test_an_interrupted_or_changed_output_is_an_error(output, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    first = sorted(copy.glob("*_stats.json"))[0]
    stats = json.loads(first.read_text())
    stats["successes"] += 1  # the shard holds one sample fewer than its statistics say
    first.write_text(json.dumps(stats))
    store = open_store(copy)
    with pytest.raises(FormatError, match=r"00000.tar holds \d+ samples, but img2dataset's metadata lists"):
        store[0]
    first.unlink()  # a shard whose run was interrupted: no statistics
    with pytest.raises(FormatError, match=r"00000.tar has no 00000_stats.json beside it"):
        open_store(copy)


def test_inspect_and_verify(output):
    from mmloader.cli.inspect import describe
    from mmloader.cli.verify import verify

    assert "tar, indexed by img2dataset" in describe(output, preview=1)
    report = verify(output, decode=True, progress=False)
    assert report.ok and report.samples == URLS - len(MISSING)


def test_a_key_of_no_shard_is_found_without_reading_any(output):
    store = open_store(output)
    assert store.index_of("99999999") is None and not store._idx  # no shard's headers walked
    key = store.key(len(store) - 1)
    assert store.index_of(key) == len(store) - 1
