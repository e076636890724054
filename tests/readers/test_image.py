"""ImageReader (mmloader/readers/image.py): modes and outputs, and bad images refused naming the key."""

from __future__ import annotations

import struct

import pytest
import torch
from conftest import CASES, jpeg_bytes
from PIL import Image

import mmloader
from mmloader.errors import DecodeError, SizeLimitError


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
