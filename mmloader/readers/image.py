"""ImageReader: encoded images -> tensors, PIL images, or raw bytes for batched GPU decode."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ..storage import Store
from .base import Reader
from .image_decode import DEFAULT_MAX_PIXELS, MODES, decode_to_pil, decode_to_tensor


class ImageReader(Reader):
    """An image field, decoded lazily.

    ``decode="tensor"`` -> uint8 CHW tensor; ``"pil"`` -> PIL image; ``"raw"`` -> the
    encoded bytes as a 1-D uint8 tensor (for :class:`mmloader.GPUDecode`).
    ``mode`` is ``"RGB"`` (default), ``"L"``, ``"RGBA"`` or ``"unchanged"``;
    grayscale, CMYK, palette and alpha images are converted as asked. ``size``
    (torchvision ``Resize`` semantics) decodes large JPEGs at reduced DCT scale
    first, then resizes.

    >>> images = ImageReader("pairs.lmdb", field="jpg", size=224)   # doctest: +SKIP
    >>> images[0].shape                                              # doctest: +SKIP
    torch.Size([3, 224, 298])
    """

    default_field = "jpg"

    def __init__(self, source: str | os.PathLike | Store, field: str | None = None, *,
                 decode: str = "tensor", mode: str = "RGB", size: int | tuple[int, int] | None = None,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 transform: Callable[[Any], Any] | None = None, **kwargs):
        if decode not in ("tensor", "pil", "raw"):
            raise ValueError(f"decode={decode!r}: expected 'tensor', 'pil' or 'raw'")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        super().__init__(source, field, transform=transform, **kwargs)
        self.output, self.mode, self.size, self.max_pixels = decode, mode, size, max_pixels

    def decode(self, data: bytes, key: str) -> Any:
        if self.output == "raw":
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if self.output == "pil":
            return decode_to_pil(data, self.mode, self.size, self.max_pixels)
        return decode_to_tensor(data, self.mode, self.size, self.max_pixels)
