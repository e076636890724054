"""Fused image augmentation: crops, flips and normalisation run in C while decoding.

* :mod:`.spec`: what to do (:class:`Augment`, :class:`Crop`), from native options.
* :mod:`.recognise`: the same from a torchvision pipeline the user already wrote.
* :mod:`.params`: the random crop boxes and flips of a batch (pure numpy).
* :mod:`.fused`: decode + crop + resize + flip into the batch, then one normalisation.
"""

from .fused import augment_column, augment_image
from .recognise import Split, split_transform
from .spec import IMAGENET_MEAN, IMAGENET_STD, Augment, Crop, native_augment, parse_normalize

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Augment",
    "Crop",
    "Split",
    "augment_column",
    "augment_image",
    "native_augment",
    "parse_normalize",
    "split_transform",
]
