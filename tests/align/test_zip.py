"""Zip alignment (mmloader/align/zip.py): across stores, by position or by key, strict and inner,
only the zipped fields read, transforms and caches on a zip, workers, fields only some samples have."""

from __future__ import annotations

import pytest
import torch
from conftest import _encode, _photo, jpeg_bytes

import mmloader
from mmloader.errors import AlignmentError


def _zip(a, b, **kw):
    return mmloader.zip(image=mmloader.ImageReader(a), caption=mmloader.TextReader(b), **kw)


def test_zip_across_lmdb_and_tar(lmdb_ds, tar_ds):
    ds = mmloader.zip(
        image=mmloader.ImageReader(lmdb_ds), caption=mmloader.TextReader(tar_ds), label=mmloader.LabelReader(lmdb_ds)
    )
    assert not ds.by_key and len(ds) == 23
    s = ds[8]
    assert s["__key__"] == "s00008" and s["caption"] == "caption number 8 é" and s["label"] == 1
    assert s["image"].shape == (3, 32, 48)
    assert set(s) == {"__key__", "image", "caption", "label"}


def _captions(path, keys, fmt="lmdb"):
    with mmloader.writer_for(path, fmt) as w:
        for k in keys:
            w.write({"__key__": k, "txt": f"text of {k}"})
    return path


def test_zip_joins_by_key_when_order_differs(lmdb_ds, tmp_path):
    keys = [f"s{i:05d}" for i in range(23)][::-1]
    caps = _captions(tmp_path / "rev.lmdb", keys)
    ds = _zip(lmdb_ds, caps)
    assert ds.by_key and len(ds) == 23
    assert ds[3]["caption"] == "text of s00003"


def test_zip_strict_names_missing_and_extra_keys(lmdb_ds, tmp_path):
    keys = [f"s{i:05d}" for i in range(23) if i != 5] + ["extra-1"]
    caps = _captions(tmp_path / "m.lmdb", keys, "tar")
    with pytest.raises(AlignmentError) as e:
        _zip(lmdb_ds, caps)
    msg = str(e.value)
    assert "s00005" in msg and "extra-1" in msg and "23" in msg and "align='inner'" in msg


def test_zip_inner_keeps_intersection_and_reports(lmdb_ds, tmp_path):
    keys = [f"s{i:05d}" for i in range(0, 23, 2)] + ["only-here"]
    caps = _captions(tmp_path / "i.lmdb", keys)
    ds = _zip(lmdb_ds, caps, align="inner")
    assert len(ds) == 12
    assert [ds[i]["__key__"] for i in range(3)] == ["s00000", "s00002", "s00004"]
    assert ds.report == {"image": 11, "caption": 1}


def test_zip_key_mismatch_anywhere_is_found_at_once(tmp_path):
    """The key fingerprint digests every key: a difference at any position (here one the old
    64-point sample never read) is found when the readers are zipped, naming the keys."""
    n = 200
    a = _captions(tmp_path / "a.lmdb", [f"k{i:04d}" for i in range(n)])
    keys = [f"k{i:04d}" for i in range(n)]
    keys[102] = "zzzz"
    b = _captions(tmp_path / "b.lmdb", keys)
    with pytest.raises(AlignmentError, match="zzzz"):
        mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b))
    inner = mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b), align="inner")
    assert len(inner) == n - 1 and "k0102" not in inner.keys


@pytest.mark.parametrize("n, at", [(10, 9), (30, 25), (64, 40), (65, 33)])
def test_small_stores_differing_late_are_not_taken_for_the_same(tmp_path, n, at):
    """The issue's defect 5: under 64 keys the fingerprint read only the first positions."""
    keys = [f"k{i:04d}" for i in range(n)]
    a = _captions(tmp_path / "a.lmdb", keys)
    b = _captions(tmp_path / "b", keys[:at] + ["other"] + keys[at + 1 :], fmt="tar")
    inner = mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b), align="inner")
    assert len(inner) == n - 1  # (it said n, then raised mid-stream)
    assert [s["x"] for s in inner] == [f"text of {k}" for k in keys if k != keys[at]]


def test_only_zipped_fields_are_read(any_ds, monkeypatch):
    ds = mmloader.zip(caption=mmloader.TextReader(any_ds))
    store = ds.readers["caption"].store
    asked = []
    real = store.read
    monkeypatch.setattr(store, "read", lambda i, fields=None: asked.append(fields) or real(i, fields))
    ds[2]
    assert asked == [["txt"]]


def test_transforms_and_bounded_cache(lmdb_ds):
    cache = mmloader.SampleCache(max_bytes=3 * (3 * 32 * 48 + 400))  # three decoded (uint8) samples
    ds = mmloader.zip(
        image=mmloader.ImageReader(lmdb_ds),
        caption=mmloader.TextReader(lmdb_ds),
        transforms={"image": lambda t: t.float() / 255},
        cache=cache,
    )
    for _ in range(3):
        for i in range(10):
            assert ds[i]["image"].dtype == torch.float32
    st = cache.stats()
    assert st["bytes"] <= st["max_bytes"] and st["evictions"] > 0 and st["items"] <= 3
    assert st["misses"] == 30
    ds[9]
    assert cache.stats()["hits"] == 1


def test_cache_keeps_decoded_samples_and_random_transforms_run_every_time(lmdb_ds):
    """Defect 13.7: a cached sample must not freeze a random augmentation."""
    draws = iter(range(1_000_000))
    flips = mmloader.zip(
        image=mmloader.ImageReader(lmdb_ds, transform=lambda t: t + 0 * next(draws)),
        caption=mmloader.TextReader(lmdb_ds),
        transforms={"caption": lambda c: (c, next(draws))},
        cache=mmloader.SampleCache(max_bytes=1 << 24),
    )
    first, second = flips[3], flips[3]
    assert flips.cache.stats()["hits"] == 1
    assert first["caption"][1] != second["caption"][1]  # the transform ran again on the cached sample
    assert torch.equal(first["image"], second["image"]) and first["image"].dtype == torch.uint8
    # the cache holds what was decoded, before any transform
    cached = flips.cache.get(3)
    assert isinstance(cached["caption"], str) and cached["image"].dtype == torch.uint8


class _Take(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        s = self.ds[i]
        return s["__key__"], s["image"].sum().item(), s["caption"]


@pytest.mark.process
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_zipped_readers_in_workers(lmdb_ds, tar_ds, method):
    ds = mmloader.zip(image=mmloader.ImageReader(lmdb_ds), caption=mmloader.TextReader(tar_ds))
    ds[0]
    expected = [(s["__key__"], s["image"].sum().item(), s["caption"]) for s in (ds[i] for i in range(len(ds)))]
    dl = torch.utils.data.DataLoader(_Take(ds), batch_size=None, num_workers=2, multiprocessing_context=method)
    assert [tuple(x) for x in dl] == expected  # the default collate turns tuples into lists


def test_inner_zip_keys_are_lazy(lmdb_ds, tmp_path):
    caps = _captions(tmp_path / "k.lmdb", [f"s{i:05d}" for i in range(0, 23, 3)])
    ds = _zip(lmdb_ds, caps, align="inner")
    assert not isinstance(ds.keys, list) and len(ds.keys) == 8
    assert list(ds.keys) == [f"s{i:05d}" for i in range(0, 23, 3)] and ds.keys[-1] == "s00021"


# -- issue 13, defect 13: a field only some samples have -----------------------------------------
def _imagefolder_like(tmp_path):
    """What an imagefolder with .jpg, .png files gives: two image fields, each on some samples."""
    path = tmp_path / "mixed.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(12):
            fmt = "png" if i % 4 == 3 else "jpg"
            data = _encode(_photo(40, 30), "PNG") if fmt == "png" else jpeg_bytes(i, size=(40, 30))
            w.write({"__key__": f"k{i:02d}", fmt: data, "cls": i % 2})
    return path


def test_zip_refuses_a_field_that_only_some_samples_have(tmp_path):
    path = _imagefolder_like(tmp_path)
    with pytest.raises(AlignmentError) as e:
        mmloader.zip(image=mmloader.ImageReader(path, "jpg"), label=mmloader.LabelReader(path))
    msg = str(e.value)
    assert "'jpg', which only 9 of the 12 samples" in msg and "png (3)" in msg and "field='jpg;png'" in msg


def test_alternative_fields_and_the_default_image_field(tmp_path):
    path = _imagefolder_like(tmp_path)
    for reader in (mmloader.ImageReader(path, "jpg;png"), mmloader.ImageReader(path)):
        assert reader.field == "jpg;png"
        ds = mmloader.zip(image=reader, label=mmloader.LabelReader(path))
        rows = [ds[i]["image"] for i in range(12)]
        assert all(r.shape == (3, 30, 40) for r in rows)
        batch = ds.get_batch(list(range(12)))
        assert all(torch.equal(a, b) for a, b in zip(batch["image"].tensor, rows))


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_optional_fields_read_as_missing_on_shards_and_lmdb(tmp_path, fmt):
    """A field only some samples have: refused naming optional=True and only fields of the
    reader's kind; read as missing with it, ``__present__`` per row, each sample once."""
    path = tmp_path / ("d.lmdb" if fmt == "lmdb" else "d")
    with mmloader.writer_for(path, fmt, **({"shard_size": 4} if fmt == "tar" else {})) as w:
        for i in range(10):
            sample = {"__key__": f"k{i:02d}", "jpg": jpeg_bytes(i, size=(16, 12)), "cls": i % 2, "json": {"i": i}}
            sample["title.txt"] = f"title {i}"
            if i % 3:
                sample["txt"] = f"t{i}"
            w.write(sample)
    with pytest.raises(AlignmentError) as e:
        mmloader.zip(image=mmloader.ImageReader(path, "jpg"), caption=mmloader.TextReader(path, "txt"))
    msg = str(e.value)
    assert "'txt', which only 6 of the 10 samples" in msg and "To read the 4 samples without it as missing" in msg
    assert "TextReader(..., field='txt', optional=True)" in msg and "batch['__present__']['caption']" in msg
    assert "other text fields there: title.txt (10). Read alternatives with field='txt;title.txt'" in msg, msg
    assert not any(f"{f} (" in msg for f in ("jpg", "cls", "json")), msg
    ds = mmloader.zip(image=mmloader.ImageReader(path, "jpg"), caption=mmloader.TextReader(path, "txt", optional=True))
    assert "caption" not in ds[3] and ds[4]["caption"] == "t4"
    seen = []
    for b in mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=2), num_workers=2, backend="process"):
        for j, key in enumerate(b["__key__"]):
            i = int(key[1:])
            assert b["__present__"]["caption"][j].item() == bool(i % 3)
            assert b["caption"][j] == (f"t{i}" if i % 3 else None) and b["image"][j].shape == (3, 12, 16)
        seen += b["__key__"]
    assert sorted(seen) == [f"k{i:02d}" for i in range(10)]


# -- review findings: transforms on the whole-batch path, cached values changed in place ---------
@pytest.mark.parametrize("output", ["tensor", "raw"])
def test_zip_transforms_get_one_sample_at_a_time_on_the_batch_path(lmdb_ds, output):
    seen = []

    def record(value):
        seen.append(tuple(value.shape))
        return value

    ds = mmloader.zip(image=mmloader.ImageReader(lmdb_ds, output=output), transforms={"image": record})
    batch = ds.get_batch([0, 1, 2, 3])
    rows = [ds[i]["image"] for i in range(4)]
    assert len(batch["image"]) == 4 and all(torch.equal(a, b) for a, b in zip(batch["image"], rows))
    assert seen[:4] == [tuple(r.shape) for r in rows]  # one call per sample, never the whole batch


def test_cached_values_are_not_changed_by_in_place_transforms_or_callers(lmdb_ds):
    def cutout(image):  # an in-place augmentation, like RandomErasing(inplace=True)
        image[:, :4, :4] = 0
        return image

    ds = mmloader.zip(
        image=mmloader.ImageReader(lmdb_ds), transforms={"image": cutout}, cache=mmloader.SampleCache(max_bytes=1 << 24)
    )
    plain = mmloader.zip(image=mmloader.ImageReader(lmdb_ds), transforms={"image": cutout})
    for _ in range(3):
        assert torch.equal(ds[3]["image"], plain[3]["image"])  # the patch does not pile up
    got = ds[5]["image"]
    got.zero_()  # the caller changes what it got
    assert torch.equal(ds[5]["image"], plain[5]["image"])


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_a_batch_gunzips_the_gz_alternative_each_sample_has(tmp_path, fmt):
    """``"txt;txt.gz"``: a batch decodes each value as the field it came from, as ``ds[i]`` does."""
    import gzip

    path = tmp_path / f"gz.{fmt}"
    with mmloader.writer_for(path, fmt, **({"shard_size": 4} if fmt == "tar" else {})) as w:
        for i in range(8):
            text = f"caption {i}"
            w.write({"__key__": f"k{i}", **({"txt.gz": gzip.compress(text.encode())} if i % 2 else {"txt": text})})
    ds = mmloader.zip(text=mmloader.TextReader(path, "txt;txt.gz"))
    expected = [f"caption {i}" for i in range(8)]
    assert [ds[i]["text"] for i in range(8)] == expected
    assert ds.get_batch(list(range(8)))["text"] == expected
    batches = mmloader.loader(mmloader.Stream(ds, batch_size=4, shuffle=False), num_workers=0)
    assert [t for b in batches for t in b["text"]] == expected


def test_a_batchs_error_names_the_alternative_field_the_sample_has(tmp_path):
    path = tmp_path / "alt.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(4):
            w.write(
                {"__key__": f"k{i}", **({"png": b"\x89PNG\r\n\x1a\n not a png"} if i == 2 else {"jpg": jpeg_bytes(i)})}
            )
    ds = mmloader.zip(image=mmloader.ImageReader(path, "jpg;png"))
    with pytest.raises(mmloader.DecodeError) as one:
        ds[2]
    with pytest.raises(mmloader.DecodeError) as batch:
        ds.get_batch([0, 1, 2, 3])
    for e in (one.value, batch.value):
        assert (e.key, e.field) == ("k2", "png")


def test_a_reader_subclass_with_the_older_from_column_still_reads_batches(lmdb_ds):
    """``fields=`` goes only to readers with alternatives: an override without it keeps working."""

    class Upper(mmloader.TextReader):
        def from_column(self, datas, keys, *, share_memory=False):
            return [bytes(d).decode().upper() for d in datas]

    ds = mmloader.zip(caption=Upper(lmdb_ds))
    assert ds.get_batch([3, 1])["caption"] == ["CAPTION NUMBER 3 É", "CAPTION NUMBER 1 É"]
