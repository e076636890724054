"""Image decoding: simplejpeg (libjpeg-turbo) for JPEGs, torchvision's libpng for PNGs,
Pillow for the rest.

simplejpeg was measured here at 282 us per 256-px photo against torchvision's
338 us, releases the GIL, and can decode straight into a caller's buffer (so a
batch needs no stack copy); its pixels equal Pillow's (tested). It is also the
only JPEG decoder here that reports libjpeg's *recoverable* errors ("Corrupt
JPEG data: premature end of data segment"): torchvision and Pillow print them on
stderr and return a gray or garbled image. Every JPEG therefore goes through it
in strict mode, and such an image is a :class:`DecodeError`, never passed on.

Every path checks the pixel count from the header (``mmloader.media.imageinfo``) *before*
decoding, so a decompression bomb costs a header parse, not gigabytes.
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import simplejpeg
import torch
from PIL import Image

from ..errors import DecodeError
from ..media.imageinfo import DEFAULT_MAX_PIXELS, ImageInfo, check_pixels, probe

try:  # the optional compiled partial decoder (setup.py): absent, boxes come from full decodes
    from ._jpegcrop import decode_crop as _decode_crop
except ImportError:  # pragma: no cover - built wherever libjpeg's headers are
    _decode_crop = None
_said_unbuilt = False

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec; they remain the
# PNG path (and nvJPEG on GPUs), so keep using them without warning every user.
warnings.filterwarnings(
    "ignore", message="The image decoding and encoding capabilities of TorchVision", category=DeprecationWarning
)

MODES = ("RGB", "L", "RGBA", "unchanged")


def import_torchvision() -> None:
    """Import what PNG decoding and resizing to tensors call, now: torchvision takes 1.5 s of CPU
    to import (its models pull in ``torch._dynamo``). A reader that decodes to tensors calls
    this where it is made, so forked DataLoader workers inherit the import rather than each pay
    for it on its first image; a process that reads no image (text, arrays, the CLI) never does."""
    import torchvision.io  # noqa: F401
    import torchvision.transforms.v2.functional  # noqa: F401


def target_hw(size: int | tuple[int, int], height: int, width: int) -> tuple[int, int]:
    """torchvision ``Resize`` semantics: an int sets the shorter side (the longer one truncated,
    as torchvision computes it), a pair is (h, w).

    >>> target_hw(224, 375, 500), target_hw(224, 500, 333)
    ((224, 298), (336, 224))
    """
    if isinstance(size, int):
        if width <= height:
            return max(1, int(size * height / width)), size
        return size, max(1, int(size * width / height))
    return int(size[0]), int(size[1])


def _pil_open(data: bytes, mode: str, draft_hw: tuple[int, int] | None = None) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im: Image.Image = Image.open(io.BytesIO(data))
        if draft_hw is not None and im.format == "JPEG":
            # Decode at 1/2, 1/4 or 1/8 DCT scale while staying >= the target: far less work.
            im.draft("RGB" if mode != "L" else "L", (draft_hw[1], draft_hw[0]))
        im.load()
    if mode == "unchanged":
        return im
    if (
        mode == "RGB"
        and im.mode in ("RGBA", "LA", "PA")
        or (im.mode == "P" and "transparency" in im.info and mode == "RGB")
    ):
        im = im.convert("RGBA")
    return im.convert(mode) if im.mode != mode else im


def pil_to_tensor(im: Image.Image) -> torch.Tensor:
    array = np.array(im)  # a writable copy: torch warns about read-only buffers
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1).contiguous()


def rgb_to_luma(image: torch.Tensor) -> torch.Tensor:
    """uint8 RGB CHW -> 1HW with Pillow's integer ITU-R 601-2 formula (bit-exact with ``convert("L")``)."""
    r, g, b = image.to(torch.int32).unbind(0)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).to(torch.uint8).unsqueeze(0)


def _simplejpeg(
    data, colorspace: str, out: np.ndarray | None = None, min_hw: tuple[int, int] | None = None
) -> np.ndarray:
    """simplejpeg in strict mode: a recoverable libjpeg error (truncated or corrupt data) raises."""
    try:
        if min_hw is not None:
            return simplejpeg.decode_jpeg(
                data, colorspace=colorspace, strict=True, min_height=min_hw[0], min_width=min_hw[1]
            )
        return simplejpeg.decode_jpeg(data, colorspace=colorspace, buffer=out, strict=True)
    except ValueError as e:
        raise DecodeError(f"corrupt JPEG: {e}") from None


def jpeg_into(
    data, info: ImageInfo, mode: str, out: np.ndarray | None = None, min_hw: tuple[int, int] | None = None
) -> np.ndarray | None:
    """Decode an RGB or grayscale JPEG to HWC uint8 in ``mode`` (into ``out`` if given; at the
    smallest DCT scale >= ``min_hw`` if given). None when this path does not apply (CMYK,
    colour -> "L", which needs Pillow's luma formula). Corrupt data raises :class:`DecodeError`."""
    if info.format != "jpeg" or info.components not in (1, 3):
        return None
    if mode == "RGB":
        return _simplejpeg(data, "RGB", out, min_hw)
    if mode == "RGBA":
        return _simplejpeg(data, "RGBA", out, min_hw)
    if mode in ("L", "unchanged") and info.components == 1:
        return _simplejpeg(data, "GRAY", out, min_hw)
    if mode == "unchanged":
        return _simplejpeg(data, "RGB", out, min_hw)
    return None


def dct_eighths_for(info: ImageInfo, min_hw: tuple[int, int] | None) -> int:
    """The ``M`` of the smallest M/8 DCT scale whose image (``ceil(side * M / 8)`` a side) is
    at least ``min_hw``: the scale simplejpeg's ``min_height``/``min_width`` pick.

    >>> dct_eighths_for(ImageInfo("jpeg", 480, 640, 3), (100, 100)), dct_eighths_for(ImageInfo("jpeg", 480, 640, 3), None)
    (2, 8)
    """
    if min_hw is None:
        return 8

    def size(m: int) -> tuple[int, int]:
        return -(-info.height * m // 8), -(-info.width * m // 8)

    for m in range(1, 8):
        if size(m)[0] >= min_hw[0] and size(m)[1] >= min_hw[1]:
            while m < 8 and size(m + 1) == size(m):  # a tiny image: of equal sizes, the larger scale
                m += 1
            return m
    return 8


def jpeg_box(data, info: ImageInfo, mode: str, eighths: int, box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The ``box`` (top, left, h, w, in pixels of the ``eighths``/8 scale) of an RGB JPEG as HWC
    uint8, decoding only what it needs: no row below it, no iMCU column outside it (libjpeg-turbo's
    partial decode; the same pixels as cutting the box out of a full decode). None where this
    does not apply (the decoder not built, another mode, CMYK) or the data is corrupt: the caller's
    full, strict decode then says what is wrong."""
    if _decode_crop is None:
        _say_unbuilt()
        return None
    if mode != "RGB" or info.format != "jpeg" or info.components not in (1, 3):
        return None
    top, left, h, w = box
    out = np.empty((h, w, 3), dtype=np.uint8)
    try:
        _decode_crop(data, eighths, top, left, h, w, out)
    except ValueError:
        return None
    return out


def _say_unbuilt() -> None:
    """Once per process: the install could not build the partial decoder (pip says so only with -v)."""
    global _said_unbuilt
    if not _said_unbuilt:
        _said_unbuilt = True
        logging.getLogger("mmloader").warning(
            "mmloader: the partial JPEG decoder (mmloader.readers._jpegcrop) was not built, so random crops "
            "decode whole images (same pixels, ~20% more decode time): install libjpeg-turbo's headers "
            "(Debian/Ubuntu: libjpeg-turbo8-dev or libjpeg62-turbo-dev) and a C compiler, then reinstall mmloader"
        )


def _draft_hw(info: ImageInfo, target: tuple[int, int] | None) -> tuple[int, int] | None:
    """The size to decode a JPEG at before resizing to ``target``: libjpeg decodes at 1/2, 1/4
    or 1/8 scale (far less work) while staying >= the target."""
    if target is None or info.format != "jpeg" or info.height < 2 * target[0] or info.width < 2 * target[1]:
        return None
    return target


def decode_to_tensor(
    data, mode: str = "RGB", size: int | tuple[int, int] | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> torch.Tensor:
    """Encoded image -> uint8 CHW tensor in ``mode`` (optionally resized to ``size``)."""
    info = probe(data)
    check_pixels(info, max_pixels)
    target = target_hw(size, info.height, info.width) if size is not None else None
    draft = _draft_hw(info, target)
    image = None
    if info.format == "jpeg":
        # Colour -> "L" decodes RGB and applies Pillow's luma formula, so pixels equal Pillow's
        # (libjpeg's own grayscale output is the raw Y channel, which differs by a few levels).
        to_luma = mode == "L" and info.components == 3
        hwc = jpeg_into(data, info, "RGB" if to_luma else mode, min_hw=draft)
        if hwc is not None:
            image = torch.from_numpy(hwc).permute(2, 0, 1)
            if to_luma:
                image = rgb_to_luma(image)
        else:  # CMYK: strict decode to find corrupt data, then Pillow's colour conversion
            _simplejpeg(data, "CMYK" if info.components == 4 else "RGB", min_hw=draft)
    elif info.format == "png" and info.components in (1, 3) and mode in ("RGB", "L", "unchanged"):
        from torchvision.io import ImageReadMode, decode_png  # on first use: torchvision takes 1.5 s to import

        to_luma = mode == "L" and info.components == 3
        tv_mode = (
            ImageReadMode.RGB
            if to_luma
            else {"RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY, "unchanged": ImageReadMode.UNCHANGED}[mode]
        )
        try:
            image = decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=tv_mode)
        except RuntimeError:
            image = None  # let Pillow try, and report its error if it fails too
        if image is not None and to_luma:
            image = rgb_to_luma(image)
    if image is None:
        # CMYK JPEGs, alpha/palette PNGs, WebP, BMP, TIFF...: Pillow converts as asked.
        try:
            image = pil_to_tensor(_pil_open(data, mode, draft))
        except Exception as e:
            raise DecodeError(f"cannot decode {info.format} image: {e}") from None
    if target is not None and tuple(image.shape[-2:]) != target:
        from torchvision.transforms.v2.functional import resize

        image = resize(image, list(target), antialias=True)
    return image


def decode_to_pil(
    data, mode: str = "RGB", size: int | tuple[int, int] | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> Image.Image:
    info = probe(data)
    check_pixels(info, max_pixels)
    target = target_hw(size, info.height, info.width) if size is not None else None
    draft = _draft_hw(info, target)
    hwc = jpeg_into(data, info, mode, min_hw=draft) if mode in ("RGB", "L") else None
    if hwc is not None:
        im = Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc, "L" if hwc.shape[2] == 1 else "RGB")
    else:
        if info.format == "jpeg":  # strict decode first: Pillow passes corrupt data on silently
            _simplejpeg(data, "CMYK" if info.components == 4 else "RGB", min_hw=draft)
        try:
            im = _pil_open(data, mode, draft)
        except Exception as e:
            raise DecodeError(f"cannot decode {info.format} image: {e}") from None
    if target is not None and (im.height, im.width) != target:
        im = im.resize((target[1], target[0]), Image.Resampling.BILINEAR)
    return im
