"""``mmloader.ToDevice``: a batch's tensors moved to the GPU, its uint8 images converted and
normalised there.

The fused CPU path can end in float32 (``ToDtype`` + ``Normalize`` in the reader's transform),
but a float32 224-px image is 602 KB against 150 KB of uint8 pixels: four times the memory
traffic in the producers, the hand-over and the host-to-device copy, and about 65 us of CPU
an image. Leave ``ToDtype``/``Normalize`` out of the reader (its batches are then uint8,
channels_last memory), wrap the loader in ``ToDevice``, and the conversion runs on the GPU in
one fused multiply-add per batch: what FFCV's ``ToDevice`` + ``NormalizeImage`` do.

Batch *n + 1* is moved (on a side CUDA stream) while the model trains on batch *n*, and the
state describes what the caller received (:mod:`.device_stage`). Without CUDA the same code
runs on the CPU, with the same arithmetic as the reader's own normalisation.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import torch

from ..readers.augment import parse_normalize
from ..readers.augment.spec import affine_factors, parse_dtype
from .device_stage import DeviceStage


class ToDevice(DeviceStage):
    """Wrap a loader; yield its batches on ``device``, the ``images`` converted to ``dtype`` and normalised.

    Args:
        loader: an mmloader loader whose ``images`` are uint8 ``(B, C, H, W)`` batches (an
            ``ImageReader`` with a crop or a fixed size, no float conversion) or ``(B, T, C, H, W)``
            clips (a ``VideoReader`` with a ``size``).
        device: default CUDA when available, else the CPU.
        images: the batch's image or clip fields (a name or names).
        dtype: their output dtype; None keeps uint8 (then no ``normalize``).
        normalize: ``"imagenet"``, ``(mean, std)`` or ``{"mean": [...], "std": [...]}`` in
            [0, 1] units (as ``ImageReader(normalize=...)``), or None (only ``/ 255``).
        channels_last: the images in channels_last memory (what convolutions on a GPU take
            fastest, and the layout the fused path already produces); clips keep the memory
            layout they come in (``(B, T, H, W, C)`` from a ``VideoReader``). False: plain
            contiguous.

    >>> loader = mmloader.loader(mmloader.Stream(mmloader.zip(image=mmloader.ImageReader(
    ...     "train/", crop=mmloader.Crop.random(224), flip=0.5)), batch_size=256))   # doctest: +SKIP
    >>> for batch in mmloader.ToDevice(loader, dtype=torch.bfloat16, normalize="imagenet"):  # doctest: +SKIP
    ...     model(batch["image"])
    """

    STAT = "to_device"

    def __init__(
        self,
        loader: Iterable,
        device: str | torch.device | None = None,
        *,
        images: str | Sequence[str] = "image",
        dtype: torch.dtype | str | None = torch.float32,
        normalize: Any = None,
        channels_last: bool = True,
    ):
        super().__init__(loader, device)
        self.images = (images,) if isinstance(images, str) else tuple(images)
        resolved = parse_dtype(dtype)
        if resolved is not None and not resolved.is_floating_point:
            raise ValueError(f"dtype={resolved}: expected a floating-point dtype, or None to keep uint8")
        if resolved is None and normalize is not None:
            raise ValueError("normalize needs a floating-point dtype (e.g. dtype=torch.bfloat16)")
        self.dtype, self.channels_last = resolved, channels_last
        self.mean_std = parse_normalize(normalize) if normalize is not None else None
        self._factors: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _process(self, batch: dict) -> dict:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"ToDevice: a batch is a {type(batch).__name__}, not a dict: it wraps mmloader's loaders "
                "(or any loader of dict batches)"
            )
        out = {k: _moved(v, self.device) for k, v in batch.items()}
        for name in self.images:
            if name in out:  # (a mix's batch in which no sample has the field lacks it)
                out[name] = self._blank_fillers(self.convert(out[name], name), out, name)
        return out

    @staticmethod
    def _blank_fillers(images: torch.Tensor, batch: dict, name: str) -> torch.Tensor:
        """Rows of samples without the image (a mix's other source) and the collate's padding
        stay 0, as the reader's own normalisation leaves them, not ``-mean / std``."""
        if images.dtype == torch.uint8:
            return images
        present = batch.get("__present__", {}).get(name)
        if present is not None and not bool(present.all()):
            images[~present.to(images.device)] = 0
        mask = batch.get("__mask__", {}).get(name)
        if mask is not None:
            mask = mask.to(images.device)
            while mask.dim() < images.dim():
                mask = mask.unsqueeze(1)
            images.masked_fill_(~mask, 0)
        return images

    def convert(self, pixels: Any, name: str = "image") -> torch.Tensor:
        """uint8 ``(B, C, H, W)`` images or ``(B, T, C, H, W)`` clips -> ``(pixels / 255 - mean) / std``
        in ``dtype``, on their device."""
        if not isinstance(pixels, torch.Tensor) or pixels.dim() not in (4, 5):
            raise ValueError(
                f"ToDevice: batch[{name!r}] is {_what(pixels)}, not a (B, C, H, W) or (B, T, C, H, W) batch: "
                "give the ImageReader a crop or a fixed size (the VideoReader a size) so that they stack"
            )
        if pixels.dtype != torch.uint8:
            raise ValueError(
                f"ToDevice: batch[{name!r}] is {pixels.dtype}, not uint8: leave ToDtype/Normalize (or "
                "normalize=/dtype=) out of the reader and let ToDevice convert on the device"
            )
        if pixels.dim() == 5:  # clips: channels-last is the (B, T, H, W, C) memory they batch in
            layout = torch.preserve_format if self.channels_last else torch.contiguous_format
        else:
            layout = torch.channels_last if self.channels_last else torch.contiguous_format
        if self.dtype is None:
            return pixels if layout == torch.preserve_format else pixels.contiguous(memory_format=layout)
        scale, offset = self._factor(int(pixels.shape[-3]), pixels.device, name)
        work = pixels.to(torch.float32, memory_format=layout)  # float32 arithmetic, as the reader's
        work = torch.addcmul(offset, work, scale, out=work) if self.mean_std else work.mul_(scale)
        return work if self.dtype == torch.float32 else work.to(self.dtype)

    def _factor(self, channels: int, device: torch.device, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel scale and offset (:func:`~mmloader.readers.augment.spec.affine_factors`), shaped
        (1, C, 1, 1), on ``device``."""
        key = (channels, device)
        if key not in self._factors:
            mean, std = self.mean_std or (None, None)
            if mean is not None and len(mean) not in (1, channels):
                raise ValueError(f"ToDevice: normalize has {len(mean)} channels, batch[{name!r}] has {channels}")
            factors = affine_factors(mean, std, channels, 1 / 255)
            self._factors[key] = tuple(  # type: ignore[assignment]
                torch.from_numpy(f).view(1, channels, 1, 1).to(device, torch.float32) for f in factors
            )
        return self._factors[key]


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {k: _moved(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_moved(v, device) for v in value)  # images of several sizes, documents
    return value


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, list):
        return f"a list of {len(value)} images of different sizes"
    return type(value).__name__
