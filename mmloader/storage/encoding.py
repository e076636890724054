"""Turn user values into the bytes a field stores. Never pickle."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from ..errors import MMLoaderError


def encode_value(field: str, value: Any) -> bytes:
    """Bytes for ``value``: bytes as given, str as UTF-8, int as ASCII, dict/list as JSON, arrays as .npy.

    >>> encode_value("cls", 3)
    b'3'
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        raise MMLoaderError(f"field {field!r}: refusing to guess how to store a bool; pass int or str")
    if isinstance(value, (int, np.integer)):
        return str(int(value)).encode("ascii")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise MMLoaderError(f"field {field!r}: object arrays would need pickle; refusing")
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if hasattr(value, "numpy") and hasattr(value, "dtype"):  # torch.Tensor without importing torch
        return encode_value(field, value.detach().cpu().numpy())
    raise MMLoaderError(
        f"field {field!r}: cannot store a {type(value).__name__}; "
        "pass bytes, str, int, dict/list (JSON) or a numpy array"
    )


def split_sample(sample: dict) -> tuple[str, dict[str, bytes]]:
    """(key, {field: bytes}) from a writer's input dict with a ``__key__`` entry."""
    try:
        key = sample["__key__"]
    except KeyError:
        raise MMLoaderError(f"sample has no '__key__' entry (fields: {sorted(sample)})") from None
    fields = {f: encode_value(f, v) for f, v in sample.items() if not f.startswith("__")}
    if not fields:
        raise MMLoaderError(f"sample {key!r} has no fields")
    return key, fields
