"""Image format and size from the header alone: cheap, and free of torch (converters use it).

Every decode path checks the pixel count from here *before* decoding, so a
decompression bomb costs a header parse, not gigabytes.
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import NamedTuple

from PIL import Image

from ..errors import DecodeError, SizeLimitError

#: Field names (file extensions, lower case) that hold images: the one list readers and converters
#: share; the same set as torchvision's ``ImageFolder``, so an imagefolder conversion finds the same files.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
#: Spellings of one format, folded to one field name so a dataset has one image field per format.
_CANONICAL = {"jpeg": "jpg", "jpe": "jpg", "jfif": "jpg", "tiff": "tif"}


def canonical_extension(ext: str) -> str:
    """The field name for a file extension: lower case, one spelling per format
    (``JPEG``, ``jpeg``, ``JPG`` -> ``jpg``; ``tiff`` -> ``tif``).

    >>> canonical_extension("JPEG"), canonical_extension("png"), canonical_extension("txt.gz")
    ('jpg', 'png', 'txt.gz')
    """
    ext = ext.lower()
    return _CANONICAL.get(ext, ext)


#: Default decoded-pixel ceiling (about 12k x 12k); raise it per reader when needed.
DEFAULT_MAX_PIXELS = 150_000_000

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class ImageInfo(NamedTuple):
    format: str  # "jpeg", "png" or Pillow's format name
    width: int
    height: int
    components: int  # colour channels in the file (JPEG/PNG), 0 if unknown


def probe(data: bytes) -> ImageInfo:
    """Format and size from the header only."""
    if data[:3] == b"\xff\xd8\xff":
        i, n = 2, len(data)
        while i + 9 < n:
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker == 0xFF:
                i += 1
                continue
            if marker in _SOF:
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return ImageInfo("jpeg", w, h, data[i + 9] if i + 9 < n else 0)
            if marker == 0xDA:  # start of scan before any frame header: malformed
                break
            i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
        raise DecodeError("JPEG without a frame header (truncated or corrupt)")
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26:
        w, h = struct.unpack(">II", data[16:24])
        colour = data[25]
        return ImageInfo("png", w, h, {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour, 0))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                return ImageInfo((im.format or "?").lower(), im.width, im.height, 0)
    except Image.DecompressionBombError as e:
        raise SizeLimitError(f"image too large: {e}") from None
    except Exception:
        raise DecodeError(
            f"not a readable image (unknown format or corrupt header; first bytes "
            f"{bytes(data[:8])!r}, {len(data)} bytes)"
        ) from None


def check_pixels(info: ImageInfo, max_pixels: int | None) -> None:
    if max_pixels and info.width * info.height > max_pixels:
        raise SizeLimitError(
            f"{info.format} image of {info.width}x{info.height} pixels exceeds "
            f"max_pixels={max_pixels} (decompression-bomb guard)"
        )


def check_decodes(data: bytes, info: ImageInfo | None = None) -> ImageInfo:
    """Decode the whole image once, strictly, and raise :class:`DecodeError` if it is corrupt.

    JPEGs go through libjpeg-turbo (simplejpeg) in strict mode, where data libjpeg only warns
    about (a file whose second half is gone but still ends with an end-of-image marker) is an
    error; Pillow would return a gray-filled image. Other formats are decoded by Pillow, which
    refuses truncated files. Torch-free: the converters use it for ``--check-decode``.
    """
    info = info or probe(data)
    if info.format == "jpeg":
        import simplejpeg

        colorspace = {1: "GRAY", 4: "CMYK"}.get(info.components, "RGB")
        try:
            simplejpeg.decode_jpeg(data, colorspace=colorspace, strict=True)
        except ValueError as e:
            raise DecodeError(f"corrupt JPEG: {e}") from None
        return info
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                im.load()
    except Exception as e:
        raise DecodeError(f"cannot decode {info.format} image: {e}") from None
    return info
