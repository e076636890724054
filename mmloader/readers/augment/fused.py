"""Run an :class:`~.spec.Augment`: decode, crop, resize and flip each image into one batch
buffer, then convert the dtype and normalise the whole batch at once.

Every step is C (libjpeg-turbo through simplejpeg, torch's uint8 resampling kernels,
one ``addcmul`` per batch) and releases the GIL, so threads build batches in parallel
and no per-sample Python transform runs. A JPEG crop at least eight times the
output size is decoded at a reduced DCT scale (far less work, a few levels of
difference: see ``DCT_MARGIN``). Crops are resized by torchvision's own ``resize`` on the cropped pixels,
so an image decoded at full scale gets exactly torchvision's pixels for the same box.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from PIL import Image

from ...media.imageinfo import ImageInfo, check_pixels, probe
from ..columns import Stacked, batch_buffer
from ..image_decode import dct_eighths_for, decode_to_tensor, jpeg_box, jpeg_into, pil_to_tensor, target_hw
from .params import center_boxes, flips, random_resized_boxes
from .spec import Augment, affine_factors

CHANNELS = {"RGB": 3, "L": 1, "RGBA": 4}


def _resize(image: torch.Tensor, hw: Sequence[int], aug: Augment) -> torch.Tensor:
    """CHW uint8 -> CHW uint8 of size ``hw`` (torchvision's resize; channels_last memory in and
    out, the layout its fast uint8 kernels take: measured 84 against 159 us for a 180x150 crop)."""
    if tuple(image.shape[-2:]) == tuple(hw):
        return image
    if not image.is_contiguous(memory_format=torch.channels_last) and image.shape[0] > 1:
        image = image[None].contiguous(memory_format=torch.channels_last)[0]
    from torchvision.transforms.v2 import functional as F  # on first use: torchvision takes 1.5 s to import

    mode = F.InterpolationMode(aug.interpolation)  # (the same names: nearest, bilinear, bicubic)
    return F.resize(image, list(hw), interpolation=mode, antialias=aug.antialias)


def _resize_into(image: torch.Tensor, slot: torch.Tensor, aug: Augment, flip: bool) -> None:
    """Resize CHW uint8 ``image`` to the HWC ``slot``'s size, straight into it, flipped if asked.

    Bilinear antialiased resampling (torchvision's default) calls the kernel torchvision's
    ``resize`` calls, with the slot as its output: no wrapper, no result to copy (measured
    ~40 us an image less). A horizontal flip is applied to the input: resampling commutes
    with it exactly (the same pixels; tested), and the input of a crop is usually the smaller.
    """
    oh, ow = int(slot.shape[0]), int(slot.shape[1])
    if aug.interpolation == "bilinear" and aug.antialias and _AA_OUT is not None:
        src = image[None].contiguous(memory_format=torch.channels_last)
        if flip:
            src = src.flip(-1)
        if tuple(src.shape[-2:]) == (oh, ow):
            slot.copy_(src[0].permute(1, 2, 0))
        else:
            _AA_OUT(src, [oh, ow], False, None, None, out=slot.permute(2, 0, 1)[None])
        return
    _place(slot, _resize(image, (oh, ow), aug), (0, 0, oh, ow), flip)


try:  # the kernel behind F.resize(uint8, bilinear, antialias=True) on CPU, with an out= variant
    _AA_OUT: Any = torch.ops.aten._upsample_bilinear2d_aa.out
except (AttributeError, RuntimeError):  # a torch without it: torchvision's resize, then a copy
    _AA_OUT = None


def _decode_hwc(data: Any, info: ImageInfo, mode: str, min_hw: tuple[int, int] | None) -> torch.Tensor:
    """Decoded pixels as an HWC uint8 tensor (at the smallest DCT scale >= ``min_hw`` for JPEGs
    the fast path takes; every other image at full size, through the reader's decoder)."""
    hwc = jpeg_into(data, info, mode, min_hw=min_hw) if mode != "L" or info.components == 1 else None
    if hwc is not None:
        return torch.from_numpy(hwc)
    image = decode_to_tensor(bytes(data), mode, None, None)
    if image.dtype != torch.uint8:  # a 16-bit PNG: the reader runs the user's own steps on it
        raise NotEightBit(f"{image.dtype} pixels")
    return image.permute(1, 2, 0)


class NotEightBit(ValueError):
    """An image whose pixels are not uint8 (16-bit PNG): the fused path does not take it."""


def _place(slot: torch.Tensor, image: torch.Tensor, box: Sequence[int], flip: bool) -> None:
    """Copy the ``box`` (top, left, h, w) of CHW ``image`` into the HWC ``slot``; a box reaching
    outside the image (a centre crop larger than it) leaves zeros there, as torchvision pads."""
    top, left, h, w = (int(v) for v in box)
    ih, iw = image.shape[-2:]
    src = image.permute(1, 2, 0)
    if top >= 0 and left >= 0 and top + h <= ih and left + w <= iw:
        part = src[top : top + h, left : left + w]
        slot.copy_(part.flip(1) if flip else part)
        return
    slot.zero_()
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + h, ih), min(left + w, iw)
    if y1 <= y0 or x1 <= x0:
        return
    part = src[y0:y1, x0:x1]
    if flip:  # the padded crop, mirrored: the visible part lands mirrored across the slot
        part = part.flip(1)
        x0, x1 = left + w - (x1 - left), left + w - (x0 - left)
    slot[y0 - top : y1 - top, x0 - left : x1 - left].copy_(part)


class Draws(NamedTuple):
    """A batch's drawn geometry: per image, the size to resize the whole image to (None: keep
    it), the box ``(top, left, h, w)`` to cut (None: all of it), the output (h, w), and the flips."""

    resized: list[tuple[int, int] | None]
    boxes: np.ndarray | None
    out_hw: list[tuple[int, int]]
    flips: list[bool]


def draw(aug: Augment, sizes: Sequence[tuple[int, int]], generator: np.random.Generator) -> Draws:
    """The random (and fixed) geometry of a batch of images of ``sizes`` (h, w), from ``generator``.

    Args:
        aug: the augmentation.
        sizes: each image's (height, width) as stored.
        generator: the batch's generator: the crops first, then the flips.
    """
    heights = np.array([h for h, _ in sizes], dtype=np.int64)
    widths = np.array([w for _, w in sizes], dtype=np.int64)
    n = len(sizes)
    if aug.crop is not None and aug.crop.kind == "random":
        boxes = random_resized_boxes(heights, widths, aug.crop.scale, aug.crop.ratio, generator)
        return Draws([None] * n, boxes, [aug.crop.size] * n, flips(n, aug.flip, generator).tolist())
    resized = [target_hw(aug.resize, int(h), int(w)) if aug.resize is not None else None for h, w in sizes]
    hs = np.array([r[0] if r else h for r, h in zip(resized, heights)], dtype=np.int64)
    ws = np.array([r[1] if r else w for r, w in zip(resized, widths)], dtype=np.int64)
    flipped = flips(n, aug.flip, generator).tolist()
    if aug.crop is not None:
        return Draws(resized, center_boxes(hs, ws, aug.crop.size), [aug.crop.size] * n, flipped)
    return Draws(resized, None, [(int(h), int(w)) for h, w in zip(hs, ws)], flipped)


#: A JPEG is decoded at a reduced DCT scale (libjpeg's M/8: far less work) only while the
#: decoded region stays at least this many times the output in each side, so that the final
#: antialiased resize still does most of the filtering. What remains is mostly the crop box's
#: edges moving to the reduced grid (under 1/8 of an output pixel) and the DCT's own filtering.
#: Chosen on real photographs (benchmarks/reduced_scale.py --real: 12 sample photographs of
#: scikit-image and scikit-learn, each as its camera's JPEG or encoded by Pillow at q75-q95,
#: 4:2:0 and 4:4:4, progressive, and by torchvision; 16-64 px crops and Resize + CenterCrop):
#: the mean difference per image from a full decode of the drawn box, median / p99 / max, was
#: 0.88 / 3.34 / 4.42 levels with a margin of 3 and 0.60 / 2.52 / 4.07 with 4 (docs/augment.md;
#: a wider sweep of draws reached 6.6 at most with 3). ``math.inf`` turns it off.
DCT_MARGIN = 4


def dct_eighths(full: tuple[int, int], decoded: tuple[int, int]) -> int:
    """The ``M`` of libjpeg's M/8 scale that decoded an image of ``full`` (h, w) pixels to
    ``decoded``: it gives ``ceil(side * M / 8)`` pixels a side, reduced pixel ``i`` standing for
    full pixels ``[8i/M, 8(i+1)/M)`` (``decoded / full`` is not the scale where 8 does not
    divide ``side * M``)."""
    for m in range(1, 9):
        if all(-(-side * m // 8) == got for side, got in zip(full, decoded)):
            return m
    raise ValueError(f"a {full[1]}x{full[0]} JPEG decoded to {decoded[1]}x{decoded[0]}: not an M/8 scale")


def reduced_box(box: Sequence[int], eighths: int) -> tuple[int, int, int, int]:
    """The box ``(top, left, h, w)`` of full pixels on the grid of an ``eighths``/8 decode, in
    reduced pixels: each edge rounded to the nearest reduced pixel's edge (moved by at most
    ``4 / eighths`` full pixels). A crop decoded so is torchvision's crop of this box."""
    top, left, h, w = (int(v) for v in box)
    y0, x0 = round(top * eighths / 8), round(left * eighths / 8)
    y1, x1 = round((top + h) * eighths / 8), round((left + w) * eighths / 8)
    return y0, x0, max(1, y1 - y0), max(1, x1 - x0)


def _box_on_grid(box: Sequence[int], info: ImageInfo, eighths: int) -> tuple[int, int, int, int]:
    """The crop ``box`` of full pixels in pixels of the ``eighths``/8 decode, kept inside it."""
    if eighths == 8:
        top, left, h, w = (int(v) for v in box)
        return top, left, h, w
    dh, dw = -(-info.height * eighths // 8), -(-info.width * eighths // 8)
    top, left, h, w = reduced_box(box, eighths)
    top, left = min(top, dh - 1), min(left, dw - 1)
    return top, left, max(1, min(h, dh - top)), max(1, min(w, dw - left))


def _reduces(aug: Augment, info: ImageInfo, region: tuple[int, int], out_hw: Sequence[int]) -> bool:
    """Whether to decode ``region`` (h, w) of this image at a reduced DCT scale for ``out_hw``:
    a JPEG, an antialiased bilinear or bicubic resize (without antialiasing, or nearest, the
    user asked for no low-pass filter), and room for at least a 1/2 scale."""
    return (
        info.format == "jpeg"
        and aug.antialias
        and aug.interpolation != "nearest"
        and region[0] >= 2 * DCT_MARGIN * out_hw[0]
        and region[1] >= 2 * DCT_MARGIN * out_hw[1]
    )


def _one(data: Any, info: ImageInfo, mode: str, aug: Augment, resized, box, out_hw, slot, flip: bool) -> None:
    """Decode one image and write its augmented pixels into ``slot`` (HWC uint8)."""
    if aug.crop is not None and aug.crop.kind == "random":
        top, left, h, w = box
        oh, ow = out_hw
        min_hw = None
        if _reduces(aug, info, (h, w), out_hw):  # decoded smaller, the crop still DCT_MARGIN x the output
            min_hw = (math.ceil(info.height * DCT_MARGIN * oh / h), math.ceil(info.width * DCT_MARGIN * ow / w))
        eighths = dct_eighths_for(info, min_hw)
        part = jpeg_box(data, info, mode, eighths, _box_on_grid(box, info, eighths))
        if part is not None:  # only the box decoded
            _resize_into(torch.from_numpy(part).permute(2, 0, 1), slot, aug, flip)
            return
        image = _decode_hwc(data, info, mode, min_hw).permute(2, 0, 1)
        dh, dw = image.shape[-2:]
        if (dh, dw) != (info.height, info.width):  # decoded smaller: the box on the reduced grid
            top, left, h, w = _box_on_grid(box, info, dct_eighths((info.height, info.width), (dh, dw)))
        _resize_into(image[:, top : top + h, left : left + w], slot, aug, flip)
        return
    min_hw = None
    if resized is not None and _reduces(aug, info, (info.height, info.width), resized):
        min_hw = (DCT_MARGIN * resized[0], DCT_MARGIN * resized[1])
    image = _decode_hwc(data, info, mode, min_hw).permute(2, 0, 1)
    if resized is not None:
        image = _resize(image, resized, aug)
    _place(slot, image, box if box is not None else (0, 0, *out_hw), flip)


def augment_column(
    datas: list,
    aug: Augment,
    mode: str,
    max_pixels: int | None,
    generator: np.random.Generator,
    share_memory: bool = False,
) -> Stacked | list[torch.Tensor]:
    """A batch of encoded images decoded and augmented: a (B, C, H, W) batch (channels_last
    memory) when every output has one size, else a list of CHW tensors.

    Args:
        datas: the encoded images (bytes-like), all present.
        aug: what to do.
        mode: ``"RGB"``, ``"L"`` or ``"RGBA"``.
        max_pixels: the decompression-bomb limit (checked from each header before decoding).
        generator: the batch's generator (crops and flips are drawn from it).
        share_memory: the batch goes to another process (its tensor is allocated in shared memory).
    """
    infos = [probe(d) for d in datas]
    for info in infos:
        check_pixels(info, max_pixels)
    drawn = draw(aug, [(i.height, i.width) for i in infos], generator)
    channels = CHANNELS[mode]

    boxes = drawn.boxes.tolist() if drawn.boxes is not None else None

    def one(i: int, slot: torch.Tensor) -> None:
        box = boxes[i] if boxes is not None else None
        _one(datas[i], infos[i], mode, aug, drawn.resized[i], box, drawn.out_hw[i], slot, drawn.flips[i])

    if len(set(drawn.out_hw)) == 1:
        shape = (len(datas), *drawn.out_hw[0], channels)
        if not aug.float_output:
            pixels = batch_buffer(shape, torch.uint8, share_memory)
            for i in range(len(datas)):
                one(i, pixels[i])
            return Stacked(pixels.permute(0, 3, 1, 2))
        assert aug.dtype is not None
        out = batch_buffer(shape, aug.dtype, share_memory)
        # Each image converted while its uint8 pixels are still in the cache (a 150 KB slot
        # reused), not in a second pass over the whole batch: measured 40 us an image less
        # with two threads, which share the memory bandwidth.
        convert = Converter(aug, shape[2], channels)
        slot = torch.empty(shape[1:], dtype=torch.uint8)
        for i in range(len(datas)):
            one(i, slot)
            convert(slot[None], out[i : i + 1])
        return Stacked(out.permute(0, 3, 1, 2))
    images = []
    for i in range(len(datas)):  # sizes differ (a shorter-side resize): one tensor each
        slot = torch.empty((*drawn.out_hw[i], channels), dtype=torch.uint8)
        one(i, slot)
        images.append(finish_pixels(slot, aug))
    return images


def finish_pixels(hwc: torch.Tensor, aug: Augment) -> torch.Tensor:
    """One image's HWC uint8 pixels -> contiguous CHW in the output dtype (the batch path's arithmetic)."""
    if aug.float_output:
        assert aug.dtype is not None
        out = torch.empty((1, *hwc.shape), dtype=aug.dtype)
        Converter(aug, int(hwc.shape[1]), int(hwc.shape[2]))(hwc[None], out)
        hwc = out[0]
    return hwc.permute(2, 0, 1).contiguous()


class Converter:
    """``(pixels [/ 255] - mean) / std`` for (N, H, W, C) uint8 images of one width, into a
    float tensor of the same shape.

    One conversion and one ``addcmul`` over rows of pixels with a per-row pattern of scales
    and offsets: broadcasting a 3-element per-channel vector over the last axis was measured
    at 410 us a 224-px image, this at 85 us. Computed in float32 (float64 for float64), then cast to ``out``'s dtype.

    Args:
        aug: the augmentation (its dtype, scale, mean and std).
        width: the images' width.
        channels: their channels.
    """

    def __init__(self, aug: Augment, width: int, channels: int):
        unit = 1 / 255 if aug.scale else 1.0
        scale, offset = affine_factors(aug.mean, aug.std, channels, unit)
        self.normalise, self.unit = aug.mean is not None, unit
        self.row = width * channels
        self.scale_row = torch.from_numpy(np.tile(scale, width))  # float64: cast to the work dtype
        self.offset_row = torch.from_numpy(np.tile(offset, width))

    def __call__(self, pixels: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        wide = out.dtype in (torch.float32, torch.float64)  # else float32, then cast
        work = out if wide else torch.empty(pixels.shape, dtype=torch.float32)
        if work.dtype != self.scale_row.dtype:
            self.scale_row, self.offset_row = self.scale_row.to(work.dtype), self.offset_row.to(work.dtype)
        rows = work.view(-1, self.row)
        rows.copy_(pixels.reshape(-1, self.row))
        if self.normalise:
            torch.addcmul(self.offset_row, rows, self.scale_row, out=rows)
        elif self.unit != 1.0:
            rows.mul_(self.scale_row)
        if work is not out:
            out.copy_(work)
        return out


def augment_image(image: Any, aug: Augment, generator: np.random.Generator) -> torch.Tensor:
    """One decoded image (CHW uint8 tensor or PIL image) augmented: the per-sample path
    (a cached dataset, a sample read by index), with torchvision's own crop and resize.

    Args:
        image: the decoded image.
        aug: what to do.
        generator: the generator to draw the crop and flip from.
    """
    if isinstance(image, Image.Image):
        image = pil_to_tensor(image)
    drawn = draw(aug, [(int(image.shape[-2]), int(image.shape[-1]))], generator)
    out_hw = drawn.out_hw[0]
    if drawn.resized[0] is not None:
        image = _resize(image, drawn.resized[0], aug)
    slot = torch.empty((*out_hw, image.shape[0]), dtype=torch.uint8)
    if drawn.boxes is not None and aug.crop is not None and aug.crop.kind == "random":
        top, left, h, w = drawn.boxes[0].tolist()
        _resize_into(image[:, top : top + h, left : left + w], slot, aug, drawn.flips[0])
    else:
        box = drawn.boxes[0] if drawn.boxes is not None else (0, 0, *out_hw)
        _place(slot, image, box, drawn.flips[0])
    return finish_pixels(slot, aug)
