"""Image decoding (mmloader/readers/image_decode.py): pixels equal to Pillow's, reduced-scale
(draft) decodes of large JPEGs, and libjpeg's warnings about corrupt data raised as errors."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import CASES, _encode, _half_jpeg, _photo, jpeg_bytes
from PIL import Image
from torchvision.transforms.v2.functional import resize as torchvision_resize

import mmloader
from mmloader.errors import DecodeError
from mmloader.readers.image_decode import decode_to_tensor, pil_to_tensor


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("case", list(CASES))
def test_decoded_pixels_equal_pillow(case, mode):
    data = CASES[case]()
    ours = decode_to_tensor(data, mode)
    ref = pil_to_tensor(Image.open(io.BytesIO(data)).convert(mode))
    assert ours.dtype == torch.uint8 and ours.shape == ref.shape
    assert torch.equal(ours, ref), f"{case}/{mode}: max diff {(ours.int() - ref.int()).abs().max()}"


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


# -- issue 13, defect 14: corrupt data that libjpeg only warns about is an error ----------------
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
