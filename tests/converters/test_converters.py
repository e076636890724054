"""Converters on small raw folders made by the tests (real JPEG/PNG files)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, jpeg_bytes, train_tokenizer, write_pairs_folder
from PIL import Image

import mmloader
from mmloader.cli import main as cli
from mmloader.cli.verify import verify


def run(*argv) -> int:
    try:
        return cli(["convert", *map(str, argv), "-q"])
    except SystemExit as e:  # argparse / early checks exit with a message
        return e.code if isinstance(e.code, int) else 1


def _png(seed, size=(20, 16)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 4), dtype=np.uint8)).save(
        buf, "PNG"
    )
    return buf.getvalue()


@pytest.fixture
def pairs_dir(tmp_path) -> Path:
    root = tmp_path / "raw"
    for i in range(12):
        d = root / ("a" if i < 6 else "b/c")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.jpg").write_bytes(jpeg_bytes(i, size=(64, 40)))
        (d / f"{i:04d}.txt").write_text(f"caption {i} — ünïcode")
        (d / f"{i:04d}.json").write_text(json.dumps({"i": i}))
        if i % 3 == 0:
            (d / f"{i:04d}.png").write_bytes(_png(i))
    return root


def _read_all(path):
    ds = mmloader.open(path)
    return [ds[i] for i in range(len(ds))]


def test_convert_from_python_writes_what_the_command_writes(pairs_dir, tmp_path):
    """mmloader.converters.convert: the layout's options as typed keywords, the summary returned."""
    from mmloader.converters import LAYOUTS, convert

    from mmloader.cli.convert import CONVERTERS

    assert LAYOUTS == CONVERTERS
    summary = convert("pairs", pairs_dir, tmp_path / "api", shard_size=5, require=["jpg", "txt"], quiet=True)
    assert run("pairs", pairs_dir, tmp_path / "cli", "--shard-size", "5", "--require", "jpg,txt") == 0
    assert summary.written == 12 and "wrote 12 samples" in summary.text(str(tmp_path / "api"))
    assert _read_all(tmp_path / "api") == _read_all(tmp_path / "cli")
    assert mmloader.open(tmp_path / "api").shards == mmloader.open(tmp_path / "cli").shards


def test_convert_from_python_names_what_cannot_work(pairs_dir, tmp_path):
    from mmloader.converters import convert
    from mmloader.converters.items import ConversionError, UsageError

    with pytest.raises(UsageError, match=r"no option 'shardsize' \(did you mean 'shard_size'\?\)"):
        convert("pairs", pairs_dir, tmp_path / "a", shardsize=5)
    with pytest.raises(UsageError, match="argument workers: 0: must be 1 or more"):
        convert("pairs", pairs_dir, tmp_path / "a", workers=0)
    with pytest.raises(UsageError, match="overwrite= takes True or False"):
        convert("pairs", pairs_dir, tmp_path / "a", overwrite="yes")
    with pytest.raises(ConversionError, match="does not exist"):  # a layout's own layout= option reaches it
        convert("documents", tmp_path / "missing", tmp_path / "a", layout="obelics")
    with pytest.raises(UsageError, match="no option 'help'"):
        convert("pairs", pairs_dir, tmp_path / "a", help=True)
    with pytest.raises(UsageError, match="unknown layout 'pair'"):
        convert("pair", pairs_dir, tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="no samples found in .*empty"):
        convert("pairs", tmp_path / "empty", tmp_path / "a", quiet=True)
    assert not (tmp_path / "a").exists()
    convert("pairs", pairs_dir, tmp_path / "a", quiet=True)
    with pytest.raises(ConversionError, match="already exists; pass overwrite=True to replace it") as e:
        convert("pairs", pairs_dir, tmp_path / "a", quiet=True)
    assert "--" not in str(e.value)  # Python callers are told Python names
    convert("pairs", pairs_dir, tmp_path / "out--overwrite.lmdb", quiet=True)
    with pytest.raises(ConversionError) as e:  # a name holding "--" is a name, not a flag
        convert("pairs", pairs_dir, tmp_path / "out--overwrite.lmdb", quiet=True)
    assert f"{tmp_path / 'out--overwrite.lmdb'} already exists; pass overwrite=True" in str(e.value)
    with pytest.raises(UsageError, match="no_special_tokens=True applies with tokenizer"):
        (tmp_path / "lines.txt").write_text("one\ntwo\n")
        convert("textlines", tmp_path / "lines.txt", tmp_path / "t", no_special_tokens=True)


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_pairs(pairs_dir, tmp_path, fmt):
    dst = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out")
    assert run("pairs", pairs_dir, dst, "--shard-size", "5") == 0
    recs = _read_all(dst)
    assert [r["__key__"] for r in recs] == [f"a/{i:04d}" for i in range(6)] + [f"b/c/{i:04d}" for i in range(6, 12)]
    assert recs[7]["jpg"] == jpeg_bytes(7, size=(64, 40))  # original bytes untouched
    assert recs[7]["txt"].decode() == "caption 7 — ünïcode" and json.loads(recs[7]["json"]) == {"i": 7}
    assert "png" in recs[6] and "png" not in recs[7]
    assert mmloader.open(dst).metadata["field_counts"]["png"] == 4
    assert verify(dst, decode=True, progress=False).ok
    assert not Path(str(dst) + ".skipped.tsv").exists()


def test_workers_2_identical_to_workers_1(pairs_dir, tmp_path):
    assert run("pairs", pairs_dir, tmp_path / "w1", "--shard-size", "5") == 0
    assert run("pairs", pairs_dir, tmp_path / "w2", "--shard-size", "5", "--workers", "2") == 0
    m1, m2 = (json.loads((tmp_path / d / "index.json").read_text()) for d in ("w1", "w2"))
    assert [s["sha256"] for s in m1["shards"]] == [s["sha256"] for s in m2["shards"]]  # byte-identical shards


def test_imagefolder_indices_equal_torchvision(tmp_path):
    from torchvision.datasets import ImageFolder

    root = tmp_path / "train"
    for n, cls in enumerate(["zebra", "Ant", "cat", "bee"]):
        (root / cls / "sub").mkdir(parents=True)
        for i in range(3):
            (root / cls / f"{cls}{i}.JPG" if i == 0 else root / cls / f"{cls}{i}.jpg").write_bytes(
                jpeg_bytes(n * 10 + i)
            )
        (root / cls / "sub" / "deep.png").write_bytes(_png(n))
        (root / cls / "notes.txt").write_text("not an image")
    assert run("imagefolder", root, tmp_path / "out.lmdb") == 0
    ds = mmloader.open(tmp_path / "out.lmdb")
    tv = ImageFolder(str(root))
    assert ds.metadata["metadata"]["classes"] == tv.classes
    assert len(ds) == len(tv.samples)
    ours = {ds.key(i): int(ds[i]["cls"]) for i in range(len(ds))}
    theirs = {os.path.splitext(os.path.relpath(p, root))[0]: c for p, c in tv.samples}
    assert ours == theirs
    assert [ds.key(i) for i in range(len(ds))] == [os.path.splitext(os.path.relpath(p, root))[0] for p, _ in tv.samples]
    assert "png" in ds.get("cat/sub/deep") and "jpg" in ds.get("cat/cat1")


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_manifest(tmp_path, kind):
    (tmp_path / "imgs").mkdir()
    rows = []
    for i in range(5):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(i))
        rows.append(
            {
                "file": f"imgs/{i}.jpg",
                "caption": f"cap {i}",
                "label": ["dog", "cat"][i % 2],
                "width": str(48),
                "source": "web",
            }
        )
    man = tmp_path / f"m.{kind}"
    if kind == "jsonl":
        man.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        with open(man, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    assert (
        run(
            "manifest",
            man,
            tmp_path / "out",
            "--image-column",
            "file",
            "--text-column",
            "caption",
            "--label-column",
            "label",
            "--keep-columns",
            "width",
        )
        == 0
    )
    ds = mmloader.open(tmp_path / "out")
    assert ds.metadata["metadata"]["classes"] == ["cat", "dog"]
    r = ds[2]
    assert r["jpg"] == jpeg_bytes(2) and r["txt"] == b"cap 2" and r["cls"] == b"1"
    assert json.loads(r["json"]) == {"width": "48"}
    assert run("manifest", man, tmp_path / "bad", "--image-column", "nope") != 0


def _lines_text() -> bytes:
    lines = [f"line {i} " + "é" * (i % 5) + "x" * (i * 7 % 23) for i in range(60)]
    lines[10] = "ünïcødé ✓ 中文"
    body = "\r\n".join(lines[:30]) + "\r\n" + "\n".join(lines[30:])  # CRLF then LF, no final newline
    return body.encode()


@pytest.mark.parametrize("workers", [1, 2])
def test_textlines_boundaries_every_line_once_in_order(tmp_path, monkeypatch, workers):
    import mmloader.converters.textlines as tl

    monkeypatch.setattr(tl, "CHUNK_BYTES", 37)  # many ranges: lines cross boundaries everywhere
    src = tmp_path / "c.txt"
    src.write_bytes(_lines_text())
    assert run("textlines", src, tmp_path / "out.lmdb", "--workers", workers) == 0
    ds = mmloader.open(tmp_path / "out.lmdb")
    want = _lines_text().decode().replace("\r\n", "\n").split("\n")
    assert [ds[i]["txt"].decode() for i in range(len(ds))] == want
    assert [ds.key(i) for i in range(3)] == ["0000000000", "0000000001", "0000000002"]


def test_textlines_parts_and_blank_policy(tmp_path):
    src = tmp_path / "c.txt"
    src.write_bytes(b"a\n\nb\nc\n\xff\xfe\nd")
    assert run("textlines", src, tmp_path / "all.lmdb", "--on-error", "skip") == 0
    report = (tmp_path / "all.lmdb.skipped.tsv").read_text()
    assert "blank line" in report and "not UTF-8" in report and "c.txt:5" in report
    assert [mmloader.open(tmp_path / "all.lmdb")[i]["txt"] for i in range(4)] == [b"a", b"b", b"c", b"d"]
    assert run("textlines", src, tmp_path / "keep.lmdb", "--blank-lines", "keep", "--on-error", "skip") == 0
    assert len(mmloader.open(tmp_path / "keep.lmdb")) == 5
    assert run("textlines", src, tmp_path / "fail.lmdb", "--blank-lines", "error") != 0
    assert not (tmp_path / "fail.lmdb").exists()
    for i in range(3):
        assert run("textlines", src, tmp_path / "merged", "--part", f"{i}/3", "--on-error", "skip") == 0
    assert cli(["merge", str(tmp_path / "merged"), "-q"]) == 0
    merged = mmloader.open(tmp_path / "merged")
    whole = mmloader.open(tmp_path / "all.lmdb")
    assert [merged[i]["__key__"] for i in range(len(merged))] == [whole.key(i) for i in range(len(whole))]
    assert (tmp_path / "merged.skipped.tsv").read_text() == report  # the parts' reports, joined in order


@pytest.mark.parametrize("workers", [1, 2])
def test_textlines_tokenizer_stores_the_ids_of_every_line(tmp_path, monkeypatch, workers):
    pytest.importorskip("tokenizers")
    import mmloader.converters.textlines as tl
    from tokenizers import Tokenizer

    monkeypatch.setattr(tl, "CHUNK_BYTES", 37)  # lines cross chunk boundaries: ids must follow their line
    src = tmp_path / "c.txt"
    src.write_bytes(_lines_text())
    want = _lines_text().decode().replace("\r\n", "\n").split("\n")
    train_tokenizer(want, tmp_path / "tok.json")
    tok = Tokenizer.from_file(str(tmp_path / "tok.json"))
    assert (
        run(
            "textlines",
            src,
            tmp_path / "ids.lmdb",
            "--tokenizer",
            tmp_path / "tok.json",
            "--workers",
            workers,
            "--blank-lines",
            "keep",
        )
        == 0
    )
    ids = mmloader.ArrayReader(tmp_path / "ids.lmdb", "ids.npy")
    text = mmloader.TextReader(tmp_path / "ids.lmdb")
    assert len(ids) == len(want)
    for i, line in enumerate(want):
        assert text[i] == line
        assert ids[i].dtype == torch.int32 and ids[i].tolist() == tok.encode(line).ids
    assert ids[3].tolist()[0] == 0 and ids[3].tolist()[-1] == 1  # BOS/EOS kept by default
    assert mmloader.open(tmp_path / "ids.lmdb").metadata["metadata"]["tokenizer"]["vocab_size"] == tok.get_vocab_size()
    # batches of ids pad to their longest, with a mask; every line once
    stream = mmloader.Stream(mmloader.zip(ids=ids), batch_size=8, seed=1)
    seen = []
    for batch in mmloader.loader(stream, num_workers=2):
        lengths = batch["__mask__"]["ids"].sum(1).tolist()
        seen += [(k, n) for k, n in zip(batch["__key__"], lengths)]
    assert sorted(seen) == sorted((text.store.key(i), len(tok.encode(l).ids)) for i, l in enumerate(want))
    assert (
        run(
            "textlines",
            src,
            tmp_path / "plain.lmdb",
            "--tokenizer",
            tmp_path / "tok.json",
            "--no-special-tokens",
            "--blank-lines",
            "keep",
        )
        == 0
    )
    assert (
        mmloader.ArrayReader(tmp_path / "plain.lmdb", "ids.npy")[3].tolist()
        == tok.encode(want[3], add_special_tokens=False).ids
    )


def test_textlines_tokenizer_errors_are_usage_errors(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    src = tmp_path / "c.txt"
    src.write_text("a\nb\n")
    assert run("textlines", src, tmp_path / "x.lmdb", "--tokenizer", tmp_path / "missing.json") == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"version": 1}')
    assert run("textlines", src, tmp_path / "x.lmdb", "--tokenizer", tmp_path / "bad.json") == 2
    assert "bad.json: not a tokenizers JSON file" in capsys.readouterr().err
    assert run("textlines", src, tmp_path / "x.lmdb", "--no-special-tokens") == 2
    assert not (tmp_path / "x.lmdb").exists()


def _shas(path) -> list[str]:
    return [s["sha256"] for s in json.loads((Path(path) / "index.json").read_text())["shards"]]


def _convert_parts(layout, src, dst, n, *opts) -> None:
    for i in range(n):
        assert run(layout, src, dst, "--part", f"{i}/{n}", *opts) == 0


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_parts_are_disjoint_and_merge_equals_whole(pairs_dir, tmp_path, fmt):
    suffix = ".lmdb" if fmt == "lmdb" else ""
    assert run("pairs", pairs_dir, tmp_path / f"whole{suffix}", "--shuffle-seed", "3", "--shard-size", "4") == 0
    merged = tmp_path / f"merged{suffix}"
    _convert_parts("pairs", pairs_dir, merged, 3, "--shuffle-seed", "3", "--shard-size", "4")
    parts = sorted(p for p in (tmp_path / f"merged{suffix}.parts").iterdir() if p.is_dir())
    assert [p.name for p in parts] == [f"part-0000{i}-of-00003{suffix}" for i in range(3)]
    keys = [set(mmloader.open(p).keys) for p in parts]
    assert not (keys[0] & keys[1]) and not (keys[1] & keys[2]) and not (keys[0] & keys[2])
    assert cli(["merge", str(merged), "-q"]) == 0
    whole, got = _read_all(tmp_path / f"whole{suffix}"), _read_all(merged)
    assert [r["__key__"] for r in whole] != sorted(r["__key__"] for r in whole)  # really shuffled
    assert got == whole
    assert verify(merged, progress=False).ok
    assert not (tmp_path / f"merged{suffix}.parts").exists()  # merged from DST.parts: removed after
    if fmt == "tar":
        assert _shas(merged) == _shas(tmp_path / "whole")  # byte-identical shards


def test_parts_from_another_folder_or_an_edited_source_are_refused(pairs_dir, tmp_path, capsys):
    """Part 0 of a folder with the same file names (one caption differs) merged silently (issue 60)."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(pairs_dir, other)
    caption = sorted(other.rglob("*.txt"))[0]
    caption.write_text("another caption")
    dst = tmp_path / "merged.lmdb"
    assert run("pairs", pairs_dir, dst, "--part", "1/2") == 0
    capsys.readouterr()
    assert run("pairs", other, dst, "--part", "0/2") != 0  # not "already converted", not a mix
    assert "a part of another conversion: it was converted from another input" in capsys.readouterr().err
    assert run("pairs", other, dst, "--part", "1/2") != 0  # the finished part is not taken for this one
    edited = tmp_path / "edited"
    shutil.copytree(pairs_dir, edited)
    dst2 = tmp_path / "edited.lmdb"
    assert run("pairs", edited, dst2, "--part", "0/2") == 0
    (sorted(edited.rglob("*.txt"))[-1]).write_text("edited between the two part runs")
    assert run("pairs", edited, dst2, "--part", "1/2") != 0
    assert "another input" in capsys.readouterr().err


def test_part_manifest_is_published_last_and_a_finished_part_is_not_converted_again(pairs_dir, tmp_path, capsys):
    dst = tmp_path / "out"
    assert run("pairs", pairs_dir, dst, "--part", "1/2", "--shard-size", "4") == 0
    manifest = json.loads((tmp_path / "out.parts" / "part-00001-of-00002.json").read_text())
    assert manifest["part"] == 1 and manifest["parts"] == 2 and manifest["count"] == 4
    assert len(manifest["fingerprint"]) == 64 and manifest["tool"].startswith("mmloader ")
    part = tmp_path / "out.parts" / "part-00001-of-00002"
    for rel, f in manifest["files"].items():  # sha256 and size of every output file
        assert f["bytes"] == (part / rel).stat().st_size
        assert f["sha256"] == hashlib.sha256((part / rel).read_bytes()).hexdigest()
    assert set(manifest["files"]) >= {"index.json", "data-000000.tar", "keys.npy"}
    mtime = (part / "data-000000.tar").stat().st_mtime_ns
    capsys.readouterr()
    assert run("pairs", pairs_dir, dst, "--part", "1/2", "--shard-size", "4") == 0
    assert "already converted" in capsys.readouterr().out and (part / "data-000000.tar").stat().st_mtime_ns == mtime
    # a part published without its manifest (killed right after the rename) is not finished: redone
    (tmp_path / "out.parts" / "part-00001-of-00002.json").unlink()
    assert run("pairs", pairs_dir, dst, "--part", "1/2", "--shard-size", "4") == 0
    assert "already converted" not in capsys.readouterr().out
    assert json.loads((tmp_path / "out.parts" / "part-00001-of-00002.json").read_text())["count"] == 4


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_merge_refuses_missing_duplicated_and_foreign_parts(pairs_dir, tmp_path, capsys):
    dst = tmp_path / "out"
    _convert_parts("pairs", pairs_dir, dst, 3, "--shard-size", "4")
    parts = tmp_path / "out.parts"
    # duplicated: the same part twice
    p0, p1, p2 = (parts / f"part-0000{i}-of-00003" for i in range(3))
    assert cli(["merge", str(p0), str(p1), str(p1), str(p2), str(dst), "-q"]) == 1
    assert "part 1/3 given twice" in _one_line_error(capsys)
    # missing
    (parts / "part-00002-of-00003.json").rename(tmp_path / "aside.json")
    assert cli(["merge", str(dst), "-q"]) == 1
    err = _one_line_error(capsys)
    assert "part 2/3 is missing" in err and "part-00002-of-00003.json" in err and "--part 2/3" in err
    (tmp_path / "aside.json").rename(parts / "part-00002-of-00003.json")
    # foreign: another N, other options, another input
    other = tmp_path / "other"
    assert run("pairs", pairs_dir, other, "--part", "0/2", "--shard-size", "4") == 0
    assert cli(["merge", str(p0), str(p1), str(tmp_path / "other.parts" / "part-00000-of-00002"), str(dst), "-q"]) == 1
    err = _one_line_error(capsys)
    assert "foreign part" in err and "part-00000-of-00002.json" in err and "not of 3" in err
    assert (
        run("pairs", pairs_dir, tmp_path / "resized", "--part", "2/3", "--shard-size", "4", "--resize-max", "16") == 0
    )
    assert cli(["merge", str(p0), str(p1), str(tmp_path / "resized.parts"), str(dst), "-q"]) == 1
    assert "foreign part" in (err := _one_line_error(capsys)) and "with other options" in err
    (pairs_dir / "a" / "0000.txt").unlink()  # another input: a part converted after the source changed
    assert run("pairs", pairs_dir, tmp_path / "changed", "--part", "2/3", "--shard-size", "4") == 0
    assert cli(["merge", str(p0), str(p1), str(tmp_path / "changed.parts"), str(dst), "-q"]) == 1
    assert "foreign part" in (err := _one_line_error(capsys)) and "from another input (" in err
    # and a part of another conversion already in DST.parts stops a part before it converts
    assert run("pairs", pairs_dir, tmp_path / "other", "--part", "1/3", "--shard-size", "4") == 1
    assert "part of another conversion" in _one_line_error(capsys)
    # a part whose files changed since its manifest
    with open(p1 / "data-000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    assert cli(["merge", str(dst), "-q"]) == 1
    assert "changed since the part was written" in _one_line_error(capsys)
    assert not dst.exists()


@pytest.mark.parametrize("case", ["skips", "shard-bytes"])
def test_merge_cuts_shards_as_one_process_even_when_parts_do_not_line_up(tmp_path, case):
    """Parts are cut at multiples of --shard-size; a skipped sample or a shard cut early by
    --shard-bytes moves every later shard boundary, and merge still writes what one process
    writes: same sha256 per shard."""
    raw = write_pairs_folder(tmp_path / "raw", 40, 24)
    if case == "skips":
        (raw / "00002.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
        (raw / "00017.txt").write_bytes(b"\xff\xfe")
        opts = ["--shard-size", "5", "--on-error", "skip"]
    else:
        opts = ["--shard-size", "5", "--shard-bytes", "9K"]
    assert run("pairs", raw, tmp_path / "whole", *opts) == 0
    _convert_parts("pairs", raw, tmp_path / "merged", 3, *opts)
    assert cli(["merge", str(tmp_path / "merged"), "-q"]) == 0
    assert _shas(tmp_path / "merged") == _shas(tmp_path / "whole")
    assert _read_all(tmp_path / "merged") == _read_all(tmp_path / "whole")
    assert verify(tmp_path / "merged", progress=False).ok
    if case == "skips":
        assert (tmp_path / "merged.skipped.tsv").read_text() == (tmp_path / "whole.skipped.tsv").read_text()


def test_aligned_parts_are_kept_as_they_are(tmp_path, capsys):
    raw = write_pairs_folder(tmp_path / "raw", 40, 24)
    _convert_parts("pairs", raw, tmp_path / "merged", 3, "--shard-size", "5")
    capsys.readouterr()
    assert cli(["merge", str(tmp_path / "merged"), "--keep-parts"]) == 0
    assert "8 kept as they were, 0 rewritten" in capsys.readouterr().out
    part0 = tmp_path / "merged.parts" / "part-00000-of-00003" / "data-000000.tar"
    assert os.path.samefile(part0, tmp_path / "merged" / "data-000000.tar")  # hard-linked, not copied


def test_more_parts_than_shards_are_cut_evenly_and_merge_the_same(tmp_path, capsys):
    raw = write_pairs_folder(tmp_path / "raw", 12, 24)
    assert run("pairs", raw, tmp_path / "whole", "--shard-size", "5") == 0
    _convert_parts("pairs", raw, tmp_path / "merged", 4, "--shard-size", "5")
    counts = [json.loads(p.read_text())["count"] for p in sorted((tmp_path / "merged.parts").glob("*.json"))]
    assert counts == [3, 3, 3, 3]  # none empty
    capsys.readouterr()
    assert cli(["merge", str(tmp_path / "merged")]) == 0
    assert "3 rewritten" in capsys.readouterr().out
    assert _shas(tmp_path / "merged") == _shas(tmp_path / "whole")


def test_a_finished_part_whose_files_changed_is_converted_again(pairs_dir, tmp_path, capsys):
    assert run("pairs", pairs_dir, tmp_path / "out", "--part", "0/2") == 0
    shard = tmp_path / "out.parts" / "part-00000-of-00002" / "data-000000.tar"
    shard.unlink()
    capsys.readouterr()
    assert run("pairs", pairs_dir, tmp_path / "out", "--part", "0/2") == 0
    out = capsys.readouterr().out
    assert "converting it again" in out and "already converted" not in out and shard.is_file()


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_a_part_killed_mid_write_and_rerun_gives_the_same_result(tmp_path, fmt):
    raw = write_pairs_folder(tmp_path / "raw", 1200, 128)
    suffix = ".lmdb" if fmt == "lmdb" else ""
    opts = ["--shard-size", "100", "--check-decode", "-q"]
    assert run("pairs", raw, tmp_path / f"whole{suffix}", *opts) == 0
    dst = tmp_path / f"out{suffix}"
    cmd = [sys.executable, "-m", "mmloader.converters.pairs", str(raw), str(dst), *opts]
    assert subprocess.run([*cmd, "--part", "0/2"], cwd=ROOT).returncode == 0
    proc = subprocess.Popen([*cmd, "--part", "1/2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / f"out{suffix}.parts"
    name = f"part-00001-of-00002{suffix}"
    partial = _partial_with_data(parts, name, proc.pid, {"tar": 200_000, "lmdb": 500_000}[fmt], proc.poll)
    proc.send_signal(signal.SIGSTOP)
    try:
        assert partial.is_dir() and proc.poll() is None and not (parts / f"{name[:19]}.json").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    out = subprocess.run([*cmd, "--part", "1/2"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and f"removed stale partial {partial}" in out.stdout, out.stdout + out.stderr
    assert not partial.exists()
    assert cli(["merge", str(dst), "-q"]) == 0
    assert _read_all(dst) == _read_all(tmp_path / f"whole{suffix}")
    if fmt == "tar":
        assert _shas(dst) == _shas(tmp_path / "whole")


def _partial_with_data(parent: Path, name: str, pid: int, min_bytes: int, ended=lambda: None) -> Path:
    """Wait until the hidden ``.NAME.partial-PID-*`` holds ``min_bytes`` of written data."""
    deadline = time.time() + 120
    while time.time() < deadline:
        for p in parent.glob(f".{name}.partial-{pid}-*"):
            try:
                size = sum(f.stat().st_size for f in p.iterdir() if f.suffix in (".tar", ".mdb"))
            except FileNotFoundError:
                continue
            if size >= min_bytes:
                return p
        assert ended() is None, "the conversion ended before it was killed"
        time.sleep(0.002)
    raise AssertionError("no partial with data appeared")


def test_resize_max(pairs_dir, tmp_path):
    assert run("pairs", pairs_dir, tmp_path / "small.lmdb", "--resize-max", "32", "--quality", "80") == 0
    r = mmloader.open(tmp_path / "small.lmdb")[0]
    assert max(Image.open(io.BytesIO(r["jpg"])).size) == 32 and max(Image.open(io.BytesIO(r["png"])).size) <= 32


@pytest.fixture
def bad_dir(tmp_path) -> Path:
    root = tmp_path / "bad"
    root.mkdir()
    (root / "good.jpg").write_bytes(jpeg_bytes(1))
    (root / "good.txt").write_text("fine")
    (root / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (root / "corrupt.txt").write_text("x")
    (root / "trunc.jpg").write_bytes(jpeg_bytes(2)[:300])
    (root / "trunc.txt").write_text("x")
    (root / "latin.jpg").write_bytes(jpeg_bytes(3))
    (root / "latin.txt").write_bytes("café".encode("latin-1"))
    (root / "empty.jpg").write_bytes(b"")
    (root / "empty.txt").write_text("x")
    (root / "nocap.jpg").write_bytes(jpeg_bytes(4))
    (root / "dup.jpg").write_bytes(jpeg_bytes(5))
    (root / "dup.JPG").write_bytes(jpeg_bytes(6))
    (root / "dup.txt").write_text("x")
    (root / "dot.ted.jpg").write_bytes(jpeg_bytes(7))
    (root / "dot.ted.txt").write_text("x")
    return root


def test_bad_input_skipped_and_reported(bad_dir, tmp_path):
    dst = tmp_path / "out"
    assert run("pairs", bad_dir, dst, "--require", "jpg,txt", "--check-decode", "--on-error", "skip") == 0
    assert list(mmloader.open(dst).keys) == ["good"]
    report = (tmp_path / "out.skipped.tsv").read_text()
    for key, why in [
        ("corrupt", "bad image"),
        ("trunc", "does not decode"),
        ("latin", "not UTF-8"),
        ("empty", "empty file"),
        ("nocap", "missing required field(s) txt"),
        ("dup", "two files for field 'jpg'"),
        ("dot.ted", "illegal key"),
    ]:
        line = next((l for l in report.splitlines() if l.startswith(key + "\t")), None)
        assert line is not None and why in line, (key, why, report)


def test_header_check_by_default_full_decode_on_request(bad_dir, tmp_path):
    assert run("pairs", bad_dir, tmp_path / "quick", "--require", "jpg,txt", "--on-error", "skip") == 0
    assert "trunc" in set(mmloader.open(tmp_path / "quick").keys)  # header is fine; only decode finds it


def test_on_error_raise_is_the_default_and_leaves_nothing(bad_dir, tmp_path, capsys):
    dst = tmp_path / "out"
    assert run("pairs", bad_dir, dst) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "corrupt.jpg: bad image" in err and "--on-error skip" in err
    assert not dst.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_duplicate_keys_in_manifest(tmp_path):
    man = tmp_path / "m.jsonl"
    man.write_text('{"id": "a", "t": "1"}\n{"id": "b", "t": "2"}\n{"id": "a", "t": "3"}\n')
    assert run("manifest", man, tmp_path / "o", "--key-column", "id", "--text-column", "t", "--on-error", "skip") == 0
    assert list(mmloader.open(tmp_path / "o").keys) == ["a", "b"]
    assert "duplicate key 'a'" in (tmp_path / "o.skipped.tsv").read_text()


def test_manifest_texts_that_are_not_strings(tmp_path, capsys):
    """A list caption was stored as its Python repr, a number as str() with no word (issue 60)."""
    man = tmp_path / "m.jsonl"
    rows = [{"t": "a caption"}, {"t": ["a", "b"]}, {"t": 3}, {"t": True}, {"t": {"en": "x"}}, {"t": float("nan")}]
    man.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run("manifest", man, tmp_path / "o", "--text-column", "t", "--on-error", "skip") == 0
    texts = {s["__key__"]: bytes(s["txt"]).decode() for s in mmloader.open(tmp_path / "o") if "txt" in s}
    assert sorted(texts.values()) == ["3", "a caption", "true"]  # NaN: no text, as null
    skipped = (tmp_path / "o.skipped.tsv").read_text()
    assert "holds a JSON list, not a text" in skipped and "holds a JSON object" in skipped
    assert "1 bool, 1 int value(s) stored as their JSON text" in capsys.readouterr().out


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Notepad's UTF-8 BOM stayed in a pairs caption and in line 0 of a textlines file (issue 60)."""
    src = tmp_path / "raw"
    src.mkdir()
    (src / "x.txt").write_bytes(b"\xef\xbb\xbfa caption")
    (src / "y.txt").write_bytes("\ufeff inside stays".encode()[3:] + b"\xef\xbb\xbf")
    assert run("pairs", src, tmp_path / "p.lmdb", "-q") == 0
    got = {s["__key__"]: bytes(s["txt"]) for s in mmloader.open(tmp_path / "p.lmdb")}
    assert got == {"x": b"a caption", "y": b" inside stays\xef\xbb\xbf"}
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"\xef\xbb\xbffirst\nsecond\n")
    for extra in ([], ["--workers", "2"]):
        out = tmp_path / f"t{len(extra)}.lmdb"
        assert run("textlines", lines, out, "-q", *extra) == 0
        assert [bytes(s["txt"]) for s in mmloader.open(out)] == [b"first", b"second"]
    assert mmloader.zip(t=mmloader.TextReader(str(lines)))[0]["t"] == "first"  # read in place, too


def test_path_errors(pairs_dir, tmp_path, capsys):
    assert run("pairs", tmp_path / "missing", tmp_path / "o") != 0
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    assert run("pairs", pairs_dir, tmp_path / "exists") != 0
    assert "--overwrite" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert run("pairs", pairs_dir, tmp_path / "file" / "sub" / "o") != 0
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.process
def test_python_m_entry_point(pairs_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mmloader.converters.pairs", str(pairs_dir), str(tmp_path / "o"), "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "wrote 12 samples" in out.stdout and "skipped 0" in out.stdout


# -- issue 18: never silently wrong -------------------------------------------------------------
def _pairs3(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (root / f"{i}.jpg").write_bytes(jpeg_bytes(i))
        (root / f"{i}.txt").write_text(f"t{i}")
    return root


def _manifest(tmp_path, kind: str, labels: list, bom: bool = False) -> Path:
    man = tmp_path / f"m.{kind}"
    if kind == "jsonl":
        man.write_text("".join(json.dumps({"t": f"r{i}", "label": l}) + "\n" for i, l in enumerate(labels)))
    else:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["t", "label"])
        w.writerows([f"r{i}", l] for i, l in enumerate(labels))
        man.write_bytes((b"\xef\xbb\xbf" if bom else b"") + buf.getvalue().encode())
    return man


def _labels(path) -> dict[str, int]:
    ds = mmloader.open(path)
    return {ds[i]["txt"].decode(): int(ds[i]["cls"]) for i in range(len(ds))}


# item 1: labels
def test_labels_empty_cell_is_a_missing_label_not_a_class(tmp_path, capsys):
    man = _manifest(tmp_path, "csv", ["cat", "dog", "", "cat"])
    assert (
        run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label", "--on-error", "skip") == 0
    )
    ds = mmloader.open(tmp_path / "o")
    assert ds.metadata["metadata"]["classes"] == ["cat", "dog"]  # no phantom '' class 0
    assert _labels(tmp_path / "o") == {"r0": 0, "r1": 1, "r3": 0}
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "m.csv:4\tmissing label: 'label' is empty" in report
    capsys.readouterr()
    assert run("manifest", man, tmp_path / "o2", "--text-column", "t", "--label-column", "label") == 1
    err = capsys.readouterr().err
    assert "m.csv:4: missing label" in err and "--on-error skip" in err and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_labels_integral_numbers_are_ints_whatever_their_spelling(tmp_path, kind):
    labels = (
        [0.0, 1.0, 2.0, 10.0, "1", 1, "2.0", " 3 ", "1e1"]
        if kind == "jsonl"
        else ["0.0", "1.0", "2.0", "10.0", "1", "1", "2.0", " 3 ", "1e1"]
    )
    man = _manifest(tmp_path, kind, labels)
    assert run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label") == 0
    assert list(_labels(tmp_path / "o").values()) == [0, 1, 2, 10, 1, 1, 2, 3, 10]
    assert "classes" not in mmloader.open(tmp_path / "o").metadata["metadata"]


def test_labels_that_are_neither_integer_nor_name_are_bad_samples(tmp_path):
    man = _manifest(tmp_path, "jsonl", [0, "²", 1.5, 2, True, "1.2.3", None])
    assert (
        run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label", "--on-error", "skip") == 0
    )
    assert _labels(tmp_path / "o") == {"r0": 0, "r3": 2}
    report = (tmp_path / "o.skipped.tsv").read_text()
    for line, why in [
        (2, "'²' looks like a number but is not one"),
        (3, "1.5 is not an integer"),
        (5, "True is a boolean"),
        (6, "'1.2.3' looks like a number"),
        (7, "missing label"),
    ]:
        assert f"m.jsonl:{line}\t" in report and why in report, (line, why, report)


def test_label_names_are_sorted_and_numbers_among_names_are_noted(tmp_path, capsys):
    man = _manifest(tmp_path, "csv", ["dog", "Cat", "cat", "7"])
    assert run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label") == 0
    assert mmloader.open(tmp_path / "o").metadata["metadata"]["classes"] == ["7", "Cat", "cat", "dog"]
    assert _labels(tmp_path / "o") == {"r0": 3, "r1": 1, "r2": 2, "r3": 0}
    assert "mixes class names and numbers" in capsys.readouterr().out


def test_cls_files_in_pairs_one_spelling_per_integer(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, text in [("a", "1.0"), ("b", " 1\n"), ("c", "²"), ("d", "cat")]:
        (raw / f"{name}.cls").write_text(text)
    assert run("pairs", raw, tmp_path / "o", "--on-error", "skip") == 0
    ds = mmloader.open(tmp_path / "o")
    assert [(ds.key(i), ds[i]["cls"]) for i in range(len(ds))] == [("a", b"1"), ("b", b"1")]
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "c.cls\tbad label: '²' looks like a number" in report and "'cat' is not an integer" in report


# item 2: destination inside the source, hidden files, datasets under the source
@pytest.mark.parametrize("suffix", [".lmdb", ""])
def test_destination_inside_the_source_is_not_input(tmp_path, suffix, capsys):
    raw = _pairs3(tmp_path / "raw")
    (raw / ".DS_Store").write_bytes(b"\0\1")
    (raw / ".cache").mkdir()
    (raw / ".cache" / "x.jpg").write_bytes(jpeg_bytes(9))
    dst = raw / f"out{suffix}"
    for attempt in range(2):
        assert run("pairs", raw, dst, "--overwrite") == 0
        ds = mmloader.open(dst)
        assert list(ds.keys) == ["0", "1", "2"] and ds.fields == ["jpg", "txt"]
    out = capsys.readouterr().out
    assert "not input: the destination" in out and "hidden" in out
    # an earlier dataset (and its report) under the source is not input either
    assert run("pairs", raw, tmp_path / "again.lmdb") == 0
    assert list(mmloader.open(tmp_path / "again.lmdb").keys) == ["0", "1", "2"]
    assert "not input: 1 dataset(s) inside the source" in capsys.readouterr().out


def test_destination_inside_imagefolder_root_is_not_a_class(tmp_path):
    root = tmp_path / "train"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        (root / cls / "a.jpg").write_bytes(jpeg_bytes(len(cls)))
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "b.jpg").write_bytes(jpeg_bytes(1))
    for attempt in range(2):
        assert run("imagefolder", root, root / "out.lmdb", "--overwrite") == 0
        ds = mmloader.open(root / "out.lmdb")
        assert ds.metadata["metadata"]["classes"] == ["cat", "dog"] and len(ds) == 2


def test_destination_that_is_or_holds_the_source_is_refused(tmp_path, capsys):
    raw = _pairs3(tmp_path / "raw")
    assert run("pairs", raw, raw, "--overwrite") == 1
    assert run("pairs", raw, tmp_path, "--overwrite") == 1
    assert "--overwrite would delete the source" in capsys.readouterr().err
    assert len(list(raw.iterdir())) == 6


def test_overwrite_replaces_only_a_dataset(tmp_path, capsys):
    raw = _pairs3(tmp_path / "raw")
    precious = tmp_path / "docs"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    assert run("pairs", raw, precious, "--overwrite") == 1
    assert "not an mmloader dataset" in capsys.readouterr().err
    assert (precious / "thesis.txt").read_text() == "years of work"


# item 3: unreadable folders and files
def test_unreadable_class_folder_is_reported(tmp_path, unreadable, capsys):
    root = tmp_path / "train"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(3 if cls == "cat" else 2):
            (root / cls / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    unreadable(root / "dog")
    assert run("imagefolder", root, tmp_path / "o.lmdb") == 1  # default: raise, naming the folder
    err = capsys.readouterr().err
    assert f"{root / 'dog'}: unreadable folder: Permission denied" in err and not (tmp_path / "o.lmdb").exists()
    assert run("imagefolder", root, tmp_path / "o.lmdb", "--on-error", "skip") == 0
    out = capsys.readouterr().out
    assert "skipped 1 (unreadable folder: 1)" in out
    assert f"dog\t{root / 'dog'}\tunreadable folder: Permission denied" in (tmp_path / "o.lmdb.skipped.tsv").read_text()
    ds = mmloader.open(tmp_path / "o.lmdb")
    assert len(ds) == 3 and ds.metadata["metadata"]["classes"] == ["cat", "dog"]  # indices stay torchvision's


def test_unreadable_subfolder_and_file_in_pairs_are_reported(tmp_path, unreadable, capsys):
    raw = _pairs3(tmp_path / "raw")
    _pairs3(raw / "locked")
    unreadable(raw / "locked")
    unreadable(raw / "1.txt")
    assert run("pairs", raw, tmp_path / "o", "--on-error", "skip") == 0
    assert "skipped 2 (unreadable: 1, unreadable folder: 1)" in capsys.readouterr().out
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "locked\t" in report and "1\t" in report and list(mmloader.open(tmp_path / "o").keys) == ["0", "2"]


# item 5: empty input
def test_empty_input_is_an_error_naming_source_and_what_was_looked_for(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "hidden-only").mkdir()
    (tmp_path / "hidden-only" / ".x.jpg").write_bytes(jpeg_bytes(1))
    (tmp_path / "f.jpg").write_bytes(jpeg_bytes(1))
    (tmp_path / "classes" / "cat").mkdir(parents=True)
    (tmp_path / "m.jsonl").write_text("\n\n")
    (tmp_path / "e.txt").write_text("")
    cases = [
        (("pairs", tmp_path / "empty"), "no samples found in", "grouped by stem"),
        (("pairs", tmp_path / "hidden-only"), "no samples found in", "1 hidden"),
        (("pairs", tmp_path / "f.jpg"), "is a file", "grouped by stem"),
        (("imagefolder", tmp_path / "empty"), "no samples found in", "ROOT/CLASS"),
        (("imagefolder", tmp_path / "classes"), "no samples found in", "ROOT/CLASS"),
        (("manifest", tmp_path / "m.jsonl"), "no samples found in", "rows"),
        (("textlines", tmp_path / "e.txt"), "no samples found in", "empty"),
    ]
    for (layout, src), what, looked in cases:
        dst = tmp_path / "out.lmdb"
        assert run(layout, src, dst) == 1, (layout, src)
        err = capsys.readouterr().err
        assert what in err and str(src) in err and looked in err and err.count("\n") == 1, err
        assert not dst.exists()


def test_all_samples_skipped_is_a_failure(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jpg").write_bytes(b"not a jpeg")
    assert run("pairs", raw, tmp_path / "o", "--on-error", "skip") == 1
    assert "all 1 were skipped" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert "a.jpg" in (tmp_path / "o.skipped.tsv").read_text()


# items 6 and 7: manifest rows
def test_bad_jsonl_line_is_a_bad_sample(tmp_path, capsys):
    man = tmp_path / "m.jsonl"
    man.write_bytes(b'{"t": "a"}\n{"t": "b"\n\n[1, 2]\n{"t": "caf\xe9"}\n{"t": "d"}\n')
    assert run("manifest", man, tmp_path / "o", "--text-column", "t", "--on-error", "skip") == 0
    ds = mmloader.open(tmp_path / "o")
    assert [ds[i]["txt"] for i in range(len(ds))] == [b"a", b"d"]
    report = (tmp_path / "o.skipped.tsv").read_text()
    for where, why in [
        ("m.jsonl:2", "not valid JSON"),
        ("m.jsonl:4", "must be a JSON object"),
        ("m.jsonl:5", "not UTF-8"),
    ]:
        assert where in report and why in report
    assert "skipped 3" in capsys.readouterr().out
    assert run("manifest", man, tmp_path / "o2", "--text-column", "t") == 1
    assert "m.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_csv_with_a_byte_order_mark_and_missing_column_named_with_repr(tmp_path, capsys):
    man = _manifest(tmp_path, "csv", ["cat", "dog"], bom=True)
    assert run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label") == 0
    assert _labels(tmp_path / "o") == {"r0": 0, "r1": 1}
    assert run("manifest", man, tmp_path / "o2", "--text-column", "caption") == 2
    assert "--text-column 'caption' is not a column of" in capsys.readouterr().err
    weird = tmp_path / "w.csv"
    weird.write_bytes(b"\xef\xbb\xbffile ,caption\nx,y\n")
    assert run("manifest", weird, tmp_path / "o3", "--image-column", "file") == 2
    assert "(columns: 'file ', 'caption')" in capsys.readouterr().err
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"t": "a", "label": 2}\n{"t": "b", "label": 3}\n')
    assert run("manifest", jsonl, tmp_path / "o4", "--text-column", "t", "--label-column", "label") == 0
    assert _labels(tmp_path / "o4") == {"a": 2, "b": 3}


def test_csv_row_with_wrong_cell_count_is_a_bad_sample(tmp_path):
    man = tmp_path / "m.csv"
    man.write_text("t,label\na,1\nb,2,extra\nc\nd,3\n")
    assert (
        run("manifest", man, tmp_path / "o", "--text-column", "t", "--label-column", "label", "--on-error", "skip") == 0
    )
    assert _labels(tmp_path / "o") == {"a": 1, "d": 3}
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "m.csv:3\t3 cells, the header has 2" in report and "m.csv:4\t1 cells" in report


# item 8: bounded reads
def _limited_run(args, tmp_path, limit_bytes=1 << 30) -> subprocess.CompletedProcess:
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "mmloader.converters.pairs", *map(str, args), "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=cap,
        timeout=120,
    )


@pytest.mark.process
def test_huge_file_refused_before_it_is_read(tmp_path):
    raw = _pairs3(tmp_path / "raw")
    with open(raw / "big.jpg", "wb") as f:  # a real JPEG header, then 2 GB of (sparse) zeros
        f.write(jpeg_bytes(1)[:600])
        f.truncate(2 << 30)
    with open(raw / "soi.jpg", "wb") as f:  # only a JPEG signature, then zeros
        f.write(b"\xff\xd8\xff\xe0")
        f.truncate(2 << 30)
    start = time.perf_counter()
    out = _limited_run([raw, tmp_path / "o", "--on-error", "skip"], tmp_path)  # 1 GiB address space
    assert out.returncode == 0, out.stderr
    assert time.perf_counter() - start < 30
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "big\t" in report and "over --max-file-bytes: 2,147,483,648 bytes" in report
    # with the limit raised, a file whose header is bad is still rejected from its first 64 KiB
    (raw / "big.jpg").unlink()
    out = _limited_run([raw, tmp_path / "o2", "--on-error", "skip", "--max-file-bytes", "4G"], tmp_path)
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "o2.skipped.tsv").read_text()
    assert "soi.jpg\tbad image: JPEG without a frame header" in report


def test_header_beyond_the_first_64k_still_found(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    im = Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, "JPEG", icc_profile=bytes(150_000))  # three APP2 segments before the frame header
    from mmloader.media.imageinfo import probe

    assert buf.getvalue().index(b"\xff\xc0") > 128 << 10 and probe(buf.getvalue()).width == 8
    with pytest.raises(mmloader.DecodeError):
        probe(buf.getvalue()[: 64 << 10])
    (raw / "icc.jpg").write_bytes(buf.getvalue())
    (raw / "small.txt").write_text("x" * 5000)
    (raw / "ok.txt").write_text("fits")
    assert run("pairs", raw, tmp_path / "o", "--on-error", "skip", "--max-file-bytes", "4K") == 0
    report = (tmp_path / "o.skipped.tsv").read_text()
    assert "icc.jpg\tover --max-file-bytes" in report and "small.txt\tover --max-file-bytes" in report
    assert run("pairs", raw, tmp_path / "o2") == 0
    assert mmloader.open(tmp_path / "o2").get("icc")["jpg"] == buf.getvalue()


# item 9 (+ items 4): stale partials, concurrent writers, publish-time check
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _fake_partial(dst: Path, pid: int, host: str | None = None) -> Path:
    """A partial as a conversion killed on this host leaves it: data and the writer's record."""
    import socket

    p = dst.parent / f".{dst.name}.partial-{pid}-abcdef"
    p.mkdir()
    (p / "data-000000.tar").write_bytes(b"\0" * 100_000)
    record = {"host": host or socket.gethostname(), "pid": pid, "boot_id": None, "start_time": None}
    (p / ".mmloader-writer.json").write_text(json.dumps(record))
    return p


@pytest.mark.process
def test_stale_partial_of_a_dead_writer_is_removed_and_reported(tmp_path, capsys):
    raw = _pairs3(tmp_path / "raw")
    dst = tmp_path / "out"
    dead = _fake_partial(dst, _dead_pid())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _fake_partial(dst, sleeper.pid)
        remote = _fake_partial(dst, 1, host="another-host")
        other = _fake_partial(tmp_path / "other", _dead_pid())  # another destination's: not ours
        assert run("pairs", raw, dst) == 0
        out = capsys.readouterr().out
        assert not dead.exists() and f"removed stale partial {dead} (0.1 MB)" in out
        assert live.exists() and f"left alone: {live}" in out and "still running" in out
        assert remote.exists() and "another host" in out
        assert other.exists()
        assert len(mmloader.open(dst)) == 3
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_second_conversion_to_a_busy_destination_fails_clearly(tmp_path, capsys):
    raw = _pairs3(tmp_path / "raw")
    dst = tmp_path / "out.lmdb"
    first = mmloader.writer_for(dst)  # a conversion in progress (holds the destination)
    first.write({"__key__": "x", "txt": "first"})
    for extra in ([], ["--overwrite"]):
        assert run("pairs", raw, dst, *extra) == 1
        assert "is being written by another writer" in capsys.readouterr().err
    first.close()
    assert list(mmloader.open(dst).keys) == ["x"]
    assert run("pairs", raw, dst) == 1 and "already exists" in capsys.readouterr().err


def test_publish_never_replaces_a_dataset_that_appeared_meanwhile(tmp_path):
    dst = tmp_path / "out"
    w = mmloader.writer_for(dst, "tar")
    w.write({"__key__": "late", "txt": "mine"})
    with mmloader.writer_for(tmp_path / "other", "tar") as other:  # someone else's dataset...
        other.write({"__key__": "theirs", "txt": "theirs"})
    os.rename(tmp_path / "other", dst)  # ...appears under our name while we write
    with pytest.raises(FileExistsError, match="appeared while"):
        w.close()
    assert list(mmloader.open(dst).keys) == ["theirs"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no partial, no lock left


@pytest.mark.process
def test_two_concurrent_conversion_processes(tmp_path):
    raw = write_pairs_folder(tmp_path / "raw", 600, 64)
    dst = tmp_path / "out"
    cmd = [sys.executable, "-m", "mmloader.converters.pairs", str(raw), str(dst), "-q", "--shard-size", "50"]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".out.partial-*")) and time.time() < deadline:
        time.sleep(0.005)
    first.send_signal(signal.SIGSTOP)  # frozen mid-write, whatever the machine's speed
    try:
        assert list(tmp_path.glob(".out.partial-*")) and not dst.exists()
        second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert second.returncode == 1 and "being written by another writer" in second.stderr
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(60) == 0
    assert len(mmloader.open(dst)) == 600 and verify(dst, progress=False).ok


# item 11: option values checked where they are given
@pytest.mark.parametrize(
    "option,message",
    [
        (["--resize-max", "-5"], "argument --resize-max: -5: must be 1 or more"),
        (["--quality", "0"], "argument --quality: 0: must be from 1 to 100"),
        (["--workers", "0"], "argument --workers: 0: must be 1 or more"),
        (["--shuffle-seed", "-1"], "argument --shuffle-seed: -1: must be 0 or more"),
        (["--shard-size", "-1"], "argument --shard-size: -1: must be 1 or more"),
        (["--shard-bytes", "0"], "argument --shard-bytes: '0': must be more than 0 bytes"),
        (["--shard-bytes", "lots"], "'lots' is not a size"),
        (["--max-file-bytes", "-1K"], "argument --max-file-bytes"),
        (["--part", "3/3"], "need 0 <= I < N"),
        (["--on-error", "fail"], "invalid choice: 'fail'"),
        (["--require", "jpgg"], "--require jpgg: no sample has this field (fields found: jpg, txt)"),
    ],
)
def test_bad_option_values_are_usage_errors_naming_the_option(tmp_path, capsys, option, message):
    raw = _pairs3(tmp_path / "raw")
    assert run("pairs", raw, tmp_path / "o", *option) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_sizes_parse_like_coreutils():
    from mmloader.converters.common import parse_size

    assert [parse_size(s) for s in ("1G", "512M", "64K", "1e9", "1000000", "1GiB", "1GB", "1.5K")] == [
        1 << 30,
        512 << 20,
        64 << 10,
        10**9,
        10**6,
        1 << 30,
        10**9,
        1536,
    ]
    for bad in ("", "G", "1Q", "0.5", "1e-3", "-1"):
        with pytest.raises(ValueError):
            parse_size(bad)


# issue 13 defect 13: one field per image format, whatever the file's spelling
def test_image_spellings_fold_to_one_field(tmp_path):
    root = tmp_path / "train"
    (root / "cat").mkdir(parents=True)
    for i, ext in enumerate(["jpg", "jpeg", "JPEG", "JPG"]):
        (root / "cat" / f"{i}.{ext}").write_bytes(jpeg_bytes(i))
    (root / "cat" / "4.PNG").write_bytes(_png(4))
    assert run("imagefolder", root, tmp_path / "o.lmdb") == 0
    ds = mmloader.open(tmp_path / "o.lmdb")
    assert ds.fields == ["cls", "jpg", "png"] and ds.metadata["field_counts"]["jpg"] == 4
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jpeg").write_bytes(jpeg_bytes(1))
    (raw / "b.JPG").write_bytes(jpeg_bytes(2))
    (raw / "c.jpg").write_bytes(jpeg_bytes(3))
    (raw / "c.JPEG").write_bytes(jpeg_bytes(4))
    assert run("pairs", raw, tmp_path / "p", "--on-error", "skip") == 0
    ds = mmloader.open(tmp_path / "p")
    assert ds.fields == ["jpg"] and list(ds.keys) == ["a", "b"]
    assert "two files for field 'jpg'" in (tmp_path / "p.skipped.tsv").read_text()
    man = tmp_path / "m.jsonl"
    man.write_text(json.dumps({"f": "raw/a.jpeg"}) + "\n" + json.dumps({"f": "raw/b.JPG"}) + "\n")
    assert run("manifest", man, tmp_path / "m", "--image-column", "f") == 0
    assert mmloader.open(tmp_path / "m").fields == ["jpg"]


@pytest.mark.process
def test_converters_import_no_torch():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mmloader.converters.pairs", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "examples:" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "mmloader.converters.common" in imported and "lmdb" in imported


# -- review findings ------------------------------------------------------------------------------
def _half_jpeg() -> bytes:
    whole = jpeg_bytes(9, size=(256, 256))
    return whole[: len(whole) // 2] + b"\xff\xd9"  # second half gone, still ends with EOI


@pytest.mark.parametrize("option", [["--check-decode"], ["--resize-max", "16"]])
def test_a_jpeg_missing_its_second_half_is_refused_when_decoding(tmp_path, option):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jpg").write_bytes(_half_jpeg())
    (raw / "a.txt").write_text("half")
    (raw / "b.jpg").write_bytes(jpeg_bytes(2, size=(64, 64)))
    (raw / "b.txt").write_text("whole")
    assert run("pairs", raw, tmp_path / "o.lmdb", "--on-error", "skip", *option) == 0
    assert [s["__key__"] for s in mmloader.open(tmp_path / "o.lmdb")] == ["b"]
    assert "premature end" in (tmp_path / "o.lmdb.skipped.tsv").read_text()


def _part(path, fmt, prefix):
    from conftest import make_samples

    with mmloader.writer_for(path, fmt) as w:
        for s in make_samples(6, prefix=prefix):
            w.write(s)
    return path


def test_merge_follows_the_destination_suffix(tmp_path):
    tar_parts = [_part(tmp_path / f"t{i}", "tar", f"p{i}") for i in range(2)]
    assert cli(["merge", *map(str, tar_parts), str(tmp_path / "m.lmdb"), "-q"]) == 0
    assert mmloader.open(tmp_path / "m.lmdb").format == "lmdb" and len(mmloader.open(tmp_path / "m.lmdb")) == 12
    lmdb_parts = [_part(tmp_path / f"l{i}.lmdb", "lmdb", f"q{i}") for i in range(2)]
    assert cli(["merge", *map(str, lmdb_parts), str(tmp_path / "mtar"), "-q"]) == 0
    merged = mmloader.open(tmp_path / "mtar")
    assert merged.format == "tar" and merged[7]["jpg"] == mmloader.open(lmdb_parts[1])[1]["jpg"]


def test_an_empty_manifest_is_a_failure_naming_it(tmp_path, capsys):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    for name in ("empty.csv", "empty.jsonl"):
        assert run("manifest", tmp_path / name, tmp_path / f"{name}.lmdb", "--image-column", "file") == 1
        assert f"no samples found in {tmp_path / name}: it holds no rows" in capsys.readouterr().err


def test_broken_symlinks_among_class_folders_are_reported(tmp_path, capsys):
    root = tmp_path / "IF"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(jpeg_bytes(1))
    os.symlink("loop", root / "loop")
    os.symlink("nowhere", root / "gone")
    assert run("imagefolder", root, tmp_path / "o.lmdb") == 1  # raise (default): the first one named
    assert "not a class folder" in capsys.readouterr().err
    assert run("imagefolder", root, tmp_path / "o.lmdb", "--on-error", "skip") == 0
    report = (tmp_path / "o.lmdb.skipped.tsv").read_text()
    assert "gone" in report and "loop" in report and "cannot be followed" in report
    assert mmloader.open(tmp_path / "o.lmdb").metadata["metadata"]["classes"] == ["cat"]


def test_require_needs_a_field_name(tmp_path, pairs_dir):
    assert run("pairs", pairs_dir, tmp_path / "o.lmdb", "--require", ",") == 2


def test_labels_are_read_exactly():
    from mmloader.converters.common import label_kind

    for near in ("2.9999999999999999", "1e-400"):  # floats would round these to the integers 3 and 0
        kind, value = label_kind(near)
        assert kind == "number" and not isinstance(value, int)
    assert label_kind("3.000") == ("number", 3) and label_kind("1e1") == ("number", 10)


# -- what a dataset records about its input (issue #34) ---------------------------------------------
def _every_byte(path: Path) -> bytes:
    """Every file of a dataset (an LMDB environment or a shard directory), concatenated."""
    return b"".join(p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file())


def _raw_inputs(where: Path) -> dict[str, list[str]]:
    """One small input per layout under ``where`` (a folder name a stranger must not learn)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = write_pairs_folder(where / "pairs", 6, 16)
    tree = where / "tree"
    for i, jpg in enumerate(sorted(pairs.glob("*.jpg"))):
        (tree / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        (tree / f"class{i % 2}" / jpg.name).write_bytes(jpg.read_bytes())
    (where / "rows.jsonl").write_text(
        "".join(
            json.dumps({"file": f"pairs/{p.name}", "caption": f"c{i}"}) + "\n"
            for i, p in enumerate(sorted(pairs.glob("*.jpg")))
        )
    )
    (where / "corpus.txt").write_text("".join(f"line number {i}\n" for i in range(20)))
    train_tokenizer([f"line number {i}" for i in range(20)], where / "tokenizer.json")
    pq.write_table(pa.table({"jpg": [p.read_bytes() for p in sorted(pairs.glob("*.jpg"))]}), where / "t.parquet")
    return {
        "pairs": [str(pairs)],
        "imagefolder": [str(tree)],
        "manifest": [str(where / "rows.jsonl"), "--image-column", "file", "--text-column", "caption"],
        "textlines": [str(where / "corpus.txt"), "--tokenizer", str(where / "tokenizer.json")],
        "parquet": [str(where / "t.parquet"), "--image-column", "jpg"],
    }


@pytest.mark.parametrize("suffix", ["", ".lmdb"])
def test_no_converted_dataset_holds_a_local_path_and_record_source_keeps_it(tmp_path, suffix):
    """Every layout's metadata said ``"source": "/abs/path/of/the/input"``, so a published dataset
    told strangers where it was made. Now: the layout, what was found, a fingerprint and the options;
    the path only with --record-source. No byte of the output names the input's folder."""
    secret_home = tmp_path / "home-of-alice" / "private-raw"
    for layout, args in _raw_inputs(secret_home).items():
        out = tmp_path / f"{layout}{suffix}"
        assert run(layout, args[0], out, *args[1:]) == 0, layout
        assert b"home-of-alice" not in _every_byte(out) and str(tmp_path).encode() not in _every_byte(out), layout
        meta = mmloader.open(out).metadata["metadata"]
        assert meta["layout"] == layout and "source" not in meta, meta
        assert len(meta["input"]["fingerprint"]) == 64 and meta["input"]["files"] >= 1, meta
        assert meta["options"]["format"] == ("lmdb" if suffix else "tar") and "src" not in meta["options"]
        assert not any("home-of-alice" in json.dumps(v) for v in meta.values())
        kept = tmp_path / f"{layout}-kept{suffix}"
        assert run(layout, args[0], kept, *args[1:], "--record-source") == 0, layout
        recorded = mmloader.open(kept).metadata["metadata"]
        assert recorded["source"] in (str(Path(args[0]).resolve()), [str(Path(args[0]).resolve())]), recorded
        assert {k: v for k, v in recorded.items() if k not in ("source", "tokenizer")} == {
            k: v for k, v in meta.items() if k != "tokenizer"
        }
    tokenizer = mmloader.open(tmp_path / f"textlines{suffix}").metadata["metadata"]["tokenizer"]
    assert "file" not in tokenizer and len(tokenizer["fingerprint"]) == 64 and tokenizer["vocab_size"] > 0
    kept = mmloader.open(tmp_path / f"textlines-kept{suffix}").metadata["metadata"]["tokenizer"]
    assert kept["file"] == str((secret_home / "tokenizer.json").resolve())


def test_the_same_input_in_another_folder_records_the_same_metadata(tmp_path, pairs_dir):
    import shutil

    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(pairs_dir, copy)
    assert run("pairs", pairs_dir, tmp_path / "a", "--shard-size", "5") == 0
    assert run("pairs", copy, tmp_path / "b", "--shard-size", "5", "--workers", "3") == 0
    a, b = (mmloader.open(tmp_path / n).metadata["metadata"] for n in ("a", "b"))
    assert a == b and a["input"] == {"samples": 12, "files": 40, "fingerprint": a["input"]["fingerprint"]}
    assert a["options"]["shard_size"] == 5 and "workers" not in a["options"]
    (copy / "a" / "0000.txt").unlink()  # another input: another fingerprint
    assert run("pairs", copy, tmp_path / "c") == 0
    assert mmloader.open(tmp_path / "c").metadata["metadata"]["input"]["fingerprint"] != a["input"]["fingerprint"]


def test_inspect_shows_the_source_of_datasets_made_before_unchanged(tmp_path, capsys):
    """Datasets converted by earlier versions hold ``source``: inspect reads and shows them as before."""
    old = {"layout": "pairs", "source": "/home/alice/raw-clips"}
    with mmloader.writer_for(tmp_path / "old.lmdb", metadata=old) as w:
        w.write({"__key__": "0001", "txt": "a caption"})
    assert cli(["inspect", str(tmp_path / "old.lmdb"), "-n", "0"]) == 0
    assert 'metadata: {"layout": "pairs", "source": "/home/alice/raw-clips"}' in capsys.readouterr().out


def test_imagefolder_reads_each_file_once_through_links(tmp_path, capsys):
    """`root/cat/deep/loop -> root/cat` gave 78 duplicates labelled cat (issue 60)."""
    root = tmp_path / "root"
    (root / "cat" / "deep").mkdir(parents=True)
    (root / "dog").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for i in range(2):
        (root / "cat" / f"c{i}.jpg").write_bytes(jpeg_bytes(i))
        (root / "dog" / f"d{i}.jpg").write_bytes(jpeg_bytes(i + 5))
    (outside / "e.jpg").write_bytes(jpeg_bytes(9))
    os.symlink(root / "cat", root / "cat" / "deep" / "loop")
    os.symlink(root / "dog", root / "cat" / "dogs")  # another class's folder: read there, as dog
    os.symlink(outside, root / "cat" / "more")  # outside the source: followed, as torchvision
    assert run("imagefolder", root, tmp_path / "o.lmdb") == 0
    got = sorted((s["__key__"], int(bytes(s["cls"]))) for s in mmloader.open(tmp_path / "o.lmdb"))
    assert got == [("cat/c0", 0), ("cat/c1", 0), ("cat/more/e", 0), ("dog/d0", 1), ("dog/d1", 1)]
    out = capsys.readouterr().out
    assert f"1 symbolic link(s) in a loop, e.g. {root / 'cat' / 'deep' / 'loop'} -> {root / 'cat'}" in out


def test_imagefolder_class_folders_that_link_to_others_and_links_into_hidden_folders(tmp_path):
    """A class folder linking to a sibling took the sibling's images; a link into a hidden folder
    lost its files (a reviewer's attack)."""
    root = tmp_path / "src"
    for name, seed in (("dog", 1), ("zebra", 2), (".hid", 3), ("lion", 4)):
        (root / name).mkdir(parents=True)
        (root / name / f"{name.strip('.')[0]}1.jpg").write_bytes(jpeg_bytes(seed))
    os.symlink("dog", root / "cat")  # sorts before dog
    os.symlink("zebra", root / "ape")
    os.symlink("../.hid", root / "lion" / "tohid")
    assert run("imagefolder", root, tmp_path / "o.lmdb") == 0
    got = sorted((s["__key__"], int(bytes(s["cls"]))) for s in mmloader.open(tmp_path / "o.lmdb"))
    assert got == [
        ("dog/d1", 2),
        ("lion/l1", 3),
        ("lion/tohid/h1", 3),
        ("zebra/z1", 4),
    ]  # classes: ape cat dog lion zebra


def test_a_byte_order_mark_alone_is_an_empty_file(tmp_path, capsys):
    src = tmp_path / "raw"
    src.mkdir()
    (src / "x.txt").write_bytes(b"\xef\xbb\xbf")
    (src / "y.txt").write_bytes(b"text")
    assert run("pairs", src, tmp_path / "p.lmdb", "--on-error", "skip") == 0
    assert "empty file (a byte-order mark alone)" in (tmp_path / "p.lmdb.skipped.tsv").read_text()
    lines = tmp_path / "bom.txt"
    lines.write_bytes(b"\xef\xbb\xbf")
    capsys.readouterr()
    assert run("textlines", lines, tmp_path / "t.lmdb") == 1
    assert "the file is empty" in capsys.readouterr().err
