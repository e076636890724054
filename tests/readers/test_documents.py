"""Interleaved image-text documents: converted from OBELICS, MMC4 and WebDataset layouts, read back
lazily, collated with any number of images, packed, and read by webdataset itself."""

from __future__ import annotations

import glob
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
from conftest import jpeg_bytes, train_tokenizer
from PIL import Image

import mmloader
from mmloader.cli import main as cli

IMAGES_PER_DOC = [0, 1, 3, 40, 2, 0, 5, 1]  # a 0-image and a 40-image document among them


def run(*argv) -> int:
    try:
        return cli(["convert", "documents", *map(str, argv), "-q"])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


def source_documents() -> list[list[tuple[str, object]]]:
    """The documents every layout is made from: ``("text", str)`` / ``("image", jpeg bytes)`` in order."""
    docs = []
    for d, images in enumerate(IMAGES_PER_DOC):
        doc: list[tuple[str, object]] = [("text", f"document {d} opens é")]
        for i in range(images):
            doc.append(("image", jpeg_bytes(d * 100 + i, size=(16 + 8 * (i % 2), 16))))
            if i % 3 != 2:  # two images in a row now and then
                doc.append(("text", f"after image {i} of document {d}"))
        docs.append(doc)
    return docs


def write_obelics(root: Path, docs) -> Path:
    texts = [[v if k == "text" else None for k, v in doc] for doc in docs]
    images = [[v if k == "image" else None for k, v in doc] for doc in docs]
    path = root / "obelics.parquet"
    half = len(docs) // 2
    pq.write_table(
        pa.table({"texts": texts, "images": images, "url": [f"https://site/{d}" for d in range(len(docs))]}),
        path,
        row_group_size=half,
    )
    return path


def write_mmc4(root: Path, docs) -> tuple[Path, Path]:
    folder = root / "mmc4_images"
    folder.mkdir()
    path = root / "mmc4.jsonl"
    with open(path, "w") as f:
        for d, doc in enumerate(docs):
            sentences, infos, pending = [], [], []
            for kind, value in doc:
                if kind == "image":
                    name = f"{d}_{len(infos) + len(pending)}.jpg"
                    (folder / name).write_bytes(value)  # type: ignore[arg-type]
                    pending.append(name)
                else:
                    infos += [{"image_name": n, "matched_text_index": len(sentences)} for n in pending]
                    pending = []
                    sentences.append(value)
            if pending:  # images after the last sentence: mmc4 places an image before its sentence
                sentences.append("")
                infos += [{"image_name": n, "matched_text_index": len(sentences) - 1} for n in pending]
            f.write(json.dumps({"url": f"u{d}", "text_list": sentences, "image_info": infos}) + "\n")
    return path, folder


def write_wds(root: Path, docs) -> Path:
    path = root / "docs-000000.tar"
    with tarfile.open(path, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for d, doc in enumerate(docs):
            texts = [v if k == "text" else None for k, v in doc]
            add(f"doc{d:03d}.json", json.dumps({"texts": texts, "url": f"u{d}"}).encode())
            for i, (_k, v) in enumerate((k, v) for k, v in doc if k == "image"):
                add(f"doc{d:03d}.{i}.jpg", v)  # type: ignore[arg-type]
    return path


def expected(doc, mmc4: bool = False):
    out = [v if k == "text" else np.asarray(Image.open(io.BytesIO(v)).convert("RGB")) for k, v in doc]  # type: ignore[arg-type]
    if mmc4 and doc[-1][0] == "image":
        out.append("")
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("documents")
    docs = source_documents()
    obelics = write_obelics(root, docs)
    mmc4, folder = write_mmc4(root, docs)
    shards = write_wds(root, docs)
    out = {}
    for layout, args in (
        ("obelics", [obelics]),
        ("mmc4", [mmc4, "--images", folder]),
        ("wds", [shards]),
    ):
        for fmt, name in (("tar", f"{layout}-shards"), ("lmdb", f"{layout}.lmdb")):
            dst = root / name
            assert run(*args, dst, "--shard-size", "3") == 0
            out[layout, fmt] = dst
    return docs, out, root


@pytest.mark.parametrize("layout", ["obelics", "mmc4", "wds"])
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_converted_documents_read_back_equal(converted, layout, fmt):
    docs, out, _root = converted
    reader = mmloader.DocumentReader(out[layout, fmt])
    assert len(reader) == len(docs)
    for d, doc in enumerate(docs):
        got = reader[d]
        assert isinstance(got, mmloader.Document) and got.meta["url"] in (f"https://site/{d}", f"u{d}")
        want = expected(doc, mmc4=layout == "mmc4")
        segments = got.segments()
        assert len(segments) == len(want)
        for a, b in zip(segments, want):
            if isinstance(b, str):
                assert a == b
            else:
                assert torch.equal(a, torch.from_numpy(b.copy()).permute(2, 0, 1))


def test_document_images_are_read_only_when_asked(converted):
    _docs, out, _root = converted
    reader = mmloader.DocumentReader(out["obelics", "tar"])
    doc = reader[3]
    assert len(doc.image_fields) == 40 and not doc._images
    doc.image(7)
    assert list(doc._images) == [7]
    with pytest.raises(IndexError, match="has 40 images"):
        doc.image(40)


def test_webdataset_reads_the_shards(converted):
    docs, out, _root = converted
    shards = sorted(glob.glob(str(out["wds", "tar"] / "*.tar")))
    samples = list(wds.WebDataset(shards, shardshuffle=False).decode("rgb8"))
    assert [s["__key__"] for s in samples] == [f"doc{d:03d}" for d in range(len(docs))]
    for s, doc in zip(samples, docs):
        layout = s["json"]["document"]
        assert [e.get("text") for e in layout if "text" in e] == [v for k, v in doc if k == "text"]
        for e, (_k, v) in zip([e for e in layout if "image" in e], [(k, v) for k, v in doc if k == "image"]):
            assert np.array_equal(s[e["image"]], np.asarray(Image.open(io.BytesIO(v)).convert("RGB")))  # type: ignore[arg-type]


@pytest.mark.process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_batches_with_0_and_40_images(converted, backend):
    docs, out, _root = converted
    reader = mmloader.DocumentReader(out["obelics", "lmdb"], images=mmloader.ImageReader(None, size=(12, 12)))
    stream = mmloader.Stream(mmloader.zip(doc=reader), batch_size=4, shuffle=False)
    batches = list(mmloader.loader(stream, num_workers=2, backend=backend))
    first = batches[0]
    assert first["__counts__"]["doc"].tolist() == IMAGES_PER_DOC[:4]
    images = first["__images__"]["doc"]
    assert images.shape == (sum(IMAGES_PER_DOC[:4]), 3, 12, 12)
    assert first["__row__"]["doc"].tolist() == [r for r, n in enumerate(IMAGES_PER_DOC[:4]) for _ in range(n)]
    for r, segments in enumerate(first["doc"]):
        texts = [s for s in segments if isinstance(s, str)]
        assert texts == [v for k, v in docs[r] if k == "text"]
        places = [s for s in segments if isinstance(s, int)]
        assert [int(first["__row__"]["doc"][p]) for p in places] == [r] * IMAGES_PER_DOC[r]
    assert sum(int(b["__counts__"]["doc"].sum()) for b in batches) == sum(IMAGES_PER_DOC)


def test_a_corrupt_image_is_named_by_document_and_place(tmp_path):
    path = tmp_path / "docs.lmdb"
    layout = [{"text": "a"}, {"image": "0.jpg"}, {"image": "1.jpg"}, {"text": "b"}, {"image": "2.jpg"}]
    with mmloader.writer_for(path) as w:
        for d in range(4):
            sample = {"__key__": f"d{d}", "json": {"document": layout}}
            for i in range(3):
                data = jpeg_bytes(d * 3 + i)
                sample[f"{i}.jpg"] = data[: len(data) // 3] if (d, i) == (2, 1) else data
            w.write(sample)
    reader = mmloader.DocumentReader(path)
    with pytest.raises(mmloader.DecodeError, match=r"document 'd2': image 1 of 3 \(field '1.jpg'\)"):
        reader[2].image(1)
    ds = mmloader.zip(doc=reader)
    with pytest.raises(mmloader.DecodeError, match="'d2': image 1 of 3"):
        list(mmloader.loader(mmloader.Stream(ds, batch_size=2, shuffle=False), num_workers=0))
    skipping = mmloader.Stream(ds, batch_size=2, shuffle=False, errors="skip")
    keys = [k for b in mmloader.loader(skipping, num_workers=0) for k in b["__key__"]]
    assert "d2" not in keys and len(keys) == 4 and skipping.skipped == 1  # replaced, counted


def test_converter_reports_bad_documents(tmp_path):
    docs = source_documents()[:3]
    texts = [[v if k == "text" else None for k, v in doc] for doc in docs]
    images = [[v if k == "image" else None for k, v in doc] for doc in docs]
    images[1][1] = b"not an image"
    texts[2][0], images[2][0] = "both", jpeg_bytes(1)
    table = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"texts": texts, "images": images}), table)
    assert run(table, tmp_path / "out", "--on-error", "skip") == 0
    report = (tmp_path / "out.skipped.tsv").read_text()
    assert "row 1" in report and "image 0" in report  # the document's first image is the bad one
    assert "row 2" in report and "place 0 holds both a text and an image" in report
    assert len(mmloader.DocumentReader(tmp_path / "out")) == 1
    assert run(table, tmp_path / "raised") != 0
    assert not (tmp_path / "raised").exists()  # nothing half-written under the final name
    urls = tmp_path / "urls.parquet"
    pq.write_table(pa.table({"texts": [["t", None]], "images": [[None, "https://host/a.jpg"]]}), urls)
    assert run(urls, tmp_path / "u", "--on-error", "skip") != 0  # every document bad: nothing written
    assert "download the images first" in (tmp_path / "u.skipped.tsv").read_text()


def test_mmc4_missing_images_error_or_drop(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg_bytes(0))
    rows = [
        {
            "text_list": ["one", "two"],
            "image_info": [
                {"image_name": "a.jpg", "matched_text_index": 1},
                {"image_name": "gone.jpg", "matched_text_index": 0},
            ],
        }
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run(path, tmp_path / "strict", "--images", folder) != 0
    assert run(path, tmp_path / "dropped", "--images", folder, "--missing-images", "drop") == 0
    doc = mmloader.DocumentReader(tmp_path / "dropped")[0]
    assert [type(s).__name__ for s in doc.segments()] == ["str", "Tensor", "str"]


def test_packed_documents(converted, tmp_path):
    docs, out, _root = converted
    tokenizer = tmp_path / "tok.json"
    train_tokenizer([v for doc in docs for k, v in doc if k == "text"] * 5, tokenizer)  # type: ignore[misc]
    reader = mmloader.DocumentReader(
        out["wds", "lmdb"], images=mmloader.ImageReader(None, size=(8, 8)), tokenizer=tokenizer
    )
    ds = mmloader.zip(doc=reader)
    layout = mmloader.tokens("doc", per_image=3, image_token_id=299)
    stream = mmloader.Stream(ds, batch_size=2, seed=2, lengths=mmloader.Packing(512, length_by=layout))
    seen = []
    for batch in mmloader.loader(stream, num_workers=0):
        n = 0
        for r, keys in enumerate(batch["__key__"]):
            row = []
            for j, key in enumerate(keys):
                doc = reader.get(key)
                for kind, piece in doc.pieces():
                    if kind == "text":
                        row += piece.tolist()
                    else:
                        assert torch.equal(batch["__images__"]["doc"][n], piece)
                        assert (int(batch["__row__"]["doc"][n]), int(batch["__sample__"]["doc"][n])) == (r, j)
                        row += [299] * 3
                        n += 1
                seen.append(key)
            assert batch["doc"][r, : len(row)].tolist() == row
    assert sorted(seen) == sorted(f"doc{d:03d}" for d in range(len(docs)))


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_wds_input_faults_are_bad_samples_and_nothing_is_lost(tmp_path):
    j = lambda value: json.dumps(value).encode()  # noqa: E731
    shard = _tar(
        tmp_path / "in.tar",
        [
            ("a.json", j({"texts": ["x", None]})),
            ("b.json", j({"texts": ["only b"], "document": "a field named like the layout"})),
            ("a.0.jpg", jpeg_bytes(1)),  # a's image, after b: not next to a's json
            ("c.json", j([1, 2])),  # not an object
            ("d.json", j({"document": [{"text": "t"}, {"image": "1.jpg"}]})),  # names a missing image
            ("d.0.jpg", jpeg_bytes(2)),
            ("dir/e.json", j({"texts": [None, "after"], "url": "u"})),
            ("dir/e.0.jpg", jpeg_bytes(3)),
            ("dir/e.txt", b"a caption beside the document"),
        ],
    )
    assert run(shard, tmp_path / "out", "--on-error", "skip") == 0
    report = (tmp_path / "out.skipped.tsv").read_text()
    for key, reason in (
        ("a", "the json's texts have 1 image places"),  # a's json without its image
        ("a", "not next to each other in the tar"),  # the run of a's members after b
        ("c", "the json is a list, not an object"),
        ("d", "names image '1.jpg', which the sample does not have"),
    ):
        assert any(line.startswith(key) and reason in line for line in report.splitlines()), (key, reason, report)
    reader = mmloader.DocumentReader(tmp_path / "out")
    assert sorted(reader.keys) == ["b", "dir/e"]  # a key with a folder is kept as WebDataset has it
    assert reader.get("b").meta == {"document": "a field named like the layout"}  # metadata kept, layout intact
    e = reader.get("dir/e")
    assert e.texts == ["after"] and e.meta == {"url": "u"}
    assert mmloader.TextReader(tmp_path / "out").get("dir/e") == "a caption beside the document"


def test_malformed_rows_are_bad_samples_named_by_row(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "ok.jpg").write_bytes(jpeg_bytes(0))
    (folder / "bad.jpg").write_bytes(b"not an image at all")
    rows = [
        {"text_list": ["fine"], "image_info": [{"image_name": "ok.jpg", "matched_text_index": 0}]},
        {"text_list": ["x"], "image_info": ["ok.jpg"]},
        {"text_list": ["x"], "image_info": [{"image_name": "ok.jpg", "matched_text_index": True}]},
        {"text_list": [None, 5]},
        {"text_list": ["y"], "image_info": [{"image_name": "bad.jpg", "matched_text_index": 0}]},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run(path, tmp_path / "out", "--images", folder, "--on-error", "skip") == 0
    report = (tmp_path / "out.skipped.tsv").read_text().splitlines()[1:]
    assert [line.split("\t")[1] for line in report] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
    assert "image_info" in report[0] and "matched_text_index True" in report[1]
    assert "sentence 0 is a NoneType" in report[2] and "bad image" in report[3] and "bad.jpg" in report[3]
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"texts": ["a plain string"], "images": [None]}), table)
    assert run(table, tmp_path / "t", "--on-error", "skip") != 0  # its only row is bad: nothing written
    assert "must be lists" in (tmp_path / "t.skipped.tsv").read_text()


def test_collate_edge_cases_raw_images_and_no_images(tmp_path):
    path = tmp_path / "d.lmdb"
    with mmloader.writer_for(path) as w:
        w.write({"__key__": "a", "json": {"document": [{"text": "t"}, {"image": "0.jpg"}]}, "0.jpg": jpeg_bytes(4)})
        w.write({"__key__": "b", "json": {"document": [{"text": "only text"}]}})
    raw = mmloader.DocumentReader(path, images=mmloader.ImageReader(None, output="raw"))
    batch = mmloader.collate([{"d": raw[0]}, {"d": raw[1]}])
    assert batch["__counts__"]["d"].tolist() == [1, 0] and batch["d"][0] == ["t", 0]  # encoded bytes stay an image
    assert torch.equal(batch["__images__"]["d"][0], torch.frombuffer(bytearray(jpeg_bytes(4)), dtype=torch.uint8))
    empty = mmloader.collate([{"d": raw[1]}])
    assert isinstance(empty["__images__"]["d"], torch.Tensor) and empty["__images__"]["d"].numel() == 0
