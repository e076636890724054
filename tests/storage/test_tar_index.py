"""Indexing tar shards other tools wrote (mmloader/storage/tar/index.py): webdataset's
ShardWriter, the foreign shards, a field twice in one sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import webdataset as wds
from conftest import _tar_with, jpeg_bytes

import mmloader
from mmloader.cli.verify import verify
from mmloader.errors import FormatError, RandomAccessError


def test_we_read_webdataset_shardwriter_output(tmp_path):
    src = tmp_path / "wds"
    src.mkdir()
    with wds.ShardWriter(str(src / "part-%04d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(8):
            sink.write({"__key__": f"dir/x{i:03d}", "jpg": jpeg_bytes(i), "txt.gz": b"", "cls": str(i)})
    manifest = mmloader.build_index(src, progress=False)
    assert manifest["count"] == 8 and len(manifest["shards"]) == 3
    ds = mmloader.open(src)
    assert ds[5]["__key__"] == "dir/x005" and ds[5]["jpg"] == jpeg_bytes(5) and ds[5]["cls"] == b"5"
    assert ds.get("dir/x007")["__index__"] == 7
    assert verify(src, progress=False).ok


def test_foreign_shards(foreign, tmp_path):
    manifest = mmloader.build_index(foreign, output=tmp_path / "idx", progress=False)
    by_file = {Path(s["file"]).name: s for s in manifest["shards"]}
    assert by_file["sample.tgz"]["count"] == 90 and by_file["sample.tgz"]["compressed"]
    assert by_file["testgz.tar"]["count"] == 1000 and by_file["compressed.tar"]["count"] == 3
    ds = mmloader.open(tmp_path / "idx")
    assert ds.key(0) == "compressed/0001"  # directory prefix kept, directory member skipped
    text = mmloader.TextReader(ds, field="txt.gz")
    assert isinstance(text[0], str) and len(text[0]) > 0
    start = by_file["testgz.tar"]
    first_testgz = sum(s["count"] for s in manifest["shards"][: manifest["shards"].index(start)])
    assert len(text[first_testgz + 999]) > 0
    tgz = manifest["shards"].index(by_file["sample.tgz"])
    first_tgz = sum(s["count"] for s in manifest["shards"][:tgz])
    with pytest.raises(RandomAccessError, match="compressed.*gunzip"):
        ds[first_tgz]
    sequential = list(ds.iter_samples([tgz]))
    assert len(sequential) == 90 and sequential[0]["png"][:4] == b"\x89PNG"
    assert {"png", "cls"} <= set(sequential[0])
    assert verify(tmp_path / "idx", progress=False).ok


def test_a_field_twice_in_one_sample_is_refused_when_indexing(tmp_path):
    src = tmp_path / "dup" / "a.tar"
    _tar_with(src, [("x.jpg", b"1"), ("x.JPG", b"2")])
    with pytest.raises(FormatError, match=r"sample 'x' has field 'jpg' twice"):
        mmloader.build_index(src.parent, progress=False)
    with pytest.raises(ValueError, match="duplicate"):  # WebDataset refuses it too
        list(wds.WebDataset(str(src), shardshuffle=False))
