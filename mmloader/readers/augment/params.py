"""Random parameters of a batch's augmentations, drawn in one vectorised step (pure numpy).

The distributions are torchvision's: a random-resized crop tries up to ten times to
draw an area fraction uniform in ``scale`` and an aspect ratio log-uniform in ``ratio``
that fit the image, then falls back to the largest centred crop within ``ratio``
(``RandomResizedCrop.get_params``); its position is uniform. The generator is the
batch's own (:func:`mmloader.rng`), so a batch gets the same crops on either backend,
with any worker count, and after a resume.
"""

from __future__ import annotations

import numpy as np

ATTEMPTS = 10  # torchvision's number of tries before the centred fallback


def random_resized_boxes(
    heights: np.ndarray,
    widths: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: np.random.Generator,
) -> np.ndarray:
    """Crop boxes ``(top, left, height, width)``, one row per image, as ``RandomResizedCrop`` draws them.

    Args:
        heights: image heights (int array, one per image).
        widths: image widths.
        scale: area fraction range.
        ratio: aspect ratio (width / height) range.
        generator: the numpy generator to draw from.

    >>> boxes = random_resized_boxes(np.array([100]), np.array([200]), (0.08, 1.0), (0.75, 4 / 3),
    ...                              np.random.default_rng(0))
    >>> bool(((boxes[:, 0] + boxes[:, 2] <= 100) & (boxes[:, 1] + boxes[:, 3] <= 200)).all())
    True
    """
    h = np.asarray(heights, dtype=np.int64)
    w = np.asarray(widths, dtype=np.int64)
    n = len(h)
    area = (h * w)[:, None].astype(np.float64)
    target = area * generator.uniform(scale[0], scale[1], (n, ATTEMPTS))
    aspect = np.exp(generator.uniform(np.log(ratio[0]), np.log(ratio[1]), (n, ATTEMPTS)))
    # Python's round() (torchvision's) is round-half-even, as np.rint
    cw = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    ch = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (cw > 0) & (cw <= w[:, None]) & (ch > 0) & (ch <= h[:, None])
    found = fits.any(axis=1)
    first = fits.argmax(axis=1)
    rows = np.arange(n)
    box_h = np.where(found, ch[rows, first], 0)
    box_w = np.where(found, cw[rows, first], 0)
    # the fallback: the whole image, narrowed to the nearest allowed aspect ratio, centred
    in_ratio = w / np.maximum(h, 1)
    fb_w = np.where(in_ratio < ratio[0], w, np.where(in_ratio > ratio[1], np.rint(h * ratio[1]), w)).astype(np.int64)
    fb_h = np.where(in_ratio < ratio[0], np.rint(w / ratio[0]), h).astype(np.int64)
    box_h = np.where(found, box_h, fb_h)
    box_w = np.where(found, box_w, fb_w)
    u = generator.random((n, 2))
    top = np.where(found, np.floor(u[:, 0] * (h - box_h + 1)), (h - box_h) // 2).astype(np.int64)
    left = np.where(found, np.floor(u[:, 1] * (w - box_w + 1)), (w - box_w) // 2).astype(np.int64)
    return np.stack([top, left, box_h, box_w], axis=1)


def center_boxes(heights: np.ndarray, widths: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``CenterCrop(size)`` boxes ``(top, left, height, width)`` (torchvision's rounding); a
    crop larger than the image has a negative top/left: the image is padded with zeros.

    >>> center_boxes(np.array([256]), np.array([300]), (224, 224)).tolist()
    [[16, 38, 224, 224]]
    """
    h = np.asarray(heights, dtype=np.int64)
    w = np.asarray(widths, dtype=np.int64)
    # torchvision pads a crop larger than the image by (crop - side) // 2 before the crop
    top = np.where(h >= size[0], np.rint((h - size[0]) / 2.0), -((size[0] - h) // 2)).astype(np.int64)
    left = np.where(w >= size[1], np.rint((w - size[1]) / 2.0), -((size[1] - w) // 2)).astype(np.int64)
    return np.stack([top, left, np.full_like(h, size[0]), np.full_like(w, size[1])], axis=1)


def flips(count: int, p: float, generator: np.random.Generator) -> np.ndarray:
    """Which of ``count`` images to flip horizontally, each with probability ``p`` (bool array)."""
    if p <= 0:
        return np.zeros(count, dtype=bool)
    return generator.random(count) < p
