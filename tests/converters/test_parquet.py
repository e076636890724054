"""convert parquet on real Parquet / Arrow IPC files written by pyarrow and by Hugging Face
``datasets``, and the img2dataset layout (tar shards + parquet) through ``mmloader index``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, jpeg_bytes
from PIL import Image

import mmloader
from mmloader.cli import main as cli
from mmloader.cli.verify import verify

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def run(*argv) -> int:
    try:
        return cli(["convert", "parquet", *map(str, argv), "-q"])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _rows(n: int, start: int = 0) -> dict:
    return {
        "image": [jpeg_bytes(i) if i % 5 else _png(i) for i in range(start, start + n)],
        "caption": [f"caption {i} é" for i in range(start, start + n)],
        "label": [i % 3 for i in range(start, start + n)],
        "width": [48 + i for i in range(start, start + n)],
        "url": [f"http://example.com/{i}.jpg" for i in range(start, start + n)],
    }


def _read_all(path):
    ds = mmloader.open(path)
    return [ds[i] for i in range(len(ds))]


def _shas(path) -> list[str]:
    return [s["sha256"] for s in json.loads((Path(path) / "index.json").read_text())["shards"]]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_raw_bytes_images_text_labels_and_other_columns_as_json(tmp_path, fmt):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table(_rows(30)), src, row_group_size=7)  # 5 row groups
    dst = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out")
    assert (
        run(
            src,
            dst,
            "--image-column",
            "image",
            "--text-column",
            "caption",
            "--label-column",
            "label",
            "--shard-size",
            "8",
        )
        == 0
    )
    recs = _read_all(dst)
    assert [r["__key__"] for r in recs] == [f"{i:09d}" for i in range(30)]
    for i, r in enumerate(recs):
        assert r.get("jpg" if i % 5 else "png") == (jpeg_bytes(i) if i % 5 else _png(i))  # bytes untouched
        assert r["txt"].decode() == f"caption {i} é" and int(r["cls"]) == i % 3
        assert json.loads(r["json"]) == {"width": 48 + i, "url": f"http://example.com/{i}.jpg"}
    assert verify(dst, decode=True, progress=False).ok
    assert mmloader.open(dst).metadata["metadata"]["columns"] == {"image": "image", "text": "caption", "label": "label"}


def test_hf_image_structs_bytes_or_path_and_class_names(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "x.jpg").write_bytes(jpeg_bytes(99))
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array(
        [
            {"bytes": jpeg_bytes(0), "path": None},
            {"bytes": None, "path": "img/x.jpg"},
            {"bytes": _png(2), "path": "ignored.png"},
            None,
        ],
        type=struct,
    )
    table = pa.table(
        {
            "image": images,
            "text": ["a", "b", "c", "d"],
            "label": ["dog", "cat", "dog", "cat"],
            "id": ["k0", "k1", "k2", "k3"],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    assert (
        run(
            tmp_path / "t.parquet",
            tmp_path / "out",
            "--image-column",
            "image",
            "--text-column",
            "text",
            "--label-column",
            "label",
            "--key-column",
            "id",
        )
        == 0
    )
    recs = _read_all(tmp_path / "out")
    assert [r["__key__"] for r in recs] == ["k0", "k1", "k2", "k3"]
    assert recs[0]["jpg"] == jpeg_bytes(0) and recs[1]["jpg"] == jpeg_bytes(99) and recs[2]["png"] == _png(2)
    assert "jpg" not in recs[3] and "png" not in recs[3]  # a null image: no image field (--require jpg refuses it)
    assert mmloader.open(tmp_path / "out").metadata["metadata"]["classes"] == ["cat", "dog"]
    assert [int(r["cls"]) for r in recs] == [1, 0, 1, 0]
    assert (
        run(
            tmp_path / "t.parquet",
            tmp_path / "req",
            "--image-column",
            "image",
            "--require",
            "jpg",
            "--on-error",
            "skip",
        )
        == 0
    )
    report = (tmp_path / "req.skipped.tsv").read_text()
    assert f"{tmp_path / 't.parquet'}:row 3\tmissing required field(s) jpg" in report


@pytest.fixture(scope="module")
def hf_dataset():
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
        }
    )
    imgs = [Image.open(io.BytesIO(jpeg_bytes(i))) for i in range(12)]
    return datasets.Dataset.from_dict(
        {"image": imgs, "text": [f"t{i}" for i in range(12)], "label": [i % 3 for i in range(12)]}, features=features
    )


def test_hf_datasets_save_to_disk_and_to_parquet_both_convert(tmp_path, hf_dataset):
    hf_dataset.save_to_disk(str(tmp_path / "saved"), num_shards=2)  # Arrow IPC streams + state.json
    hf_dataset.to_parquet(str(tmp_path / "exported.parquet"))
    assert sorted(p.name for p in (tmp_path / "saved").glob("*.arrow")) == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]
    opts = ["--image-column", "image", "--text-column", "text", "--label-column", "label"]
    assert run(tmp_path / "saved", tmp_path / "a.lmdb", *opts) == 0
    assert run(tmp_path / "exported.parquet", tmp_path / "b.lmdb", *opts) == 0
    a, b = _read_all(tmp_path / "a.lmdb"), _read_all(tmp_path / "b.lmdb")
    assert a == b and len(a) == 12
    for i, r in enumerate(a):  # the images datasets stored, the ClassLabel's integers and names
        want = hf_dataset[i]["image"]
        assert np.array_equal(
            np.asarray(Image.open(io.BytesIO(r["jpg"])).convert("RGB")), np.asarray(want.convert("RGB"))
        )
        assert r["txt"] == f"t{i}".encode() and int(r["cls"]) == i % 3
    assert mmloader.open(tmp_path / "a.lmdb").metadata["metadata"]["classes"] == ["cat", "dog", "bird"]
    dd = pytest.importorskip("datasets").DatasetDict({"train": hf_dataset, "test": hf_dataset})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert run(tmp_path / "dd", tmp_path / "c", *opts) == 2  # which split? a usage error naming them
    assert run(tmp_path / "dd" / "train", tmp_path / "c", *opts) == 0


def test_arrow_ipc_file_and_stream_formats(tmp_path):
    table = pa.table(_rows(20))
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=6):
            w.write_batch(batch)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=6):
            w.write_batch(batch)
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=6)
    opts = ["--image-column", "image", "--text-column", "caption", "--shard-size", "4"]
    outs = []
    for name in ("f.arrow", "s.arrow", "p.parquet"):
        assert run(tmp_path / name, tmp_path / f"out-{name}", *opts) == 0
        outs.append(tmp_path / f"out-{name}")
    assert _shas(outs[0]) == _shas(outs[1]) == _shas(outs[2])  # the same rows give the same shards
    for i in range(3):  # parts cut inside record batches / row groups: the same shards again
        assert run(tmp_path / "s.arrow", tmp_path / "parts", *opts, "--part", f"{i}/3") == 0
    assert cli(["merge", str(tmp_path / "parts"), "-q"]) == 0
    assert _shas(tmp_path / "parts") == _shas(outs[0])


def _corrupt_image_rows(tmp_path) -> Path:
    rows = _rows(12)
    rows["image"][3] = b"\xff\xd8\xff\xe0 not a jpeg at all"
    rows["image"][7] = b""
    pq.write_table(pa.table(rows), tmp_path / "a.parquet", row_group_size=5)
    return tmp_path / "a.parquet"


def test_corrupt_row_skipped_with_file_and_row_or_raised_naming_row_group_and_column(tmp_path, capsys):
    src = _corrupt_image_rows(tmp_path)
    assert run(src, tmp_path / "out", "--image-column", "image", "--on-error", "skip") == 0
    assert len(mmloader.open(tmp_path / "out")) == 10
    lines = (tmp_path / "out.skipped.tsv").read_text().splitlines()
    assert lines[0] == "key\tfile\treason"
    assert lines[1].startswith(f"000000003\t{src}:row 3\tcolumn 'image' (row group 0): bad image")
    assert lines[2].startswith(f"000000007\t{src}:row 7\tcolumn 'image' (row group 1): empty value")
    capsys.readouterr()
    assert run(src, tmp_path / "fail", "--image-column", "image") == 1
    err = _one_line_error(capsys)
    assert f"{src}:row 3: column 'image' (row group 0): bad image" in err
    assert not (tmp_path / "fail").exists() and not (tmp_path / "fail.parts").exists()


def test_missing_image_file_named_by_a_path_column(tmp_path):
    (tmp_path / "there.jpg").write_bytes(jpeg_bytes(1))
    pq.write_table(pa.table({"path": ["there.jpg", "gone.jpg"], "t": ["a", "b"]}), tmp_path / "m.parquet")
    assert run(tmp_path / "m.parquet", tmp_path / "out", "--image-column", "path", "--on-error", "skip") == 0
    assert list(mmloader.open(tmp_path / "out").keys) == ["000000000"]
    report = (tmp_path / "out.skipped.tsv").read_text()
    assert f"{tmp_path / 'm.parquet'}:row 1\tcolumn 'path' (row group 0): unreadable" in report and "gone.jpg" in report


def test_nan_is_stored_as_null_in_the_json_field(tmp_path, capsys):
    """A Parquet NaN went into the json field as NaN, which strict JSON parsers refuse (issue 60)."""
    table = pa.table({"t": ["a", "b", "c"], "score": [0.5, float("nan"), float("inf")], "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "s.parquet")
    assert run(tmp_path / "s.parquet", tmp_path / "out", "--text-column", "t") == 0
    raw = [bytes(s["json"]).decode() for s in mmloader.open(tmp_path / "out")]
    assert [json.loads(r, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) for r in raw] == [
        {"score": 0.5, "n": 1},
        {"score": None, "n": 2},
        {"score": None, "n": 3},
    ]
    assert "2 NaN or infinite value(s) in the json field stored as null" in capsys.readouterr().out


def test_schema_that_differs_between_files(tmp_path, capsys):
    pq.write_table(pa.table(_rows(6)), tmp_path / "a.parquet")
    other = _rows(4, start=6)
    del other["caption"]  # the second file lacks the text column
    pq.write_table(pa.table(other), tmp_path / "b.parquet")
    third = _rows(3, start=10)
    third["image"] = list(range(3))  # the third holds integers where images were
    pq.write_table(pa.table(third), tmp_path / "c.parquet")
    opts = ["--image-column", "image", "--text-column", "caption"]
    assert run(tmp_path, tmp_path / "out", *opts, "--on-error", "skip") == 0
    assert len(mmloader.open(tmp_path / "out")) == 6
    report = (tmp_path / "out.skipped.tsv").read_text().splitlines()[1:]
    assert len(report) == 7
    assert report[0] == (
        f"000000006\t{tmp_path / 'b.parquet'}:row 0\tschema differs: this file has no column "
        "'caption' (its columns: 'image', 'label', 'width', 'url')"
    )
    assert report[4].startswith(f"000000010\t{tmp_path / 'c.parquet'}:row 0\tschema differs: column 'image' is int64")
    capsys.readouterr()
    assert run(tmp_path, tmp_path / "fail", *opts) == 1
    err = _one_line_error(capsys)
    assert "b.parquet:row 0: schema differs: this file has no column 'caption'" in err


def test_wrong_column_name_is_a_usage_error_listing_the_columns(tmp_path, capsys):
    pq.write_table(pa.table(_rows(3)), tmp_path / "a.parquet")
    assert run(tmp_path / "a.parquet", tmp_path / "out", "--image-column", "img") == 2
    err = _one_line_error(capsys)
    assert "--image-column 'img' is not a column" in err and "'image', 'caption', 'label'" in err
    assert run(tmp_path / "a.parquet", tmp_path / "out", "--image-column", "label") == 2
    assert "an image column holds bytes" in _one_line_error(capsys)
    assert run(tmp_path / "a.parquet", tmp_path / "out", "--image-column", "image", "--shuffle-seed", "1") == 2
    assert "file order" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_unreadable_row_group_and_file_are_bad_rows(tmp_path, capsys):
    src = tmp_path / "a.parquet"
    pq.write_table(
        pa.table(_rows(30)), src, row_group_size=10, write_page_checksum=True, compression="none", use_dictionary=False
    )
    meta = pq.ParquetFile(src).metadata
    col = meta.row_group(1).column(0)  # the image column of row group 1: flip bytes in its data
    data = bytearray(src.read_bytes())
    at = col.data_page_offset + col.total_compressed_size // 2
    data[at : at + 64] = bytes(64)
    src.write_bytes(bytes(data))
    (tmp_path / "b.parquet").write_bytes(b"PAR1 truncated, no footer")
    assert run(tmp_path, tmp_path / "out", "--image-column", "image", "--on-error", "skip") == 0
    assert len(mmloader.open(tmp_path / "out")) == 20
    report = (tmp_path / "out.skipped.tsv").read_text().splitlines()[1:]
    assert [l.split("\t")[1] for l in report[:10]] == [f"{src}:row {r}" for r in range(10, 20)]
    assert all("row group 1 cannot be read" in l for l in report[:10])
    assert report[10].startswith(f"b.parquet\t{tmp_path / 'b.parquet'}\tnot a readable Parquet or Arrow IPC file")


def test_parts_of_a_parquet_input_merge_to_the_single_process_shards(tmp_path):
    for f in range(3):
        pq.write_table(pa.table(_rows(11, start=11 * f)), tmp_path / f"p{f}.parquet", row_group_size=4)
    opts = ["--image-column", "image", "--text-column", "caption", "--shard-size", "5"]
    assert run(tmp_path, tmp_path / "whole", *opts, "--workers", "1") == 0
    for i in range(4):
        assert run(tmp_path, tmp_path / "merged", *opts, "--part", f"{i}/4", "--workers", "2") == 0
    manifests = [json.loads(p.read_text()) for p in sorted((tmp_path / "merged.parts").glob("*.json"))]
    assert [m["count"] for m in manifests] == [10, 5, 10, 8]  # rows cut at multiples of --shard-size
    assert cli(["merge", str(tmp_path / "merged"), "-q"]) == 0
    assert _shas(tmp_path / "merged") == _shas(tmp_path / "whole")


def _big_parquet(path: Path, rows: int) -> int:
    """``rows`` rows of 100 KB incompressible images (a real JPEG header + noise) and a caption,
    in ONE row group (one ``write_table`` call), in pages of 16 values (write_batch_size=16)."""
    rng = np.random.default_rng(0)
    head = jpeg_bytes(0)
    table = pa.table(
        {
            "image": pa.array([head + rng.bytes(100_000) for _ in range(rows)], pa.binary()),
            "caption": [f"c{i}" for i in range(rows)],
        }
    )
    pq.write_table(table, path, compression="none", use_dictionary=False, write_batch_size=16, row_group_size=rows)
    del table
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path.stat().st_size


@pytest.mark.process
def test_memory_stays_flat_as_the_parquet_file_grows(tmp_path):
    """Peak RSS of the whole conversion for a 40 MB and a 200 MB file (each one row group): the
    reader holds record batches, not the file. (The 2 GB figure is in benchmarks/RESULTS.md.)"""
    peaks = {}
    for rows in (400, 2000):
        src = tmp_path / f"{rows}.parquet"
        size = _big_parquet(src, rows)
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked test process
        code = (
            "import re, sys; from mmloader.cli import main; "
            f"rc = main(['convert', 'parquet', {str(src)!r}, {str(tmp_path / f'out{rows}')!r}, "
            "'--image-column', 'image', '--text-column', 'caption', '-q']); "
            "print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024); "
            "sys.exit(rc)"
        )
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        peaks[rows] = int(out.stdout.split()[-1])
        print(f"parquet {size / 1e6:.0f} MB -> peak RSS {peaks[rows]} MB")
        assert len(mmloader.open(tmp_path / f"out{rows}")) == rows
        src.unlink()
    assert peaks[2000] - peaks[400] < 40, peaks  # 5x the file, the same memory


# -- img2dataset's output: tar shards + parquet + stats, indexed with `mmloader index` ----------
def _img2dataset_output(root: Path, shards: int = 2, per: int = 5) -> Path:
    """What img2dataset writes with output_format=webdataset: NNNNN.tar (KEY.jpg/.txt/.json per
    sample, keys are shard id + index), NNNNN.parquet (one row per URL, failures too) and
    NNNNN_stats.json."""
    root.mkdir()
    for s in range(shards):
        rows = []
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for j in range(per + 1):
                key = f"{s:05d}{j:04d}"
                ok = j < per  # the last URL failed: a parquet row, no tar members
                rows.append(
                    {
                        "url": f"http://example.com/{key}.jpg",
                        "caption": f"cap {key}",
                        "key": key,
                        "status": "success" if ok else "failed_to_download",
                        "error_message": None if ok else "404",
                        "width": 48 if ok else None,
                        "height": 32 if ok else None,
                        "original_width": 480 if ok else None,
                        "original_height": 320 if ok else None,
                        "exif": None,
                        "sha256": None,
                    }
                )
                if not ok:
                    continue
                meta = {k: v for k, v in rows[-1].items()}
                for ext, data in (
                    ("jpg", jpeg_bytes(s * 100 + j)),
                    ("txt", f"cap {key}".encode()),
                    ("json", json.dumps(meta).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
        pq.write_table(pa.Table.from_pylist(rows), root / f"{s:05d}.parquet")
        (root / f"{s:05d}_stats.json").write_text(
            json.dumps({"count": per + 1, "successes": per, "failed_to_download": 1})
        )
    return root


def test_img2dataset_output_is_indexed_and_read(tmp_path):
    root = _img2dataset_output(tmp_path / "laion")
    assert cli(["index", str(root), "-q"]) == 0
    store = mmloader.open(root)
    assert len(store) == 10 and sorted(store.fields) == ["jpg", "json", "txt"]
    ds = mmloader.zip(
        image=mmloader.ImageReader(root, "jpg", output="raw"),
        caption=mmloader.TextReader(root, "txt"),
        meta=mmloader.JSONReader(root, "json"),
    )
    s = ds[6]  # shard 1, sample 1
    assert s["__key__"] == "000010001" and s["caption"] == "cap 000010001" and s["meta"]["status"] == "success"
    assert bytes(s["image"].numpy()) == jpeg_bytes(101)
    decoded = mmloader.ImageReader(root, "jpg")[6]
    assert tuple(decoded.shape) == (3, 32, 48)
    assert verify(root, decode=True, progress=False).ok


@pytest.mark.process
def test_mmloader_imports_neither_pyarrow_nor_ray_and_parquet_help_needs_neither():
    code = "import sys, mmloader; print(sorted(m for m in ('pyarrow', 'ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mmloader.converters.parquet", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "examples:" in out.stdout and "--engine" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "pyarrow", "ray"}
