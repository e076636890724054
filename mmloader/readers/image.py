"""ImageReader: encoded images -> tensors, PIL images, or raw bytes for batched GPU decode."""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Any, Callable, Sequence, cast

import torch

from ..errors import DecodeError
from ..media.imageinfo import IMAGE_EXTENSIONS
from ..storage import Store
from .augment import Augment, Crop, Split, augment_column, augment_image, native_augment, split_transform
from .augment.fused import CHANNELS
from .base import Reader, accepts_views, as_bytes
from .columns import Packed, Stacked, batch_buffer, concat_bytes, offsets_of, per_sample
from .image_decode import (
    DEFAULT_MAX_PIXELS,
    MODES,
    check_pixels,
    decode_to_pil,
    decode_to_tensor,
    import_torchvision,
    jpeg_into,
    probe,
)
from .seeding import rng

log = logging.getLogger("mmloader")

OUTPUTS = ("tensor", "pil", "raw")


class ImageReader(Reader):
    """An image field, decoded lazily.

    ``output="tensor"`` -> uint8 CHW tensor; ``"pil"`` -> PIL image; ``"raw"`` -> the
    encoded bytes as a 1-D uint8 tensor (for :class:`mmloader.GPUDecode`).
    ``mode`` is ``"RGB"`` (default), ``"L"``, ``"RGBA"`` or ``"unchanged"``;
    grayscale, CMYK, palette and alpha images are converted as asked. ``size``
    (torchvision ``Resize`` semantics) decodes large JPEGs at reduced DCT scale
    first, then resizes. ``decode=`` takes a callable, as on every reader.

    Augmentation runs fused, in C, once per batch where it can (decode, crop, resize and flip
    into the batch tensor, then one dtype conversion and normalisation for the whole batch):
    give a torchvision ``Compose`` as ``transform=`` (its recognised prefix is fused, the rest
    runs per sample after it; see :mod:`mmloader.readers.augment.recognise`), or the native
    options ``crop=``, ``flip=``, ``normalize=``, ``dtype=``.

    Without ``field``, the store's image fields are read as alternatives (``"jpg;png"``:
    each sample decodes whichever it has), so a dataset that mixes formats needs no option.

    >>> images = ImageReader("pairs.lmdb", "jpg", size=224)         # doctest: +SKIP
    >>> images[0].shape                                              # doctest: +SKIP
    torch.Size([3, 224, 298])
    """

    default_field = "jpg"
    field_extensions = IMAGE_EXTENSIONS

    def __init__(
        self,
        source: str | os.PathLike | Store | None,
        field: str | None = None,
        *,
        output: str = "tensor",
        mode: str = "RGB",
        size: int | tuple[int, int] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        transform: Callable[[Any], Any] | None = None,
        decode: Any = None,
        crop: Crop | dict | None = None,
        flip: float = 0.0,
        normalize: Any = None,
        dtype: torch.dtype | str | None = None,
        **kwargs,
    ):
        """
        Args:
            source: the dataset (path, URL or open store); None: no store, the reader decodes the
                values handed to it (a live source's, a document's images).
            field: the image field; None reads every image field the dataset has, as alternatives.
            output: ``"tensor"``, ``"pil"`` or ``"raw"``.
            mode: ``"RGB"``, ``"L"``, ``"RGBA"`` or ``"unchanged"``.
            size: resize (torchvision ``Resize``: an int sets the shorter side, or (h, w)).
            max_pixels: refuse images with more pixels than this (decompression bombs).
            transform: run on each decoded image; a torchvision pipeline is fused where it can be.
            decode: a callable bytes -> value replacing the built-in decoder.
            crop: :meth:`mmloader.Crop.random` / :meth:`mmloader.Crop.center`, or
                ``{"random": 224}`` / ``{"center": 224}`` (a centre crop follows ``size=``).
            flip: horizontal flip probability.
            normalize: ``"imagenet"``, ``(mean, std)`` or ``{"mean": ..., "std": ...}`` in [0, 1]
                units: pixels become float32 ``(x / 255 - mean) / std``.
            dtype: output dtype (``"float32"``, ``"bfloat16"``...): pixels scaled to [0, 1].
        """
        if isinstance(decode, str):  # the old spelling of output=
            warnings.warn(
                f"ImageReader(decode={decode!r}) is now ImageReader(output={decode!r}); "
                "decode= takes a callable, as on every reader",
                DeprecationWarning,
                stacklevel=2,
            )
            output, decode = decode, None
        if output not in OUTPUTS:
            raise ValueError(f"output={output!r}: expected one of {', '.join(OUTPUTS)}")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
        if size is not None:
            sizes = (size,) if isinstance(size, int) else tuple(size)
            if len(sizes) not in (1, 2) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
                raise ValueError(f"size={size!r}: expected a positive int (shorter side) or (height, width)")
        if max_pixels is not None and (
            isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1
        ):
            raise ValueError(f"max_pixels={max_pixels!r}: expected a positive int or None")
        super().__init__(source, field, transform=transform, decode=decode, **kwargs)
        self.output, self.mode, self.size, self.max_pixels = output, mode, size, max_pixels
        #: The fused augmentation (from the native options or the recognised part of
        #: ``transform``), or None. ``transform`` then holds only what runs after it.
        self.augment: Augment | None = None
        self._prefix: Callable[[Any], Any] | None = None  # the user's own fused steps (16-bit images)
        if crop is not None or flip or normalize is not None or dtype is not None:
            if output != "tensor" or mode == "unchanged" or decode is not None:
                raise ValueError(
                    "crop=, flip=, normalize= and dtype= decode images to tensors of one mode: "
                    f"not with output={output!r}, mode={mode!r}{' or decode=' if decode is not None else ''} "
                    "(for raw bytes, mmloader.GPUDecode crops, flips and normalises on the GPU)"
                )
            self.augment = native_augment(size, crop, flip, normalize, dtype)
            if self.augment.mean is not None and not self._takes_channels(self.augment):
                raise ValueError(
                    f"normalize: {len(self.augment.mean)} means and stds for {CHANNELS[mode]}-channel {mode} images"
                )
        elif transform is not None and output != "raw" and mode != "unchanged" and decode is None:
            self._take(split_transform(transform, output, size))
        if output == "tensor" and decode is None:
            import_torchvision()  # here, before any worker is forked (not on each one's first image)

    def _takes_channels(self, augment: Augment) -> bool:
        return augment.mean is None or len(augment.mean) in (1, CHANNELS[self.mode])

    def _take(self, split: Split) -> bool:
        """Run ``split``'s fused prefix here and its rest after it, if the prefix fits this reader
        (a Normalize for another channel count stays the user's, to fail as it would)."""
        if split.augment is None or not self._takes_channels(split.augment):
            return False
        self.augment, self._prefix = split.augment, split.prefix
        self.transform = AfterFused(split.rest, split.as_image) if split.rest is not None else None
        self._log_fused(split)
        return True

    def fuse(self, transform: Callable[[Any], Any]) -> tuple[Reader, Callable[[Any], Any] | None]:
        """A copy of this reader running the recognised prefix of ``transform`` (see
        :mod:`mmloader.readers.augment.recognise`), and the rest; this reader itself when it
        already transforms or augments, or nothing is recognised."""
        if self.augment is not None or self.transform is not None or self.output == "raw":
            return self, transform
        if self.mode == "unchanged" or not self.decodes_builtin():
            return self, transform
        fused = copy.copy(self)
        if not fused._take(split_transform(transform, self.output, self.size)):
            return self, transform
        rest, fused.transform = fused.transform, None  # zip runs the rest, as its transform
        return fused, rest

    def _log_fused(self, split: Any) -> None:
        log.info(
            "ImageReader(%r%s): fused %s%s",
            self.store.path,
            "" if self._field is None else f", {self._field!r}",
            " + ".join(split.fused),
            f"; per sample in Python after it: {' + '.join(split.remaining)}" if split.remaining else "",
        )

    @property
    def _decode_size(self) -> int | tuple[int, int] | None:
        """The size a sample decodes at on its own (a cache keeps that): the fused augmentation's
        resize, which it then finds done (a random crop needs the whole image). Only an
        antialiased bilinear resize is the decoder's own: any other (nearest, bicubic, no
        antialiasing) decodes whole and is resized by the augmentation as the user asked."""
        if self.augment is None:
            return self.size
        if self.augment.interpolation == "bilinear" and self.augment.antialias:
            return self.augment.resize
        return None

    @property
    def releases_gil(self) -> bool:  # type: ignore[override]
        return self.output != "raw" and self.decodes_builtin()

    @property
    def packs_bytes(self) -> bool:  # type: ignore[override]  # a class attribute in Reader, computed here
        """Raw encoded bytes are packed into one buffer per batch (see :mod:`mmloader.align.collate`)."""
        return self.output == "raw" and self.transform is None and self.decodes_builtin()

    @property
    def takes_views(self) -> bool:  # raw bytes are only joined; tensors decode from views (no copy)
        return (
            super().takes_views
            and self.output in ("raw", "tensor")
            and type(self).from_column is ImageReader.from_column
            and type(self)._decode_into_batch is ImageReader._decode_into_batch
        )

    def from_column(
        self,
        datas: list[bytes | None],
        keys: list[str],
        *,
        share_memory: bool = False,
        fields: Sequence[str | None] | None = None,
    ) -> Any:
        if self.augment is not None:
            column = self._augmented_column(datas, keys, share_memory, fields)
            return column if self.transform is None else [self.transform(v) for v in per_sample(column)]
        plain = self.plain_column(datas)
        if self.output == "tensor" and plain:
            try:
                stacked = self._decode_into_batch(cast("list[bytes]", datas), share_memory)  # plain: all present
                if stacked is not None:
                    return stacked
            except Exception:
                pass  # redo sample by sample: the error must name its key
        if self.output != "raw":  # the per-sample decoders below take bytes
            datas = as_bytes(datas)
        present = cast("list[bytes]", datas)  # read only where plain: all present
        if self.output != "raw" or not plain or not min(map(len, present), default=1):
            return super().from_column(datas, keys, fields=fields)  # the per-sample path reports problems by key
        # Encoded bytes of the whole batch as one buffer: one copy, one tensor, one IPC segment
        # (with the process backend's ring, the copy goes straight into the shared slot).
        offsets = offsets_of(present)
        return Packed(concat_bytes(present, offsets.tolist(), share_memory), torch.from_numpy(offsets))

    def decoded_column(
        self, datas: list[bytes | None], keys: list[str], *, fields: Sequence[str | None] | None = None
    ) -> Any:
        """The batch decoded and, with a fused augmentation, augmented; before ``transform``."""
        if self.augment is not None:
            return self._augmented_column(datas, keys, False, fields)
        return super().decoded_column(datas, keys, fields=fields)

    def _augmented_column(
        self, datas: list[bytes | None], keys: list[str], share_memory: bool, fields: Sequence[str | None] | None
    ) -> Any:
        """Decode and augment a batch in one fused step; a problem sends the batch sample by
        sample, where the error names its key."""
        assert self.augment is not None
        generator = rng().numpy
        if not self.gzipped and self.decodes_builtin() and self.all_present_within_limit(datas):
            try:
                return augment_column(
                    cast("list[bytes]", datas), self.augment, self.mode, self.max_pixels, generator, share_memory
                )
            except Exception:
                pass  # redo sample by sample: the error must name its key
        decoded = super().decoded_column(as_bytes(datas), keys, fields=fields)
        return [self._augment_one(image, generator) for image in decoded]

    def _augment_one(self, image: Any, generator: Any) -> Any:
        """One decoded image augmented. Pixels that are not uint8 (a 16-bit PNG) go through the
        user's own fused steps, unfused; with the native options, scaled to uint8 first."""
        assert self.augment is not None
        if isinstance(image, torch.Tensor) and image.dtype != torch.uint8:
            if self._prefix is not None:
                return self._prefix(image)
            from torchvision.transforms.v2.functional import to_dtype  # (torchvision: 1.5 s to import)

            image = to_dtype(image, torch.uint8, scale=True)
        return augment_image(image, self.augment, generator)

    def apply_transform(self, value: Any) -> Any:
        """A decoded image -> the sample's value: the fused augmentation (per sample here: a
        cached dataset, a sample read by index), then ``transform``."""
        if self.augment is not None:
            value = self._augment_one(value, rng().numpy)
        return super().apply_transform(value)

    def _decode_into_batch(self, datas: list[bytes], share_memory: bool = False) -> Any:
        """Decode straight into one batch tensor when every image has one size: no stack copy.

        The batch is (B, C, H, W) in channels_last memory (B, H, W, C underneath): libjpeg
        writes pixels interleaved, so copying each image in is a plain memcpy instead of a
        transpose (measured here: +60 us per 256-px image instead of +130 us); it is also
        the layout convolutions on GPUs prefer. ``.contiguous()`` gives plain NCHW.
        """
        if self.mode == "unchanged" or isinstance(self.size, int):  # never with an augment (from_column)
            return None
        infos = [probe(d) for d in datas]
        shapes = {(i.width, i.height) for i in infos}
        if len(shapes) != 1:
            return None
        w, h = shapes.pop()
        h, w = tuple(self.size) if self.size is not None else (h, w)
        out = batch_buffer((len(datas), h, w, {"RGB": 3, "L": 1, "RGBA": 4}[self.mode]), torch.uint8, share_memory)
        buffers = out.numpy()
        for i, (d, info) in enumerate(zip(datas, infos)):
            check_pixels(info, self.max_pixels)
            if self.size is None and jpeg_into(d, info, self.mode, buffers[i]) is not None:
                continue  # decoded in place
            out[i].copy_(decode_to_tensor(bytes(d), self.mode, self.size, self.max_pixels).permute(1, 2, 0))
        return Stacked(out.permute(0, 3, 1, 2))

    @accepts_views  # reached with views only for "raw" (from_column hands the others bytes)
    def decode(self, data: bytes, key: str) -> Any:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        if self.output == "raw":
            if not len(data):  # an image is never 0 bytes: a truncated write, not a value to pass on
                raise DecodeError("empty image field (0 bytes)")
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if self.output == "pil":
            return decode_to_pil(data, self.mode, self._decode_size, self.max_pixels)
        return decode_to_tensor(data, self.mode, self._decode_size, self.max_pixels)


class AfterFused:
    """The steps of a pipeline after its fused prefix, given each image as the prefix would
    have handed it on: a contiguous CHW tensor (a view of the batch otherwise), a
    ``tv_tensors.Image`` where the prefix ended with ``ToImage``.

    Args:
        rest: the remaining steps (the user's own objects).
        as_image: wrap each image as a ``tv_tensors.Image`` first.
    """

    def __init__(self, rest: Callable[[Any], Any], as_image: bool):
        self.rest, self.as_image = rest, as_image

    def __call__(self, image: Any) -> Any:
        if isinstance(image, torch.Tensor):
            image = image.contiguous()
            if self.as_image:
                from torchvision import tv_tensors

                image = tv_tensors.Image(image)
        return self.rest(image)

    def __getattr__(self, name: str) -> Any:  # the rest's attributes (``.transforms`` of a Compose)
        if name in ("rest", "as_image") or name.startswith("__"):  # unpickling: not there yet
            raise AttributeError(name)
        return getattr(self.rest, name)

    def __repr__(self) -> str:
        return repr(self.rest)
