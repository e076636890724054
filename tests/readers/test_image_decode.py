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


# -- the partial decoder of fused random crops (mmloader/readers/_jpegcrop.c) ---------------------
def _subsampled(subsampling: int | None, progressive: bool = False, size=(203, 157)) -> bytes:
    im = _photo(*size)
    if subsampling is None:
        return _encode(im.convert("L"), "JPEG", quality=90)
    return _encode(im, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)


def test_the_partial_decoder_is_built_where_libjpegs_headers_are():
    """setup.py builds it wherever it can (an optional extension); CI's machines have the headers,
    so a build that silently failed there fails here."""
    import pathlib

    from mmloader.readers import image_decode

    if not pathlib.Path("/usr/include/jpeglib.h").exists():
        pytest.skip("no libjpeg headers on this machine: random crops decode whole images here")
    assert image_decode._decode_crop is not None


@pytest.mark.parametrize("eighths", [8, 5, 4, 2])
@pytest.mark.parametrize("kind", ["444", "422", "420", "420-progressive", "gray", "420-restart"])
def test_a_box_decoded_alone_equals_the_same_box_of_a_full_decode(kind, eighths):
    """Every box, including those touching each edge and iMCU boundaries, gives the pixels the
    full decode at the same DCT scale gives there (the fused crop's exactness rests on it)."""
    import numpy as np
    import simplejpeg

    from mmloader.media.imageinfo import probe
    from mmloader.readers.image_decode import _decode_crop, jpeg_box

    if _decode_crop is None:
        pytest.skip("partial decoder not built")
    if kind == "420-restart":
        buf = io.BytesIO()
        _photo(203, 157).save(buf, "JPEG", quality=90, restart_marker_blocks=2)
        data = buf.getvalue()
    else:
        sub = {"444": 0, "422": 1, "420": 2, "420-progressive": 2, "gray": None}[kind]
        data = _subsampled(sub, progressive=kind.endswith("progressive"))
    info = probe(data)
    full = simplejpeg.decode_jpeg(data, "RGB", min_height=-(-157 * eighths // 8), min_width=-(-203 * eighths // 8))
    dh, dw = full.shape[:2]
    assert (dh, dw) == (-(-157 * eighths // 8), -(-203 * eighths // 8))
    rng = np.random.default_rng(eighths)
    boxes = [(0, 0, dh, dw), (0, 0, 1, 1), (dh - 1, dw - 1, 1, 1), (16, 16, 16, 16), (0, dw - 17, dh, 17)]
    for _ in range(60):
        top, left = int(rng.integers(0, dh)), int(rng.integers(0, dw))
        boxes.append((top, left, int(rng.integers(1, dh - top + 1)), int(rng.integers(1, dw - left + 1))))
    for top, left, h, w in boxes:
        part = jpeg_box(data, info, "RGB", eighths, (top, left, h, w))
        assert part is not None and part.shape == (h, w, 3)
        assert np.array_equal(part, full[top : top + h, left : left + w]), (kind, eighths, (top, left, h, w))


def test_a_truncated_jpeg_is_not_cropped_around_its_missing_part():
    """The box above the missing half decodes fine, yet the partial decoder refuses the image
    (the rows under the box are still entropy-decoded and checked), and the fused crop raises."""
    import numpy as np

    from mmloader.media.imageinfo import probe
    from mmloader.readers.augment import Augment, Crop, augment_column
    from mmloader.readers.image_decode import _decode_crop, jpeg_box

    if _decode_crop is None:
        pytest.skip("partial decoder not built")
    half = _half_jpeg()
    assert jpeg_box(half, probe(half), "RGB", 8, (0, 0, 16, 256)) is None
    assert jpeg_box(b"\xff\xd8\xff\xe0 not a jpeg", probe(jpeg_bytes(1)), "RGB", 8, (0, 0, 4, 4)) is None
    aug = Augment(crop=Crop.random(32, scale=(0.05, 0.06)))
    with pytest.raises(DecodeError, match="premature end"):
        augment_column([half], aug, "RGB", None, np.random.default_rng(0))
