"""Recognise the torchvision pipeline a user already wrote and fuse what mmloader can run itself.

A ``transforms.v2.Compose`` (or v1 ``transforms.Compose``, or a single transform) given as
``ImageReader(transform=...)`` is read step by step. Its longest prefix made of the
steps below becomes an :class:`~.spec.Augment` with the same parameters; the steps
after it stay the user's Python, run per sample on what the fused prefix produced:

* ``RandomResizedCrop`` (bilinear, bicubic or nearest; any ``scale``, ``ratio``, ``antialias``)
* ``Resize`` (without ``max_size``), then optionally ``CenterCrop``; ``CenterCrop`` alone
* ``RandomHorizontalFlip`` (not before a ``CenterCrop``: a centred box with an odd margin is
  not symmetric; before a random-resized crop it gives the same distribution, as torchvision)
* ``ToImage``, ``PILToTensor``, ``ToPureTensor``, v1 ``ToTensor`` (type conversions)
* ``ToDtype`` (a float dtype, ``scale=`` either way), ``ConvertImageDtype``, then ``Normalize``

Only the exact classes are recognised (a subclass may change what a step does), and
only where the step sees what it would see unfused: v1 ``ToTensor`` needs a PIL image
(``output="pil"``), and a resize after the float conversion stops the fused prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .spec import Augment, Crop, pair


@dataclasses.dataclass
class Split:
    """A transform split into the fused prefix and the rest.

    Attributes:
        augment: the fused prefix, or None when nothing is fused.
        rest: what still runs per sample after it (the user's classes), or None.
        fused: the names of the fused steps; ``remaining``: those of the rest.
        prefix: the user's own fused steps as one callable (for an image the fused path cannot
            take, such as a 16-bit PNG: it runs them, unfused).
        as_image: the prefix ends in a ``tv_tensors.Image`` (v2 ``ToImage``), which the rest is given.
    """

    augment: Augment | None
    rest: Callable[[Any], Any] | None
    fused: list[str]
    remaining: list[str]
    prefix: Callable[[Any], Any] | None = None
    as_image: bool = False


def _steps(transform: Any) -> tuple[list[Any], type | None]:
    """The transform's steps (nested Composes flattened) and the Compose class to rebuild the rest with."""
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    composes = (v1.Compose, v2.Compose)
    if type(transform) not in composes:
        return [transform], None
    steps: list[Any] = []
    for t in transform.transforms:
        steps.extend(_steps(t)[0] if type(t) in composes else [t])
    return steps, type(transform)


def _interpolation(mode: Any) -> str | None:
    value = getattr(mode, "value", mode)
    return value if value in ("nearest", "bilinear", "bicubic") else None


class _State:
    """What the recognised prefix has done so far (the image's type, geometry, dtype)."""

    def __init__(self, pil: bool, size: Any):
        self.pil, self.reader_size = pil, size
        self.resize: Any = size
        self.crop: Crop | None = None
        self.interpolation, self.antialias = "bilinear", True
        self.flip = 0.0
        self.dtype: torch.dtype | None = None
        self.scale = True
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None
        self.as_image = False  # a tv_tensors.Image (v2 ToImage), not a plain tensor

    @property
    def geometry_open(self) -> bool:
        return self.crop is None and self.dtype is None

    def take(self, t: Any) -> bool:
        """Apply step ``t`` if it is one the fused path runs here; False ends the prefix."""
        import torchvision.transforms as v1
        import torchvision.transforms.v2 as v2

        kind = type(t)
        if kind in (v2.RandomResizedCrop, v1.RandomResizedCrop):
            mode = _interpolation(t.interpolation)
            if not self.geometry_open or self.resize is not None or mode is None or (self.pil and mode == "nearest"):
                return False
            self.crop = Crop.random(tuple(t.size), tuple(t.scale), tuple(t.ratio))
            self.interpolation, self.antialias = mode, bool(t.antialias) or self.pil  # PIL always antialiases
            return True
        if kind in (v2.Resize, v1.Resize):
            mode = _interpolation(t.interpolation)
            if not self.geometry_open or self.resize is not None or t.max_size is not None or mode is None:
                return False
            if self.pil and mode == "nearest":
                return False
            size = t.size
            if not isinstance(size, int):
                size = int(size[0]) if len(size) == 1 else pair(tuple(size), "Resize size")
            self.resize = size
            self.interpolation, self.antialias = mode, bool(t.antialias) or self.pil
            return True
        if kind in (v2.CenterCrop, v1.CenterCrop):
            # after a flip, no: a centred box with an odd margin is not symmetric (the flip
            # would have to come first, and the fused path flips last)
            if not self.geometry_open or self.flip:
                return False
            self.crop = Crop.center(tuple(t.size) if not isinstance(t.size, int) else t.size)
            return True
        if kind in (v2.RandomHorizontalFlip, v1.RandomHorizontalFlip):
            if self.flip:
                return False
            self.flip = float(t.p)
            return True
        if kind in (v2.ToImage, v1.PILToTensor, v2.PILToTensor):
            if kind is v1.PILToTensor and not self.pil:  # v1 raises on a tensor: leave it to do so
                return False
            if kind is v2.ToImage:
                self.as_image = True
            elif self.pil:
                self.as_image = False  # a plain tensor from a PIL image; a tensor passes through
            self.pil = False
            return True
        if kind is v2.ToPureTensor:
            if self.pil:
                return False
            self.as_image = False
            return True
        if kind is v1.ToTensor:  # PIL -> float in [0, 1]; on a tensor it raises: leave it to do so
            if not self.pil or self.dtype is not None:
                return False
            self.pil, self.dtype, self.scale, self.as_image = False, torch.float32, True, False
            return True
        if kind in (v2.ToDtype, v2.ConvertImageDtype, v1.ConvertImageDtype):
            dtype = t.dtype
            if self.pil or self.dtype is not None or not isinstance(dtype, torch.dtype):
                return False
            if dtype == torch.uint8:
                return True  # uint8 pixels stay uint8
            if not dtype.is_floating_point:
                return False
            self.dtype = dtype
            self.scale = bool(getattr(t, "scale", True))  # ConvertImageDtype always scales
            return True
        if kind in (v2.Normalize, v1.Normalize):
            if self.dtype is None or self.mean is not None:
                return False
            self.mean, self.std = tuple(map(float, t.mean)), tuple(map(float, t.std))
            return True
        return False

    def augment(self) -> Augment:
        return Augment(
            resize=self.resize,
            crop=self.crop,
            interpolation=self.interpolation,
            antialias=self.antialias,
            flip=self.flip,
            dtype=self.dtype,
            scale=self.scale,
            mean=self.mean,
            std=self.std,
        )


def split_transform(transform: Any, output: str, size: Any = None) -> Split:
    """Split ``transform`` into the prefix mmloader fuses and the rest.

    Args:
        transform: the user's transform (a torchvision Compose, one transform, or any callable).
        output: the reader's ``output``: ``"tensor"`` or ``"pil"`` (what the transform receives).
        size: the reader's ``size=`` resize, which comes first.

    >>> import torchvision.transforms.v2 as v2
    >>> split = split_transform(v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
    ...                                     v2.ColorJitter(0.4)]), "tensor")
    >>> split.fused, split.remaining
    (['RandomResizedCrop', 'RandomHorizontalFlip'], ['ColorJitter'])
    """
    nothing = Split(None, transform, [], [])
    if output not in ("tensor", "pil"):
        return nothing
    try:
        steps, compose = _steps(transform)
    except Exception:  # a callable torchvision cannot describe: left as it is
        return nothing
    state = _State(output == "pil", size)
    taken = 0
    for t in steps:
        try:
            ok = state.take(t)
        except (ValueError, TypeError, AttributeError):  # parameters outside what the fused path takes
            ok = False
        if not ok:
            break
        taken += 1
    if state.pil or not taken:  # still a PIL image: the rest (or the caller) expects one
        return nothing
    try:
        augment = state.augment()
    except ValueError:
        return nothing
    rest_steps = steps[taken:]
    if augment.empty and rest_steps:
        return nothing  # only type conversions before user steps: nothing to gain
    rest: Callable[[Any], Any] | None = None
    if rest_steps:
        rest = compose(rest_steps) if compose is not None else rest_steps[0]
    prefix = compose(steps[:taken]) if compose is not None else steps[0]
    names = [type(t).__name__ for t in steps]
    return Split(augment, rest, names[:taken], names[taken:], prefix, state.as_image)
