"""What a fused image augmentation does: one plain, picklable description.

:class:`Augment` is what both spellings turn into: the native options of
:class:`mmloader.ImageReader` (``crop=``, ``flip=``, ``normalize=``, ``dtype=``) and a
torchvision ``Compose`` recognised by :mod:`.recognise`. :mod:`.fused` runs it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

#: ImageNet's per-channel statistics in [0, 1] units (``normalize="imagenet"``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    """``size`` as (h, w): an int (or a 1-element sequence) is a square."""
    if not isinstance(size, (int, list, tuple)):
        raise ValueError(f"{what}={size!r}: expected a positive int or (height, width)")
    sizes = (size,) if isinstance(size, int) else tuple(size)
    if len(sizes) == 1:
        sizes = sizes * 2
    if len(sizes) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
        raise ValueError(f"{what}={size!r}: expected a positive int or (height, width)")
    return int(sizes[0]), int(sizes[1])


@dataclasses.dataclass(frozen=True)
class Crop:
    """A crop to a fixed output size: random-resized (training) or centre (evaluation).

    Args:
        kind: ``"random"`` (torchvision's ``RandomResizedCrop``: an area fraction drawn
            uniformly from ``scale`` and a log-uniform aspect ratio from ``ratio``, then resized
            to ``size``) or ``"center"`` (``CenterCrop``, after the reader's ``size=`` resize).
        size: output (height, width); an int is a square.
        scale: area fraction range of a random crop.
        ratio: aspect ratio (width / height) range of a random crop.

    >>> Crop.random(224), Crop.center(224).size
    (Crop(kind='random', size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333)), (224, 224))
    """

    kind: str
    size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self):
        if self.kind not in ("random", "center"):
            raise ValueError(f"crop kind {self.kind!r}: expected 'random' or 'center'")
        object.__setattr__(self, "size", pair(self.size, "crop size"))
        scale, ratio = tuple(map(float, self.scale)), tuple(map(float, self.ratio))
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"crop scale={self.scale!r}: expected (min, max) with 0 < min <= max")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"crop ratio={self.ratio!r}: expected (min, max) with 0 < min <= max")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)

    @classmethod
    def random(
        cls, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3)
    ) -> "Crop":
        """A random-resized crop (torchvision ``RandomResizedCrop(size, scale, ratio)``)."""
        return cls("random", size, tuple(scale), tuple(ratio))  # type: ignore[arg-type]

    @classmethod
    def center(cls, size: int | Sequence[int]) -> "Crop":
        """A centre crop (torchvision ``CenterCrop(size)``)."""
        return cls("center", size)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, value: Any) -> "Crop | None":
        """``crop=`` as given: a :class:`Crop`, ``{"random": 224, "scale": [...], "ratio": [...]}``
        or ``{"center": 224}`` (the config spelling), or None."""
        if value is None or isinstance(value, Crop):
            return value
        if isinstance(value, Mapping):
            kinds = [k for k in ("random", "center") if k in value]
            extra = set(value) - {"random", "center", "scale", "ratio"}
            if len(kinds) != 1 or extra or (kinds == ["center"] and len(value) > 1):
                raise ValueError(
                    f"crop={dict(value)!r}: expected {{random: SIZE[, scale: [MIN, MAX], ratio: [MIN, MAX]]}} "
                    "or {center: SIZE}"
                )
            if kinds == ["center"]:
                return cls.center(_size_value(value["center"]))
            return cls.random(
                _size_value(value["random"]),
                tuple(value.get("scale", (0.08, 1.0))),
                tuple(value.get("ratio", (3 / 4, 4 / 3))),
            )
        raise ValueError(
            f"crop={value!r}: expected mmloader.Crop.random(SIZE) / Crop.center(SIZE), "
            "or {random: SIZE} / {center: SIZE}"
        )

    def describe(self) -> str:
        h, w = self.size
        size = str(h) if h == w else f"({h}, {w})"
        if self.kind == "center":
            return f"CenterCrop({size})"
        return f"RandomResizedCrop({size}, scale={_short(self.scale)}, ratio={_short(self.ratio)})"


def _size_value(value: Any) -> Any:
    """A size as given, sequences as tuples (:func:`pair` says what is wrong with the rest)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _short(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


@dataclasses.dataclass(frozen=True)
class Augment:
    """A fused augmentation: resize, crop, flip, then dtype conversion and normalisation.

    Applied in this order to each decoded image (uint8); the dtype conversion and the
    normalisation run once per batch.

    Args:
        resize: torchvision ``Resize`` size before a centre crop (an int sets the shorter side).
        crop: the :class:`Crop`, or None.
        interpolation: ``"bilinear"``, ``"bicubic"`` or ``"nearest"`` (resizes and random crops).
        antialias: antialiased downscaling, as torchvision's ``antialias=True``.
        flip: horizontal flip probability.
        dtype: output dtype; None keeps uint8 pixels.
        scale: with a float ``dtype``, divide by 255 first (``ToDtype(..., scale=True)``).
        mean: per-channel mean to subtract (in the units after ``scale``), or None.
        std: per-channel standard deviation to divide by, with ``mean``.
    """

    resize: int | tuple[int, int] | None = None
    crop: Crop | None = None
    interpolation: str = "bilinear"
    antialias: bool = True
    flip: float = 0.0
    dtype: torch.dtype | None = None
    scale: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={self.interpolation!r}: expected one of {', '.join(INTERPOLATIONS)}")
        if isinstance(self.flip, bool) or not isinstance(self.flip, (int, float)) or not 0 <= self.flip <= 1:
            raise ValueError(f"flip={self.flip!r}: expected a probability in [0, 1]")
        if self.dtype is not None and not self.dtype.is_floating_point and self.dtype != torch.uint8:
            raise ValueError(f"dtype={self.dtype}: expected a floating-point dtype (or None for uint8)")
        if (self.mean is None) != (self.std is None):
            raise ValueError("normalize: give both mean and std")
        if self.mean is not None:
            assert self.std is not None
            if len(self.mean) != len(self.std) or not self.mean:
                raise ValueError(f"normalize: mean {self.mean} and std {self.std} differ in length")
            if any(not math.isfinite(s) or s == 0 for s in self.std):
                raise ValueError(f"normalize: std {self.std} has a zero or non-finite value")
            if self.dtype is None or not self.dtype.is_floating_point:
                raise ValueError("normalize needs a floating-point dtype")

    @property
    def empty(self) -> bool:
        return self.resize is None and self.crop is None and not self.flip and self.dtype in (None, torch.uint8)

    @property
    def float_output(self) -> bool:
        return self.dtype is not None and self.dtype.is_floating_point

    def describe(self) -> str:
        """The steps, in torchvision's vocabulary (for the log line saying what was fused)."""
        steps = []
        if self.resize is not None:
            steps.append(f"Resize({self.resize})")
        if self.crop is not None:
            steps.append(self.crop.describe())
        if self.flip:
            steps.append(f"RandomHorizontalFlip({self.flip:g})")
        if self.float_output:
            steps.append(f"ToDtype({str(self.dtype).removeprefix('torch.')}, scale={self.scale})")
        if self.mean is not None:
            steps.append(f"Normalize(mean={_short(self.mean)}, std={_short(self.std or ())})")
        return " + ".join(steps) or "nothing"


def native_augment(
    size: int | Sequence[int] | None,
    crop: Any,
    flip: float,
    normalize: Any,
    dtype: Any,
) -> Augment:
    """The :class:`Augment` for ImageReader's native options (``size`` resizes before a centre crop).

    Args:
        size: the reader's ``size=``, the resize before a centre crop (a random crop resizes its
            own box to its size, so it takes no ``size=``).
        crop: ``crop=`` (see :meth:`Crop.parse`).
        flip: horizontal flip probability.
        normalize: ``"imagenet"``, ``(mean, std)`` or ``{"mean": [...], "std": [...]}`` in [0, 1]
            units, or None; implies ``dtype="float32"`` unless given.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"``, a torch dtype, or None (uint8).
    """
    if isinstance(flip, bool) or not isinstance(flip, (int, float)):
        raise ValueError(f"flip={flip!r}: expected a probability such as 0.5 (1.0 flips every image)")
    parsed = Crop.parse(crop)
    if parsed is not None and parsed.kind == "random" and size is not None:
        raise ValueError(
            f"size={size!r} with a random crop: the crop's size is the output size "
            "(a random-resized crop resizes its own box); drop size="
        )
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    if normalize is not None:
        mean, std = parse_normalize(normalize)
    dtype = parse_dtype(dtype)
    if dtype is None and mean is not None:
        dtype = torch.float32
    resize = None if size is None else size if isinstance(size, int) else pair(size, "size")
    return Augment(resize=resize, crop=parsed, flip=float(flip), dtype=dtype, mean=mean, std=std)


def parse_normalize(normalize: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``normalize=`` as given -> ``(mean, std)`` in [0, 1] units: ``"imagenet"``, ``(mean, std)``
    or ``{"mean": [...], "std": [...]}``.

    >>> parse_normalize({"mean": [0.5], "std": [0.25]})
    ((0.5,), (0.25,))
    """
    if normalize == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if isinstance(normalize, Mapping) and set(normalize) == {"mean", "std"}:
        return tuple(map(float, normalize["mean"])), tuple(map(float, normalize["std"]))
    if isinstance(normalize, Sequence) and not isinstance(normalize, str) and len(normalize) == 2:
        return tuple(map(float, normalize[0])), tuple(map(float, normalize[1]))
    raise ValueError(f"normalize={normalize!r}: expected 'imagenet', (mean, std) or {{mean: [...], std: [...]}}")


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A dtype name (``"bfloat16"``) as its torch dtype; anything else as given.

    >>> parse_dtype("bfloat16"), parse_dtype(None)
    (torch.bfloat16, None)
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}, a torch dtype, or None")
        return DTYPES[dtype]
    return dtype


def affine_factors(
    mean: Sequence[float] | None, std: Sequence[float] | None, channels: int, unit: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel float64 ``(scale, offset)`` with ``pixels * scale + offset == (pixels * unit - mean) / std``
    (without ``mean``: ``pixels * unit``): the one normalisation arithmetic of the fused CPU path and
    of ``ToDevice``, so both give the same floats.

    >>> affine_factors([0.5], [0.25], 2, 1 / 255)[1].tolist()
    [-2.0, -2.0]
    """
    if mean is None or std is None:
        return np.full(channels, unit), np.zeros(channels)
    m = np.broadcast_to(np.asarray(mean, dtype=np.float64), (channels,))
    s = np.broadcast_to(np.asarray(std, dtype=np.float64), (channels,))
    return unit / s, -m / s
