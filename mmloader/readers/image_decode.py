"""Image decoding: simplejpeg (libjpeg-turbo) for JPEGs, torchvision's libpng for PNGs,
Pillow for the rest.

simplejpeg was measured here at 282 us per 256-px photo against torchvision's
338 us, releases the GIL, and can decode straight into a caller's buffer (so a
batch needs no stack copy); its pixels equal Pillow's (tested). torchvision stays
the fallback (and the GPU path, nvJPEG).

Every path checks the pixel count from the header (``mmloader.imageinfo``) *before*
decoding, so a decompression bomb costs a header parse, not gigabytes.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image
# Imported here, not at first decode: a forked DataLoader worker would otherwise pay for the
# import (about a second) on its first image.
from torchvision.io import ImageReadMode, decode_jpeg, decode_png
from torchvision.transforms.v2.functional import resize

try:
    import simplejpeg
except ImportError:  # optional at run time: torchvision decodes then
    simplejpeg = None

from ..errors import DecodeError
from ..imageinfo import DEFAULT_MAX_PIXELS, ImageInfo, check_pixels, probe

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec; they remain the
# fastest CPU JPEG path measured here, so keep using them without warning every user.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

MODES = ("RGB", "L", "RGBA", "unchanged")


def target_hw(size: int | tuple[int, int], height: int, width: int) -> tuple[int, int]:
    """torchvision ``Resize`` semantics: an int sets the shorter side, a pair is (h, w)."""
    if isinstance(size, int):
        if height <= width:
            return size, max(1, round(width * size / height))
        return max(1, round(height * size / width)), size
    return int(size[0]), int(size[1])


def _pil_open(data: bytes, mode: str, draft_hw: tuple[int, int] | None = None) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = Image.open(io.BytesIO(data))
        if draft_hw is not None and im.format == "JPEG":
            # Decode at 1/2, 1/4 or 1/8 DCT scale while staying >= the target: far less work.
            im.draft("RGB" if mode != "L" else "L", (draft_hw[1], draft_hw[0]))
        im.load()
    if mode == "unchanged":
        return im
    if mode == "RGB" and im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info
                                                              and mode == "RGB"):
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


def jpeg_into(data: bytes, info: ImageInfo, mode: str, out: np.ndarray | None = None) -> np.ndarray | None:
    """Decode a baseline/progressive RGB or grayscale JPEG to HWC uint8 (into ``out`` if given)
    with simplejpeg; None when this path does not apply (CMYK, colour -> "L", no simplejpeg)."""
    if simplejpeg is None or info.format != "jpeg" or info.components not in (1, 3):
        return None
    if mode == "RGB":
        colorspace = "rgb"
    elif mode == "L" and info.components == 1:
        colorspace = "gray"
    else:
        return None
    try:
        return simplejpeg.decode_jpeg(data, colorspace=colorspace, buffer=out)
    except ValueError:
        return None  # let the other decoders try, and report their error if they fail too


def decode_to_tensor(data: bytes, mode: str = "RGB", size: int | tuple[int, int] | None = None,
                     max_pixels: int | None = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """Encoded image -> uint8 CHW tensor in ``mode`` (optionally resized to ``size``)."""
    info = probe(data)
    check_pixels(info, max_pixels)
    target = target_hw(size, info.height, info.width) if size is not None else None
    tv_mode = {"RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY, "RGBA": ImageReadMode.RGB_ALPHA,
               "unchanged": ImageReadMode.UNCHANGED}[mode]
    image = None
    draft = (target is not None and info.format == "jpeg"
             and info.height >= 2 * target[0] and info.width >= 2 * target[1])
    # Colour -> "L": decode RGB and apply Pillow's luma formula, so pixels equal Pillow's
    # (libjpeg's own grayscale output is the raw Y channel, which differs by a few levels).
    to_luma = mode == "L" and info.components == 3
    if to_luma:
        tv_mode = ImageReadMode.RGB
    if target is None:
        hwc = jpeg_into(data, info, mode)
        if hwc is not None:
            image = torch.from_numpy(hwc).permute(2, 0, 1)
    if image is None and info.format == "jpeg" and info.components in (1, 3) and mode != "RGBA" and not draft:
        try:
            image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=tv_mode)
        except RuntimeError:
            image = None  # let Pillow try, and report its error if it fails too
    elif image is None and info.format == "png" and info.components in (1, 3) and mode in ("RGB", "L", "unchanged"):
        try:
            image = decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=tv_mode)
        except RuntimeError:
            image = None
    if image is not None and to_luma:
        image = rgb_to_luma(image)
    if image is None:
        # CMYK JPEGs, alpha/palette PNGs, WebP, GIF, BMP, TIFF...: Pillow converts as asked.
        try:
            image = pil_to_tensor(_pil_open(data, mode, target if draft else None))
        except Exception as e:
            raise DecodeError(f"cannot decode {info.format} image: {e}") from None
    if target is not None and tuple(image.shape[-2:]) != target:
        image = resize(image, list(target), antialias=True)
    return image


def decode_to_pil(data: bytes, mode: str = "RGB", size: int | tuple[int, int] | None = None,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    info = probe(data)
    check_pixels(info, max_pixels)
    target = target_hw(size, info.height, info.width) if size is not None else None
    try:
        im = _pil_open(data, mode, target)
    except Exception as e:
        raise DecodeError(f"cannot decode {info.format} image: {e}") from None
    if target is not None and (im.height, im.width) != target:
        im = im.resize((target[1], target[0]), Image.BILINEAR)
    return im
