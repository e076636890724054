"""The tar shard writer (mmloader/storage/tar/writer.py): shards webdataset and tar read as ours,
headers byte-identical to tarfile's, long and unicode keys."""

from __future__ import annotations

import subprocess

import pytest
import webdataset as wds

import mmloader
from mmloader.cli.verify import verify


def test_webdataset_reads_our_shards_byte_identically(tar_ds):
    ours = mmloader.open(tar_ds)
    urls = [str(tar_ds / s["file"]) for s in ours.shards]
    seen = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(seen) == len(ours)
    for i, sample in enumerate(seen):
        rec = ours[i]
        assert sample["__key__"] == rec["__key__"]
        for f in ours.fields:
            assert sample[f] == rec[f]


@pytest.mark.process
def test_tar_tf_lists_our_shards(tar_ds):
    shard = mmloader.open(tar_ds).shard_path(0)
    out = subprocess.run(["tar", "tf", shard], capture_output=True, text=True, check=True).stdout.split()
    assert out[:5] == [f"s00000.{f}" for f in ("jpg", "txt", "cls", "json", "npy")]


@pytest.mark.parametrize(
    "name,size,mtime", [("a/b/0001.jpg", 20000, 0), ("x.txt", 0, 1700000000), ("k" * 95 + ".jpg", 12345678, 5)]
)
def test_fast_tar_headers_are_byte_identical_to_tarfile(name, size, mtime):
    import tarfile

    from mmloader.storage.tar.writer import ustar_header

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, mtime
    assert ustar_header(name, size, mtime) == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def test_long_and_unicode_keys_round_trip_through_webdataset(tmp_path):
    keys = ["d" * 120 + "/x", "ünïcødé/中文"]
    with mmloader.ShardWriter(tmp_path / "s") as w:
        for k in keys:
            w.write({"__key__": k, "txt": k})
    ds = mmloader.open(tmp_path / "s")
    assert [ds[i]["txt"].decode() for i in range(2)] == keys
    seen = list(wds.WebDataset(str(tmp_path / "s" / "data-000000.tar"), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in seen] == keys
    assert verify(tmp_path / "s", progress=False).ok
