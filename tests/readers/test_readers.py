"""Readers, decoders, zip alignment, cache, preview."""

from __future__ import annotations

import io
import pickle
import struct

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes, write_dataset
from PIL import Image
from torchvision.transforms.v2.functional import resize as torchvision_resize

import mmloader
from mmloader.errors import AlignmentError, DecodeError, SizeLimitError, UnsafeFieldError
from mmloader.readers.image_decode import decode_to_tensor, pil_to_tensor


def _photo(w=97, h=61) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h) + 60)], -1).astype(np.uint8)
    rgb = rgb ^ (np.random.default_rng(0).integers(0, 24, rgb.shape, dtype=np.uint8))
    return Image.fromarray(rgb)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


CASES = {
    "baseline-jpeg": lambda: _encode(_photo(), "JPEG", quality=92),
    "progressive-jpeg": lambda: _encode(_photo(), "JPEG", progressive=True),
    "grayscale-jpeg": lambda: _encode(_photo().convert("L"), "JPEG"),
    "cmyk-jpeg": lambda: _encode(_photo().convert("CMYK"), "JPEG"),
    "png-alpha": lambda: _encode(_photo().convert("RGBA"), "PNG"),
    "png-rgb": lambda: _encode(_photo(), "PNG"),
    "png-palette": lambda: _encode(_photo().convert("P"), "PNG"),
    "webp": lambda: _encode(_photo(), "WEBP"),
}


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("case", list(CASES))
def test_decoded_pixels_equal_pillow(case, mode):
    data = CASES[case]()
    ours = decode_to_tensor(data, mode)
    ref = pil_to_tensor(Image.open(io.BytesIO(data)).convert(mode))
    assert ours.dtype == torch.uint8 and ours.shape == ref.shape
    assert torch.equal(ours, ref), f"{case}/{mode}: max diff {(ours.int() - ref.int()).abs().max()}"


def test_image_reader_modes_and_outputs(tmp_path):
    path = tmp_path / "im.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "a", "png": CASES["png-alpha"](), "jpg": CASES["baseline-jpeg"]()})
    assert mmloader.ImageReader(path, "png", mode="RGBA")[0].shape == (4, 61, 97)
    assert mmloader.ImageReader(path, "png", mode="L")[0].shape == (1, 61, 97)
    pil = mmloader.ImageReader(path, output="pil")[0]
    assert isinstance(pil, Image.Image) and pil.size == (97, 61)
    raw = mmloader.ImageReader(path, output="raw")[0]
    assert raw.dtype == torch.uint8 and raw.dim() == 1 and bytes(raw.numpy()) == CASES["baseline-jpeg"]()
    sized = mmloader.ImageReader(path, size=(30, 40))[0]
    assert sized.shape == (3, 30, 40)


def test_draft_mode_for_large_jpegs(tmp_path):
    import simplejpeg

    big = _encode(_photo(1600, 1200), "JPEG")
    path = tmp_path / "big.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "a", "jpg": big})
    for reader, target in (
        (mmloader.ImageReader(path, size=140), (140, 186)),  # torchvision: int(140 * 1600 / 1200)
        (mmloader.ImageReader(path, size=(140, 190)), (140, 190)),
    ):
        small = reader[0]
        assert small.shape == (3, *target)
        # decoded at reduced DCT scale (1/8 here: 200x150 >= the target), then resized: exactly that
        reduced = torch.from_numpy(simplejpeg.decode_jpeg(big, min_height=target[0], min_width=target[1]))
        assert reduced.shape == (150, 200, 3)
        expect = torchvision_resize(reduced.permute(2, 0, 1), list(target), antialias=True)
        assert torch.equal(small, expect)
        full = torchvision_resize(decode_to_tensor(big), list(target), antialias=True)
        assert not torch.equal(small, full)  # which is not what a full decode gives
        assert (small.float() - full.float()).abs().mean() < 8  # but close to it


def test_decompression_bomb_raises_naming_key(tmp_path):
    # A PNG header claiming 100k x 100k pixels: refused from the header, before any decode.
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    import zlib

    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
    path = tmp_path / "bomb.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "the-bomb", "png": bomb})
    with pytest.raises(SizeLimitError, match="the-bomb") as e:
        mmloader.ImageReader(path, "png")[0]
    assert "max_pixels" in str(e.value)


def test_corrupt_jpeg_raises_decode_error_naming_key(tmp_path):
    path = tmp_path / "c.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "broken", "jpg": jpeg_bytes(3)[:150]})
    with pytest.raises(DecodeError, match="broken"):
        mmloader.ImageReader(path)[0]


def test_basic_readers(any_ds):
    assert mmloader.TextReader(any_ds)[4] == "caption number 4 é"
    assert mmloader.LabelReader(any_ds)[9] == 2
    assert mmloader.JSONReader(any_ds)[5] == {"i": 5, "tags": ["a", "b"]}
    arr = mmloader.ArrayReader(any_ds)[3]
    assert torch.equal(arr, torch.arange(3, dtype=torch.float32))
    upper = mmloader.TextReader(any_ds, transform=str.upper)
    assert upper.get("s00002") == "CAPTION NUMBER 2 É"
    assert len(upper) == 23 and upper.keys[1] == "s00001"


def test_array_reader_refuses_pickled_objects(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    path = tmp_path / "p.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "evil", "npy": buf.getvalue()})
    with pytest.raises(UnsafeFieldError, match="evil"):
        mmloader.ArrayReader(path)[0]


def test_reader_for_refuses_pickle_fields(lmdb_ds):
    with pytest.raises(UnsafeFieldError, match="pyd"):
        mmloader.reader_for(lmdb_ds, "pyd")
    assert isinstance(mmloader.reader_for(lmdb_ds, "jpg"), mmloader.ImageReader)


def test_custom_modality_without_editing_mmloader(any_ds):
    class LengthReader(mmloader.Reader):
        default_field = "txt"

        def decode(self, data, key):
            return len(data)

    assert LengthReader(any_ds)[0] == len("caption number 0 é".encode())
    assert mmloader.Reader(any_ds, "cls", decode=lambda b: int(b) * 10)[3] == 30


def test_readers_open_nothing_until_read(tmp_path):
    path = write_dataset(tmp_path / "lazy.lmdb", 3, "lmdb")
    from mmloader.storage.lmdb import store as lmdb_store

    before = set(lmdb_store._ENVS)
    reader = mmloader.ImageReader(path)
    assert set(lmdb_store._ENVS) == before
    reader[0]
    assert str(path.resolve()) in lmdb_store._ENVS
    # pickling after the environment is open carries no handle, and works
    clone = pickle.loads(pickle.dumps(reader))
    assert torch.equal(clone[1], reader[1])


def test_one_environment_per_path_shared_by_readers(lmdb_ds):
    a, b = mmloader.ImageReader(lmdb_ds), mmloader.TextReader(str(lmdb_ds))
    a[0], b[0]
    assert a.store._env is b.store._env


def test_textlines_reader(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("first\r\nsecond é\n\nfourth".encode())
    lines = mmloader.TextLinesReader(path, progress=False)
    assert len(lines) == 4 and list(lines) == ["first", "second é", "", "fourth"]
    assert lines.get("0000000001") == "second é"
    assert (tmp_path / "corpus.txt.lines.npy").exists()
    path.write_text("changed\n")  # the sidecar is rebuilt when the file changes
    assert list(mmloader.TextLinesReader(path, progress=False)) == ["changed"]


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


def test_zip_position_mismatch_detected_per_sample(tmp_path):
    # Same count and same fingerprint sample points, different key in between.
    n = 200
    a = _captions(tmp_path / "a.lmdb", [f"k{i:04d}" for i in range(n)])
    keys = [f"k{i:04d}" for i in range(n)]
    keys[102] = "zzzz"  # position 102 is not among the fingerprint's evenly spaced samples
    b = _captions(tmp_path / "b.lmdb", keys)
    ds = mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b))
    assert not ds.by_key
    assert ds[101]["y"] == "text of k0101"
    with pytest.raises(AlignmentError, match="zzzz"):
        ds[102]


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


def test_subclassed_readers_get_bytes_in_batches(any_ds):
    """Zero-copy views go only to built-in decoders: a subclass may call bytes methods."""

    class Upper(mmloader.TextReader):
        def decode(self, data, key):
            assert isinstance(data, bytes)
            return data.decode("utf-8").upper()

    ds = mmloader.zip(
        image=mmloader.ImageReader(any_ds, output="raw"), caption=Upper(any_ds), plain=mmloader.TextReader(any_ds)
    )
    # get_batch itself, not a Stream: a Stream would hide a failure by retrying sample by sample
    from mmloader.align.collate import collate_columns

    batch = collate_columns(ds.get_batch(list(range(6))))
    assert batch["caption"] == [c.upper() for c in batch["plain"]]
    assert batch["plain"][0] == "caption number 0 é"
    store = mmloader.open(any_ds)
    assert [bytes(t.numpy()) for t in mmloader.unpack(batch, "image")] == [
        store.get(k)["jpg"] for k in batch["__key__"]
    ]


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


# -- issue 13, defect 14: corrupt data that libjpeg only warns about is an error ----------------
def _half_jpeg() -> bytes:
    whole = jpeg_bytes(7, size=(256, 256))
    return whole[: len(whole) // 2] + b"\xff\xd9"  # second half gone, still ends with EOI


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"output": "pil"},
        {"size": 64},
        {"size": (64, 64)},
        {"mode": "L"},
        {"mode": "RGBA"},
        {"output": "pil", "size": 64},
    ],
)
def test_jpeg_missing_its_second_half_is_a_decode_error(tmp_path, options):
    path = tmp_path / "half.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "good", "jpg": jpeg_bytes(1, size=(256, 256))})
        w.write({"__key__": "halved", "jpg": _half_jpeg()})
    reader = mmloader.ImageReader(path, "jpg", **options)
    reader[0]
    with pytest.raises(DecodeError, match=r"(?s)premature end.*halved.*'jpg'"):
        reader[1]
    ds = mmloader.zip(image=reader)
    with pytest.raises(DecodeError, match="halved"):  # the whole-batch path reports it too
        ds.get_batch([0, 1])


def test_cmyk_jpeg_missing_its_second_half_is_a_decode_error():
    whole = CASES["cmyk-jpeg"]()
    with pytest.raises(DecodeError, match="premature end"):
        decode_to_tensor(whole[: len(whole) // 2] + b"\xff\xd9")


def test_verify_decode_reports_the_halved_jpeg(tmp_path):
    from mmloader.cli.verify import verify

    path = tmp_path / "half.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "halved", "jpg": _half_jpeg()})
    report = verify(path, decode=True, progress=False)
    assert not report.ok and "halved" in report.summary()


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


def test_reader_subclass_overriding_decode_is_used_for_whole_batches(tmp_path):
    """A subclass's decode() was bypassed by the batch fast paths of ImageReader (raw packing,
    decoding into the batch tensor) and ArrayReader: batches differed from reader[i]."""
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, (16, 12)), "npy": np.arange(3, dtype=np.int64) + i})

    class RawLength(mmloader.ImageReader):
        def decode(self, data, key):
            return torch.tensor([len(data)])

    class Blank(mmloader.ImageReader):
        def decode(self, data, key):
            return torch.zeros(1, 2, 2, dtype=torch.uint8)

    class Doubled(mmloader.ArrayReader):
        def decode(self, data, key):
            return super().decode(data, key) * 2

    for reader in (RawLength(path, output="raw"), Blank(path), Doubled(path)):
        batch = next(
            iter(
                mmloader.loader(
                    mmloader.Stream(mmloader.zip(x=reader), batch_size=6, shuffle=False), 1, backend="thread"
                )
            )
        )
        assert "x" not in batch.get("__offsets__", {})
        assert torch.equal(batch["x"], torch.stack([reader[i] for i in range(6)])), type(reader).__name__


def test_a_zero_byte_raw_image_is_reported_by_key_on_every_path(tmp_path):
    """reader[i] raised on a 0-byte image field while the raw batch path packed it as an empty
    image: an image is never 0 bytes (a truncated write), so both report it, naming the key."""
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "jpg": b"" if i == 1 else jpeg_bytes(i, (8, 8))})
    reader = mmloader.ImageReader(path, output="raw")
    with pytest.raises(DecodeError, match="0 bytes.*k1"):
        reader[1]
    stream = mmloader.Stream(mmloader.zip(x=reader), batch_size=4, shuffle=False)
    with pytest.raises(DecodeError, match="0 bytes.*k1"):
        next(iter(mmloader.loader(stream, 1, backend="thread")))
    skipping = mmloader.Stream(mmloader.zip(x=reader), batch_size=2, shuffle=False, errors="skip")
    keys = [k for b in mmloader.loader(skipping, 1, backend="thread") for k in b["__key__"]]
    assert "k1" not in keys and len(keys) == 4


def test_a_decode_assigned_on_a_reader_is_used_for_whole_batches(tmp_path):
    """decode replaced on one reader (not a subclass) was used by reader[i] but skipped by batches."""
    path = write_dataset(tmp_path / "d.lmdb", 4, "lmdb")
    reader = mmloader.TextReader(path)
    reader.decode = lambda data, key: bytes(data).decode().upper()
    stream = mmloader.Stream(mmloader.zip(t=reader), batch_size=4, shuffle=False)
    assert stream.python_work() == ["a decode assigned on the reader for 't'"]
    batch = next(iter(mmloader.loader(stream, 1, backend="thread")))
    assert batch["t"] == [reader[i] for i in range(4)] and batch["t"][0].isupper()
