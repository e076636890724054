"""``mmloader.GPUDecode``: decode a batch's JPEGs on the GPU (nvJPEG through torchvision).

Batches come from a loader over ``ImageReader(output="raw")``: the encoded bytes
of a batch arrive packed in one buffer (``batch[name]`` + ``batch["__offsets__"][name]``).
GPUDecode moves nothing but those bytes, decodes the whole batch with one call of
``torchvision.io.decode_jpeg(list, device="cuda")``, optionally resizes, crops,
flips and normalises on the GPU, converts the dtype, and hands the trainer a
ready ``(B, C, H, W)`` tensor. Batch *n + 1* is decoded ahead (on a side CUDA
stream) while the model trains on batch *n*; ``state_dict()`` describes what the
caller has received, not what was read ahead, so a resume never skips the batch
held. Non-JPEG images fall back to the CPU decoder for those items only. Without
CUDA the same code (read-ahead included) decodes on the CPU with the same decoder
as ``ImageReader`` (pixel-identical), so code and tests run anywhere.

Random crops and flips draw from a generator seeded by (stream seed, epoch, the
batch's keys): the same seed gives the same augmentations on either backend,
with any worker count, and after a resume.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from ..align.collate import unpack
from ..readers.image_decode import decode_to_tensor
from .device_stage import DeviceStage

_JPEG = b"\xff\xd8\xff"


class GPUDecode(DeviceStage):
    """Wrap a loader; yield its batches with ``name`` decoded on ``device``.

    ``size``: (h, w) resize (antialiased) of every image; ``crop``: (h, w) centre crop
    after it (random crop with ``random_crop=True``); ``flip``: random horizontal flip
    probability; ``mean``/``std``: per-channel normalisation in [0, 1] units; ``dtype``:
    output dtype (uint8 keeps pixels; float types scale to [0, 1] before normalising).

    >>> loader = mmloader.loader(mmloader.Stream(mmloader.zip(image=mmloader.ImageReader(
    ...     "train/", output="raw"), label=mmloader.LabelReader("train/")), batch_size=256))   # doctest: +SKIP
    >>> for batch in mmloader.GPUDecode(loader, size=(224, 224), dtype=torch.bfloat16,
    ...                                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):  # doctest: +SKIP
    ...     model(batch["image"])
    """

    STAT = "gpu_decode"

    def __init__(
        self,
        loader: Iterable,
        name: str = "image",
        device: str | torch.device | None = None,
        *,
        dtype: torch.dtype = torch.uint8,
        size: Sequence[int] | None = None,
        crop: Sequence[int] | None = None,
        random_crop: bool = False,
        flip: float = 0.0,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        mode: str = "RGB",
    ):
        super().__init__(loader, device)
        self.name = name
        self.dtype, self.size, self.crop, self.random_crop, self.flip = dtype, size, crop, random_crop, flip
        self.mean, self.std, self.channels_last, self.mode = mean, std, channels_last, mode
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and not dtype.is_floating_point:
            raise ValueError("normalising needs a floating dtype (e.g. torch.bfloat16)")

    def _generator(self, batch: dict) -> torch.Generator:
        """Per-batch randomness from (seed, epoch, keys): independent of backend, workers and resume."""
        stream = getattr(self.loader, "stream", None)
        h = hashlib.blake2b(digest_size=8)
        h.update(f"{getattr(stream, 'seed', 0)}/{getattr(stream, 'epoch', 0)}/".encode())
        for key in batch.get("__key__", ()):
            h.update(str(key).encode() + b"\0")
        return torch.Generator().manual_seed(int.from_bytes(h.digest(), "little") >> 1)

    # -- decoding -------------------------------------------------------------------------------
    def decode_images(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        """uint8 CHW images on ``self.device``; JPEGs batched through nvJPEG, the rest on the CPU."""
        tv_mode = {"RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY}[self.mode]
        out: list[torch.Tensor | None] = [None] * len(encoded)
        jpeg = [i for i, t in enumerate(encoded) if bytes(t[:3].tolist()) == _JPEG]
        if jpeg and self.device.type == "cuda":
            try:
                decoded = decode_jpeg([encoded[i] for i in jpeg], mode=tv_mode, device=self.device)
                for i, image in zip(jpeg, decoded):
                    out[i] = image
            except RuntimeError:
                pass  # e.g. a CMYK or corrupt JPEG in the batch: those go through the CPU path below
        for i, t in enumerate(encoded):
            if out[i] is None:  # CPU: the same decoder (and errors) as ImageReader
                out[i] = decode_to_tensor(t.numpy().tobytes(), self.mode).to(self.device, non_blocking=True)
        return out  # type: ignore[return-value]

    def transform(self, images: list[torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        generator = generator or torch.Generator().manual_seed(0)
        if self.size is not None:
            images = [F.resize(im, list(self.size), antialias=True) for im in images]
        if self.crop is not None:
            h, w = self.crop
            if self.random_crop:
                cropped = []
                for im in images:
                    top = int(torch.randint(0, im.shape[-2] - h + 1, (1,), generator=generator))
                    left = int(torch.randint(0, im.shape[-1] - w + 1, (1,), generator=generator))
                    cropped.append(im[..., top : top + h, left : left + w])
                images = cropped
            else:
                images = [F.center_crop(im, [h, w]) for im in images]
        if len({tuple(im.shape) for im in images}) != 1:
            raise ValueError(
                f"images in a batch differ in size {sorted({tuple(im.shape) for im in images})}; "
                "give GPUDecode(size=...) or crop=... to batch them"
            )
        batch = torch.stack(images)
        if self.flip:
            flip = (torch.rand(len(images), generator=generator) < self.flip).to(batch.device)
            batch = torch.where(flip[:, None, None, None], batch.flip(-1), batch)
        if self.dtype.is_floating_point:
            batch = batch.to(self.dtype).div_(255)
            if self.mean is not None:
                mean = torch.tensor(self.mean, dtype=self.dtype, device=batch.device)[None, :, None, None]
                std = torch.tensor(self.std, dtype=self.dtype, device=batch.device)[None, :, None, None]
                batch = batch.sub_(mean).div_(std)
        if self.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch

    def _process(self, batch: dict) -> dict:
        if self.name not in batch:  # a mix's batch in which no sample has the modality
            return batch
        encoded = unpack(batch, self.name)  # views of one (pinned, with CUDA) buffer: no copies
        out = dict(batch)
        present = batch.get("__present__", {}).get(self.name)
        if present is None or bool(present.all()):
            out[self.name] = self.transform(self.decode_images(encoded), self._generator(batch))
        else:  # a mix whose other source has no image: its rows are zeros, as the default collate's
            out[self.name] = self._with_absent_rows(encoded, present.tolist(), self._generator(batch))
        offsets = dict(out.get("__offsets__", {}))
        offsets.pop(self.name, None)
        out["__offsets__"] = offsets
        if not offsets:
            del out["__offsets__"]
        return out

    def _with_absent_rows(
        self, encoded: list[torch.Tensor], present: list[bool], generator: torch.Generator
    ) -> torch.Tensor:
        rows = [i for i, here in enumerate(present) if here]  # some: a batch without any lacks the name
        decoded = self.transform(self.decode_images([encoded[i] for i in rows]), generator)
        out = decoded.new_zeros((len(encoded), *decoded.shape[1:]))
        out[rows] = decoded
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out
