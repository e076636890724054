"""Converters on small raw folders made by the tests (real JPEG/PNG files)."""
from __future__ import annotations

import csv
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
from PIL import Image

import mmloader
from mmloader.cli import main as cli
from mmloader.verify import verify

from conftest import jpeg_bytes, write_pairs_folder

ROOT = Path(__file__).resolve().parents[1]


def run(*argv) -> int:
    try:
        return cli(["convert", *map(str, argv), "-q"])
    except SystemExit as e:  # argparse / early checks exit with a message
        return e.code if isinstance(e.code, int) else 1


def _png(seed, size=(20, 16)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 4), dtype=np.uint8)).save(buf, "PNG")
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
            (root / cls / f"{cls}{i}.JPG" if i == 0 else root / cls / f"{cls}{i}.jpg").write_bytes(jpeg_bytes(n * 10 + i))
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
        rows.append({"file": f"imgs/{i}.jpg", "caption": f"cap {i}", "label": ["dog", "cat"][i % 2],
                     "width": str(48), "source": "web"})
    man = tmp_path / f"m.{kind}"
    if kind == "jsonl":
        man.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        with open(man, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    assert run("manifest", man, tmp_path / "out", "--image-column", "file", "--text-column", "caption",
               "--label-column", "label", "--keep-columns", "width") == 0
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
    import converters.textlines as tl
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
    parts = []
    for i in range(3):
        assert run("textlines", src, tmp_path / f"p{i}", "--part", f"{i}/3", "--on-error", "skip") == 0
        parts.append(tmp_path / f"p{i}")
    assert cli(["merge", *map(str, parts), str(tmp_path / "merged"), "-q"]) == 0
    merged = mmloader.open(tmp_path / "merged")
    whole = mmloader.open(tmp_path / "all.lmdb")
    assert [merged[i]["__key__"] for i in range(len(merged))] == [whole.key(i) for i in range(len(whole))]


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_parts_are_disjoint_and_merge_equals_whole(pairs_dir, tmp_path, fmt):
    suffix = ".lmdb" if fmt == "lmdb" else ""
    assert run("pairs", pairs_dir, tmp_path / f"whole{suffix}", "--shuffle-seed", "3", "--shard-size", "4") == 0
    parts = []
    for i in range(3):
        assert run("pairs", pairs_dir, tmp_path / f"part{i}{suffix}", "--shuffle-seed", "3", "--part", f"{i}/3",
                   "--shard-size", "4") == 0
        parts.append(tmp_path / f"part{i}{suffix}")
    keys = [set(mmloader.open(p).keys) for p in parts]
    assert not (keys[0] & keys[1]) and not (keys[1] & keys[2]) and not (keys[0] & keys[2])
    assert cli(["merge", *map(str, parts), str(tmp_path / f"merged{suffix}"), "-q"]) == 0
    whole, merged = _read_all(tmp_path / f"whole{suffix}"), _read_all(tmp_path / f"merged{suffix}")
    assert [r["__key__"] for r in whole] != sorted(r["__key__"] for r in whole)  # really shuffled
    assert merged == whole
    assert verify(tmp_path / f"merged{suffix}", progress=False).ok


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
    for key, why in [("corrupt", "bad image"), ("trunc", "does not decode"), ("latin", "not UTF-8"),
                     ("empty", "empty file"), ("nocap", "missing required field(s) txt"),
                     ("dup", "two files for field 'jpg'"), ("dot.ted", "illegal key")]:
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


def test_path_errors(pairs_dir, tmp_path, capsys):
    assert run("pairs", tmp_path / "missing", tmp_path / "o") != 0
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    assert run("pairs", pairs_dir, tmp_path / "exists") != 0
    assert "--overwrite" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert run("pairs", pairs_dir, tmp_path / "file" / "sub" / "o") != 0
    assert "cannot write" in capsys.readouterr().err


def test_sigkill_mid_conversion_leaves_nothing(tmp_path):
    raw = write_pairs_folder(tmp_path / "raw", 3000, 256)
    dst = tmp_path / "out.lmdb"
    proc = subprocess.Popen([sys.executable, "-m", "converters.pairs", str(raw), str(dst), "--check-decode"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and not any(p.name.startswith(".out.lmdb.partial") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dst.exists()
    assert subprocess.run([sys.executable, "-m", "converters.pairs", str(raw), str(dst), "-q"], cwd=ROOT).returncode == 0
    assert len(mmloader.open(dst)) == 3000


def test_python_m_entry_point(pairs_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "converters.pairs", str(pairs_dir), str(tmp_path / "o"), "-q"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "wrote 12 samples" in out.stdout and "skipped 0" in out.stdout
