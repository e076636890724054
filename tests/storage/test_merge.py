"""Merging datasets and conversion parts (mmloader.storage.write.merge) on real files: concatenation in
order, shards cut as one process cuts them, LMDB records copied, and parts refused when missing,
duplicated, foreign or changed. (The converters' --part runs end to end are in test_converters.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import make_samples

import mmloader
from mmloader.cli.verify import verify
from mmloader.errors import FormatError
from mmloader.storage.write.merge import (
    PartError,
    check_parts,
    find_parts,
    merge,
    merge_parts,
    part_dataset,
    parts_dir_for,
    write_part_manifest,
)


def _write(path: Path, start: int, n: int, fmt: str = "tar", shard_size: int = 4, **kw) -> Path:
    opts = {"shard_size": shard_size} if fmt == "tar" else {}
    with mmloader.writer_for(path, fmt, **opts, **kw) as w:
        for s in make_samples(n, start):
            w.write(s)
    return path


def _samples(path) -> list[dict]:
    store = mmloader.open(path)
    out = []
    for i in range(len(store)):
        rec = store[i]
        rec.pop("__index__", None)
        out.append(rec)
    return out


def _shas(path: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.glob("*.tar"))]


def test_merging_datasets_concatenates_them_in_order_keeping_their_shards(tmp_path):
    a, b = _write(tmp_path / "a", 0, 6), _write(tmp_path / "b", 6, 5)
    out = merge([a, b], tmp_path / "all", progress=False)
    assert _samples(out) == _samples(a) + _samples(b)
    assert _shas(out) == _shas(a) + _shas(b)  # kept as they are, not re-encoded
    assert verify(out, progress=False).ok
    with pytest.raises(FileExistsError):
        merge([a, b], tmp_path / "all", progress=False)
    assert _samples(merge([b, a], tmp_path / "all", overwrite=True, progress=False)) == _samples(b) + _samples(a)


def test_with_shard_limits_the_merged_shards_are_those_one_process_writes(tmp_path):
    whole = _write(tmp_path / "whole", 0, 13, shard_size=4)
    parts = [_write(tmp_path / "p0", 0, 6, shard_size=4), _write(tmp_path / "p1", 6, 7, shard_size=4)]  # 4+2, 4+3
    out = merge(parts, tmp_path / "merged", shard_size=4, progress=False)
    assert [s["count"] for s in mmloader.open(out).shards] == [4, 4, 4, 1]
    assert _shas(out) == _shas(whole)  # byte-identical to the one-process conversion
    assert _samples(out) == _samples(whole)


def test_lmdb_datasets_merge_record_by_record(tmp_path):
    a, b = _write(tmp_path / "a.lmdb", 0, 4, "lmdb"), _write(tmp_path / "b.lmdb", 4, 3, "lmdb")
    out = merge([a, b], tmp_path / "all.lmdb", progress=False)
    assert mmloader.open(out).format == "lmdb"
    assert _samples(out) == _samples(a) + _samples(b)
    tar = merge([a, b], tmp_path / "as-shards", format="tar", progress=False)  # LMDB parts into tar shards
    assert _samples(tar) == _samples(out)


def test_datasets_with_different_metadata_are_not_merged(tmp_path):
    a = _write(tmp_path / "a", 0, 2, metadata={"classes": ["cat", "dog"]})
    b = _write(tmp_path / "b", 2, 2, metadata={"classes": ["dog", "cat"]})
    with pytest.raises(FormatError, match="different metadata"):
        merge([a, b], tmp_path / "all", progress=False)
    assert not (tmp_path / "all").exists()


def _parts(tmp_path: Path, n: int = 3, per: int = 4, fingerprint: str = "fp-1", dst: str = "out") -> Path:
    parts_dir = parts_dir_for(tmp_path / dst)
    parts_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        ds = _write(part_dataset(parts_dir, i, n, "tar"), i * per, per, shard_size=per)
        report = parts_dir / f"part-{i}.skipped.tsv"
        report.write_text(f"key\tfile\treason\nbad{i}\tx{i}.jpg\tunreadable\n")
        write_part_manifest(
            ds, part=i, parts=n, fingerprint=fingerprint, fmt="tar", count=per, skipped=1, report=report, shard_size=per
        )
    return parts_dir


def test_the_parts_of_one_conversion_merge_into_the_whole(tmp_path):
    parts_dir = _parts(tmp_path)
    result = merge_parts([parts_dir], tmp_path / "out", progress=False, keep_parts=False)
    assert (result.count, result.parts, result.skipped) == (12, 3, 1 * 3)
    assert [r["__key__"] for r in _samples(tmp_path / "out")] == [f"s{i:05d}" for i in range(12)]
    assert Path(result.report).read_text().splitlines() == ["key\tfile\treason"] + [
        f"bad{i}\tx{i}.jpg\tunreadable" for i in range(3)
    ]
    assert not parts_dir.exists()


def test_missing_duplicated_foreign_and_changed_parts_are_refused_naming_them(tmp_path):
    parts_dir = _parts(tmp_path)
    records = find_parts([parts_dir])
    assert [r["part"] for r in check_parts(records)] == [0, 1, 2]
    with pytest.raises(PartError, match=r"part 1/3 is missing"):
        check_parts([records[0], records[2]])
    with pytest.raises(PartError, match=r"part 2/3 given twice"):
        check_parts(records + [records[2]])
    other = find_parts([_parts(tmp_path, fingerprint="fp-2", dst="other")])
    with pytest.raises(PartError, match="foreign part .*part-00001-of-00003.json: it was converted from another input"):
        check_parts([records[0], other[1], records[2]])
    with pytest.raises(PartError, match="it is part 0 of 2, not of 3"):
        check_parts(records + find_parts([_parts(tmp_path, n=2, dst="two")])[:1])
    shard = sorted(part_dataset(parts_dir, 1, 3, "tar").glob("*.tar"))[0]
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)  # changed since its manifest was written
    with pytest.raises(PartError, match=rf"part 1/3: {shard}.*manifest says"):
        check_parts(records)
    unfinished = parts_dir_for(tmp_path / "late")
    _write(part_dataset(unfinished, 0, 2, "tar"), 0, 2)  # a part dataset without its manifest
    with pytest.raises(PartError, match="no part manifest: no part is finished yet"):
        find_parts([unfinished])
    with pytest.raises(PartError, match="has no part manifest: that part is not finished"):
        find_parts([part_dataset(unfinished, 0, 2, "tar")])
    json.loads((parts_dir / "part-00000-of-00003.json").read_text())  # the manifests stay readable JSON
