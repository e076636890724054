"""verify (mmloader/cli/verify.py) of stored datasets: flipped bytes, truncated shards, images that
do not decode or are empty."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import _half_jpeg, jpeg_bytes, write_dataset

import mmloader
from mmloader.cli.verify import verify


def _copy_dataset(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_verify_catches_flipped_byte_in_shard(tar_ds, tmp_path):
    ds = _copy_dataset(tar_ds, tmp_path / "c")
    assert verify(ds, progress=False).ok
    shard = ds / mmloader.open(ds).shards[2]["file"]
    data = bytearray(shard.read_bytes())
    data[700] ^= 0x01
    shard.write_bytes(bytes(data))
    report = verify(ds, progress=False)
    assert not report.ok and any("sha256" in p and shard.name in p for p in report.problems)


def test_verify_catches_truncated_shard(tar_ds, tmp_path):
    ds = _copy_dataset(tar_ds, tmp_path / "c")
    shard = ds / mmloader.open(ds).shards[1]["file"]
    shard.write_bytes(shard.read_bytes()[:3000])
    report = verify(ds, progress=False)
    text = "\n".join(report.problems)
    assert not report.ok and shard.name in text and "truncated" in text


def test_verify_catches_flipped_byte_in_lmdb(tmp_path):
    path = write_dataset(tmp_path / "v.lmdb", 5, "lmdb")
    assert verify(path, progress=False).ok
    data = (path / "data.mdb").read_bytes()
    needle = b"caption number 3"
    at = data.index(needle)
    patched = data[:at] + b"Caption" + data[at + 7 :]
    (path / "data.mdb").write_bytes(patched)
    report = verify(path, progress=False)
    assert not report.ok and any("'txt'" in p and "CRC32" in p for p in report.problems)


def test_verify_decode_catches_corrupt_image(tmp_path):
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "good", "jpg": jpeg_bytes(1)})
        w.write({"__key__": "bad", "jpg": jpeg_bytes(2)[:200]})
    assert verify(path, progress=False).ok  # bytes are as written...
    report = verify(path, decode=True, progress=False)  # ...but one does not decode
    assert not report.ok and any("'bad'" in p for p in report.problems)


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_verify_reports_an_empty_image_without_decoding(tmp_path, fmt):
    """A 0-byte image matches its metadata (it was written so) but is never an image: verify
    names it without --decode, since readers refuse it on every path."""
    path = tmp_path / ("d.lmdb" if fmt == "lmdb" else "d")
    with mmloader.writer_for(path, fmt) as w:
        w.write({"__key__": "good", "jpg": jpeg_bytes(1), "txt": ""})
        w.write({"__key__": "empty", "jpg": b"", "txt": "an empty caption is fine"})
    report = verify(path, progress=False)
    assert report.problems and all("'empty'" in p and "0 bytes" in p for p in report.problems), report.problems


def test_verify_checks_gzipped_images_like_the_readers(tmp_path):
    """An image stored as .jpg.gz is gunzipped and decoded by the readers: verify treats it as
    an image (a 0-byte one is reported, a good one decodes with --decode)."""
    import gzip

    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "good", "jpg.gz": gzip.compress(jpeg_bytes(1))})
        w.write({"__key__": "empty", "jpg.gz": b""})
    for decode in (False, True):
        problems = verify(path, decode=decode, progress=False).problems
        assert len(problems) == 1 and "'empty'" in problems[0] and "0 bytes" in problems[0], problems


def test_verify_decode_reports_the_halved_jpeg(tmp_path):
    from mmloader.cli.verify import verify

    path = tmp_path / "half.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "halved", "jpg": _half_jpeg()})
    report = verify(path, decode=True, progress=False)
    assert not report.ok and "halved" in report.summary()
