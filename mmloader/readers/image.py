"""ImageReader: encoded images -> tensors, PIL images, or raw bytes for batched GPU decode."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ..storage import Store
from .base import Reader
from .image_decode import DEFAULT_MAX_PIXELS, MODES, decode_to_pil, decode_to_tensor, probe

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

    def from_column(self, datas: list[bytes | None], keys: list[str]) -> Any:
        if self.output == "tensor" and self.transform is None and not self.field.endswith(".gz") \
                and all(d is not None and len(d) <= self.max_field_bytes for d in datas):
            try:
                stacked = self._decode_into_batch(datas)
                if stacked is not None:
                    return stacked
            except Exception:
                pass  # redo sample by sample: the error must name its key
        if self.output != "raw" or self.transform is not None or self.field.endswith(".gz") \
                or any(d is None or len(d) > self.max_field_bytes for d in datas):
            return super().from_column(datas, keys)  # the per-sample path reports problems by key
        # Encoded bytes of the whole batch as one buffer: one copy, one tensor, one IPC segment.
        from ..batching import Packed
        lengths = torch.tensor([len(d) for d in datas], dtype=torch.int64)
        offsets = torch.zeros(len(datas) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return Packed(torch.frombuffer(bytearray().join(datas), dtype=torch.uint8) if datas
                      else torch.empty(0, dtype=torch.uint8), offsets)

    def _decode_into_batch(self, datas: list[bytes]) -> Any:
        """Decode straight into one (B, C, H, W) tensor when every image has one size: no stack copy."""
        from ..batching import Stacked
        if self.mode == "unchanged" or isinstance(self.size, int):
            return None
        shapes = {probe(d)[1:3] for d in datas}
        if len(shapes) != 1:
            return None
        w, h = shapes.pop()
        h, w = tuple(self.size) if self.size is not None else (h, w)
        out = torch.empty((len(datas), {"RGB": 3, "L": 1, "RGBA": 4}[self.mode], h, w), dtype=torch.uint8)
        for i, d in enumerate(datas):
            out[i].copy_(decode_to_tensor(d, self.mode, self.size, self.max_pixels))
        return Stacked(out)

    def decode(self, data: bytes, key: str) -> Any:
        if self.output == "raw":
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if self.output == "pil":
            return decode_to_pil(data, self.mode, self.size, self.max_pixels)
        return decode_to_tensor(data, self.mode, self.size, self.max_pixels)
