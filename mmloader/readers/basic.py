"""Readers for text, integer labels, JSON and numpy arrays."""
from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import torch

from ..errors import UnsafeFieldError
from .base import Reader, accepts_views


class TextReader(Reader):
    """UTF-8 text -> ``str``; ``transform`` (e.g. a tokenizer) runs in the worker.

    >>> captions = TextReader("pairs.lmdb"); captions[0]     # doctest: +SKIP
    'a red circle on a blue background'
    """

    default_field = "txt"

    @accepts_views
    def decode(self, data: bytes, key: str) -> str:
        return str(data, "utf-8")


class LabelReader(Reader):
    """An ASCII integer label (``b"7"``) -> ``int``.

    >>> LabelReader("imagenet.lmdb")[0]     # doctest: +SKIP
    7
    """

    default_field = "cls"

    @accepts_views
    def decode(self, data: bytes, key: str) -> int:
        text = str(data, "ascii").strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"label {text[:40]!r} is not an integer") from None


class JSONReader(Reader):
    """JSON text -> ``dict`` (or whatever JSON value is stored).

    >>> JSONReader("pairs.lmdb")[0]["width"]     # doctest: +SKIP
    """

    default_field = "json"

    def decode(self, data: bytes, key: str) -> Any:
        return json.loads(data.decode("utf-8"))


class ArrayReader(Reader):
    """A ``.npy`` field -> ``torch.Tensor``. Object (pickled) arrays are refused.

    >>> ArrayReader("feats.lmdb", field="npy")[0].shape     # doctest: +SKIP
    """

    default_field = "npy"

    def decode(self, data: bytes, key: str) -> torch.Tensor:
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            if "allow_pickle" in str(e) or "Object arrays" in str(e):
                raise UnsafeFieldError("array holds Python objects; loading it would unpickle data, "
                                       "which can run code: refused") from None
            raise
        return torch.from_numpy(np.ascontiguousarray(array))
