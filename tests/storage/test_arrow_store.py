"""Arrow folders written by the real ``datasets`` (save_to_disk) and Parquet files (to_parquet,
pyarrow) read in place: the same bytes as the table holds, zipped, streamed to DataLoader
workers, mixed and resumed without a conversion."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, write_dataset

import mmloader
from mmloader.errors import AlignmentError, FormatError
from mmloader.storage import ArrowStore, open_store

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from PIL import Image  # noqa: E402

N = 23


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), i * 9 % 256, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """One image-text table, as save_to_disk (3 Arrow files) and as Parquet (small row groups)."""
    root = tmp_path_factory.mktemp("tables")
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["a", "b", "c"]),
            "score": datasets.Value("float32"),
            "tags": datasets.Sequence(datasets.Value("string")),
            "raw": datasets.Value("binary"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": _png(i), "path": None} for i in range(N)],
            "caption": [f"caption {i}" if i != 5 else None for i in range(N)],
            "label": [i % 3 for i in range(N)],
            "score": [i / 4 for i in range(N)],
            "tags": [["x"] * (i % 3) for i in range(N)],
            "raw": [bytes([i]) * i for i in range(N)],
        },
        features=features,
    )
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    ds.to_parquet(str(root / "pq" / "part-0.parquet"), batch_size=4)
    return {"ds": ds, "saved": root / "saved", "parquet": root / "pq", "file": root / "pq" / "part-0.parquet"}


@pytest.fixture(params=["saved", "parquet", "file"])
def path(request, table):
    return table[request.param]


def test_rows_hold_the_tables_bytes(path, table):
    store = mmloader.open(path)
    assert isinstance(store, ArrowStore) and len(store) == N
    assert store.fields == ["image", "caption", "label", "score", "tags", "raw"]
    assert store.metadata["field_counts"]["caption"] == N - 1 and store.metadata["field_counts"]["image"] == N
    raw = table["ds"].data.table.to_pylist()  # what the table holds, undecoded
    for i in (0, 5, 11, N - 1):
        row = store[i]
        assert row["__key__"] == f"{i:08d}" and store.index_of(row["__key__"]) == i
        assert row["image"] == raw[i]["image"]["bytes"]
        assert row.get("caption") == (raw[i]["caption"].encode() if raw[i]["caption"] is not None else None)
        assert row["label"] == str(raw[i]["label"]).encode() and float(row["score"]) == raw[i]["score"]
        assert json.loads(row["tags"]) == raw[i]["tags"] and row["raw"] == raw[i]["raw"]
    keys, cols = store.read_many([20, 3, 3, 9], ["caption"])
    assert keys == ["00000020", "00000003", "00000003", "00000009"]
    assert cols["caption"] == [b"caption 20", b"caption 3", b"caption 3", b"caption 9"]


@pytest.mark.process
def test_readers_stream_and_workers_exactly_once(path):
    ds = mmloader.zip(
        image=mmloader.ImageReader(path, field="image"),
        text=mmloader.TextReader(path, field="raw"),
        label=mmloader.LabelReader(path, field="label"),
    )
    sample = ds[7]
    assert tuple(sample["image"].shape[-2:]) == (8, 8) and int(sample["label"]) == 1
    seen = []
    for rank in (0, 1):
        stream = mmloader.Stream(ds, batch_size=4, seed=3)
        stream.set_world(rank, 2)
        seen += [k for b in mmloader.loader(stream, num_workers=2, backend="process") for k in b["__key__"]]
    padded = 2 * 3 * 4  # each rank: ceil(23 / 2 / 4) batches of 4
    assert len(seen) == padded and set(seen) == {f"{i:08d}" for i in range(N)}


@pytest.mark.process
def test_resume_mid_epoch_and_mix_with_shards(path, tmp_path):
    shards = write_dataset(tmp_path / "shards", 10, "tar")
    mixed = mmloader.mix(
        [mmloader.zip(text=mmloader.TextReader(path, field="raw")), mmloader.zip(text=mmloader.TextReader(shards))],
        names=["table", "shards"],
    )
    full = [
        k for b in mmloader.loader(mmloader.Stream(mixed, batch_size=3, seed=1), num_workers=0) for k in b["__key__"]
    ]
    loader = mmloader.loader(mmloader.Stream(mixed, batch_size=3, seed=1), num_workers=2, backend="process")
    it = iter(loader)
    head = [k for _ in range(3) for k in next(it)["__key__"]]
    state = loader.state_dict()
    del it
    again = mmloader.loader(mmloader.Stream(mixed, batch_size=3, seed=1), num_workers=1, backend="process")
    again.load_state_dict(state)
    assert head + [k for b in again for k in b["__key__"]] == full
    assert len(set(full)) == len(full) and {k[0] for k in full} == {"0", "s"}  # both tables, no repeats


def test_only_asked_columns_are_decoded(table):
    store = ArrowStore(table["parquet"], cache_bytes=1 << 30)
    store.read_many(list(range(N)), ["caption"])
    assert {name for _f, _g, name in store._groups} == {"caption"}
    assert len(store._groups) == -(-N // 4)  # every row group of one column, once


def test_parquet_cache_is_bounded(table):
    store = ArrowStore(table["parquet"], cache_bytes=1)
    for i in range(N):
        store[i]
    assert len(store._groups) == 1  # a row group at a time


def test_pickles_without_the_table(table, tmp_path):
    table["ds"].save_to_disk(str(tmp_path / "one"), num_shards=3)
    datasets.concatenate_datasets([table["ds"]] * 10).save_to_disk(str(tmp_path / "ten"), num_shards=3)
    small, big = (pickle.dumps(ArrowStore(tmp_path / name)) for name in ("one", "ten"))
    assert len(big) - len(small) < 16 and len(pickle.loads(big)) == 10 * N  # counts, never rows


def test_key_column_and_path_only_images(tmp_path):
    img = tmp_path / "img.png"
    img.write_bytes(_png(1))
    pq.write_table(
        pa.table(
            {
                "key": ["a", "b", "c"],
                "jpg": pa.array(
                    [
                        {"bytes": _png(0), "path": None},
                        {"bytes": None, "path": str(img)},
                        {"bytes": None, "path": "rel.png"},
                    ],
                    pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
                ),
            }
        ),
        tmp_path / "t.parquet",
    )
    store = open_store(tmp_path / "t.parquet")
    assert store.fields == ["jpg"] and list(store.keys) == ["a", "b", "c"] and store.index_of("c") == 2
    assert store.get("b")["jpg"] == img.read_bytes()
    with pytest.raises(FormatError, match=r"row 2, column 'jpg' holds only a path \('rel.png'\)"):
        store[2]


def test_clear_errors(table, tmp_path):
    dd = datasets.DatasetDict({"train": table["ds"], "test": table["ds"]})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(FormatError, match=r"DatasetDict \(splits test, train\): open one split"):
        mmloader.open(tmp_path / "dd")
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"a": [1]}), tmp_path / "mixed" / "0.parquet")
    pq.write_table(pa.table({"b": ["x"]}), tmp_path / "mixed" / "1.parquet")
    with pytest.raises(FormatError, match=r"1.parquet: its columns differ from those of .*0.parquet"):
        open_store(tmp_path / "mixed")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(FormatError, match=r"x.parquet: not a readable parquet file"):
        open_store(tmp_path / "bad")
    with pytest.raises(KeyError, match="no column 'jpg'"):
        open_store(table["saved"]).read_many([0], ["jpg"])


def test_inspect_and_verify_read_every_row(table, tmp_path):
    from mmloader.cli.inspect import describe
    from mmloader.cli.verify import verify

    text = describe(table["saved"], preview=1)
    assert "format:  arrow" in text and "caption" in text and f"samples: {N}" in text
    report = verify(table["parquet"], decode=True, progress=False)
    assert report.ok and report.samples == N
    pq.write_table(pa.table({"jpg": [b"not an image", b""]}), tmp_path / "bad.parquet")
    bad = verify(tmp_path / "bad.parquet", decode=True, progress=False)
    assert not bad.ok and "empty image" in bad.summary() and "does not decode" in bad.summary()


def test_column_types_read_as_the_table_holds_them(tmp_path):
    import base64

    table = pa.table(
        {
            "cat": pa.array(["a cat", "a dog", "a cat"]).dictionary_encode(),  # pandas category
            "photo": pa.array(
                [{"bytes": b"x", "path": None, "width": 3}] * 3,
                pa.struct([("bytes", pa.binary()), ("path", pa.string()), ("width", pa.int32())]),
            ),
            "frames": pa.array([[{"bytes": b"\x89PNG", "path": None}]] * 3),
            "score": pa.array([0.5, None, 2.0]),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    store = open_store(tmp_path / "t.parquet")
    assert [store[i]["cat"] for i in range(3)] == [b"a cat", b"a dog", b"a cat"]
    assert json.loads(store[0]["photo"]) == {"bytes": base64.b64encode(b"x").decode(), "path": None, "width": 3}
    assert base64.b64decode(json.loads(store[1]["frames"])[0]["bytes"]) == b"\x89PNG"
    assert store.metadata["field_counts"]["score"] == 2 and "score" not in store[1]


def test_keys_must_name_each_row_once(tmp_path):
    pq.write_table(pa.table({"__key__": ["a", "b", "a"], "txt": ["1", "2", "3"]}), tmp_path / "dup.parquet")
    with pytest.raises(FormatError, match=r"column '__key__' \(the keys\) holds 'a' more than once"):
        open_store(tmp_path / "dup.parquet")
    pq.write_table(pa.table({"__key__": ["a", None], "txt": ["1", "2"]}), tmp_path / "null.parquet")
    with pytest.raises(FormatError, match=r"is empty at row 1"):
        open_store(tmp_path / "null.parquet")
    # a column merely called key (a music key) that does not name rows: data, rows keyed by number
    pq.write_table(pa.table({"key": ["C", "G", "C"], "txt": ["1", "2", "3"]}), tmp_path / "music.parquet")
    music = open_store(tmp_path / "music.parquet")
    assert music.synthetic_keys and music.fields == ["key", "txt"] and music[2]["key"] == b"C"
    pq.write_table(pa.table({"__key__": [b"\xff\x01", b"\xfe\x01"], "txt": ["1", "2"]}), tmp_path / "digest.parquet")
    assert list(open_store(tmp_path / "digest.parquet").keys) == ["ff01", "fe01"]  # binary keys: hex
    pq.write_table(pa.table({"key": [10, 7, 3], "txt": ["a", "b", "c"]}), tmp_path / "int.parquet")
    ints = open_store(tmp_path / "int.parquet")
    assert [ints.index_of(k) for k in ("3", "10", "7", "8")] == [2, 0, 1, None]
    pq.write_table(pa.table({"key": [0.5, 1.5], "txt": ["a", "b"]}), tmp_path / "float.parquet")
    floats = open_store(tmp_path / "float.parquet")
    assert floats.key_column is None and "key" in floats.fields  # a float column is data, not keys


def test_tables_without_keys_are_never_matched_by_row_number(tmp_path):
    pq.write_table(pa.table({"txt": [f"a{i}" for i in range(5)]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"txt": [f"b{i}" for i in range(4)]}), tmp_path / "b.parquet")
    with pytest.raises(mmloader.errors.AlignmentError, match="without a key column"):
        mmloader.zip(
            a=mmloader.TextReader(tmp_path / "a.parquet"), b=mmloader.TextReader(tmp_path / "b.parquet"), align="inner"
        )


def test_nested_and_unrecorded_null_counts_are_counted(tmp_path):
    table = pa.table({"tags": pa.array([["x"], None, [], ["y", None]]), "txt": ["a", None, "c", "d"]})
    pq.write_table(table, tmp_path / "nested.parquet")
    pq.write_table(table, tmp_path / "nostats.parquet", write_statistics=False)
    for name in ("nested", "nostats"):
        counts = open_store(tmp_path / f"{name}.parquet").metadata["field_counts"]
        assert counts == {"tags": 3, "txt": 3}, (name, counts)


def test_a_resume_state_reads_no_image_row_group(table):
    store = ArrowStore(table["parquet"])
    stream = mmloader.Stream(mmloader.zip(text=mmloader.TextReader(store, field="raw")), batch_size=4)
    loader = mmloader.loader(stream, num_workers=1, backend="thread")
    next(iter(loader))
    loader.state_dict()
    assert {name for _f, _g, name in store._groups} <= {"raw"}
    assert store.content_digest() == ArrowStore(table["parquet"]).content_digest()


def test_unknown_options_are_refused(table):
    with pytest.raises(TypeError, match=r"options \['verify_checksums'\] do not apply"):
        open_store(table["saved"], verify_checksums=True)


def test_dotted_column_names(tmp_path):
    pq.write_table(pa.table({"seg.png": [b"x", None], "txt": ["a", "b"]}), tmp_path / "a.parquet")
    store = open_store(tmp_path / "a.parquet")
    assert store.metadata["field_counts"] == {"seg.png": 1, "txt": 2}


# -- nullable columns: nulls read as missing (optional=True), refused without it ------------------------
M = 12
CAPTION_NULLS = {1, 4, 5, 9}
PHOTO_NULLS = {0, 1, 2, 3, 8}  # the first row group of the Parquet file holds no photo at all


@pytest.fixture(scope="module")
def nullable(tmp_path_factory):
    """The issue's table (image, an optional caption, label, meta, blob) with a second image
    column and a second text column, as Parquet (pyarrow, JPEG bytes, a struct) and as
    save_to_disk (HF Image features, meta as JSON text); and the issue's columns alone."""
    root = tmp_path_factory.mktemp("nullable")
    jpg = [jpeg_bytes(i, size=(16, 12)) for i in range(M)]
    columns = {
        "image": jpg,
        "photo": [None if i in PHOTO_NULLS else jpg[i] for i in range(M)],
        "caption": [None if i in CAPTION_NULLS else f"caption {i}" for i in range(M)],
        "title": [f"title {i}" for i in range(M)],
        "label": [i % 3 for i in range(M)],
        "blob": [bytes([i]) * 5 for i in range(M)],
    }
    meta = [{"width": 16, "i": i} for i in range(M)]
    parquet = pa.table({**columns, "meta": meta})
    pq.write_table(parquet, root / "t.parquet", row_group_size=4)
    issue = ["image", "caption", "label", "meta", "blob"]
    pq.write_table(parquet.select(issue), root / "issue.parquet", row_group_size=4)
    value = datasets.Value
    features = {
        "image": datasets.Image(),
        "photo": datasets.Image(),
        "caption": value("string"),
        "title": value("string"),
        "label": value("int64"),
        "blob": value("binary"),
        "meta": value("string"),
    }
    image = lambda b: None if b is None else {"bytes": b, "path": None}  # noqa: E731
    hf = datasets.Dataset.from_dict(
        {
            **columns,
            "image": [image(b) for b in jpg],
            "photo": [image(b) for b in columns["photo"]],
            "meta": [json.dumps(m) for m in meta],
        },
        features=datasets.Features(features),
    )
    hf.save_to_disk(str(root / "saved"), num_shards=2)
    hf.select_columns(issue).save_to_disk(str(root / "issue-saved"))
    return {
        "parquet": root / "t.parquet",
        "saved": root / "saved",
        "issue": [root / "issue.parquet", root / "issue-saved"],
    }


@pytest.fixture(params=["parquet", "saved"])
def nullable_path(request, nullable):
    return nullable[request.param]


def _refusal(**readers) -> str:
    with pytest.raises(AlignmentError) as e:
        mmloader.zip(**readers)
    return str(e.value)


def test_a_column_with_nulls_is_refused_naming_its_nulls_the_option_and_only_columns_of_its_kind(
    nullable_path, nullable
):
    p = nullable_path
    msg = _refusal(image=mmloader.ImageReader(p, field="image"), caption=mmloader.TextReader(p, field="caption"))
    assert f"caption= reads column 'caption' of {p}, which holds 4 nulls (of its 12 rows)" in msg, msg
    assert "pass optional=True (TextReader(..., field='caption', optional=True))" in msg
    assert "batch['__present__']['caption']" in msg
    assert "other text columns there: title (12). Read alternatives with field='caption;title'" in msg
    assert not any(f"{c} (" in msg or f";{c}" in msg for c in ("image", "photo", "label", "meta", "blob")), msg

    msg = _refusal(photo=mmloader.ImageReader(p, field="photo"))
    assert "column 'photo'" in msg and "holds 5 nulls (of its 12 rows)" in msg and "optional=True" in msg
    assert "other image columns there: image (12). Read alternatives with field='photo;image'" in msg, msg
    assert not any(f"{c} (" in msg or f";{c}" in msg for c in ("caption", "title", "label", "meta", "blob")), msg

    for issue in nullable["issue"]:  # the issue's own table: no other text or image column to propose
        msg = _refusal(image=mmloader.ImageReader(issue, field="image"), caption=mmloader.TextReader(issue, "caption"))
        assert "holds 4 nulls (of its 12 rows)" in msg and "optional=True" in msg, msg
        assert "Read alternatives" not in msg and "field='caption;" not in msg, msg


@pytest.mark.process
def test_nulls_read_as_missing_with_present_per_row(nullable_path):
    p = nullable_path
    caption = mmloader.TextReader(p, field="caption", optional=True)
    assert caption[1] is None and caption[0] == "caption 0"
    ds = mmloader.zip(
        image=mmloader.ImageReader(p, field="image"),
        photo=mmloader.ImageReader(p, field="photo", optional=True),
        caption=caption,
        label=mmloader.LabelReader(p, field="label"),
    )
    assert "caption" not in ds[4] and ds[4]["label"] == 1 and ds[6]["caption"] == "caption 6"
    assert "photo" not in ds[0] and torch.equal(ds[5]["photo"], ds[5]["image"])
    for workers in (0, 2):
        seen: list[str] = []
        loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=1), num_workers=workers, backend="process")
        for b in loader:
            present = b["__present__"]
            assert present["caption"].dtype == torch.bool and len(present["caption"]) == len(b["__key__"])
            for j, key in enumerate(b["__key__"]):
                i = int(key)
                assert present["caption"][j].item() == (i not in CAPTION_NULLS)
                assert b["caption"][j] == (None if i in CAPTION_NULLS else f"caption {i}")
                assert present["photo"][j].item() == (i not in PHOTO_NULLS)
                photo = b["photo"][j]  # zeros for a row without it; None when no row of the batch has it
                if i in PHOTO_NULLS:
                    assert photo is None or not photo.any()
                else:
                    assert torch.equal(photo, b["image"][j])
                assert b["label"][j].item() == i % 3
            seen += b["__key__"]
        assert sorted(seen) == [f"{i:08d}" for i in range(M)]  # exactly once, as without nulls


def test_an_optional_column_without_nulls_still_says_every_row_has_it(nullable_path):
    ds = mmloader.zip(text=mmloader.TextReader(nullable_path, field="title", optional=True))
    batch = next(iter(mmloader.loader(mmloader.Stream(ds, batch_size=5), num_workers=0)))
    assert batch["__present__"]["text"].tolist() == [True] * 5 and None not in batch["text"]
