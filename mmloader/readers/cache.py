"""A bounded LRU cache of decoded samples, with a byte budget and statistics."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any

import torch


def nbytes(value: Any) -> int:
    """Approximate memory held by a decoded value (tensors by their storage, containers recursively)."""
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement() + 64
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) + 49
    if isinstance(value, dict):
        return sum(nbytes(k) + nbytes(v) for k, v in value.items()) + 64
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value) + 56
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if hasattr(value, "size") and hasattr(value, "mode"):  # PIL image
        return value.size[0] * value.size[1] * len(value.getbands())
    return sys.getsizeof(value)


def fresh_copy(value: Any) -> Any:
    """A copy of a cached value that the caller may change in place: tensors cloned, PIL images
    and containers copied; immutable values (str, int, bytes...) returned as they are."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: fresh_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fresh_copy(v) for v in value]
    if isinstance(value, tuple):
        return type(value)(*map(fresh_copy, value)) if hasattr(value, "_fields") else tuple(map(fresh_copy, value))
    if hasattr(value, "copy") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
        return value.copy()
    if hasattr(value, "copy") and hasattr(value, "dtype"):  # a numpy array
        return value.copy()
    return value


class SampleCache:
    """Keeps the most recently used samples within ``max_bytes`` (per process).

    Each DataLoader worker holds its own cache, so the total is workers x max_bytes. ``zip``
    keeps samples here as decoded, before transforms, and hands out copies, so random and
    in-place transforms run on fresh values every time.

    >>> cache = SampleCache(max_bytes=512 << 20)
    >>> ds = mmloader.zip(image=..., caption=..., cache=cache)    # doctest: +SKIP
    >>> cache.stats()["hits"]                                     # doctest: +SKIP
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = self.hits = self.misses = self.evictions = 0

    def get(self, key: Any) -> Any | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return hit[0]

    def put(self, key: Any, value: Any) -> None:
        size = nbytes(value)
        with self._lock:
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _k, (_v, s) = self._items.popitem(last=False)
                self.bytes -= s
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "items": len(self._items),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
        }

    def __getstate__(self) -> dict:  # workers start with an empty cache, not a copy of ours
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["max_bytes"])
