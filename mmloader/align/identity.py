"""What identifies a dataset in a resume state: its size and a digest of the samples it holds.

A state saved by a loader names the plan it belongs to; a dataset is part of that plan
through its fingerprint, so a source replaced by another of the same size, or a filter
that keeps other samples, is seen as a change (and never resumed into silently).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def store_content(store: Any, samples: int = 64) -> str:
    """A digest of a store's content: its per-field counts, byte totals and checksums (what the
    writers record over every value), or, for a store without checksums, its count and every
    field of ``samples`` evenly spaced records.

    Args:
        store: an open store.
        samples: records read when the store keeps no checksums.
    """
    own = getattr(store, "content_digest", None)
    if callable(own):  # a store that can say it without reading samples (a table's footers)
        return own()
    meta = store.metadata
    if meta.get("field_crc32"):
        keep = {k: meta.get(k) for k in ("count", "field_counts", "field_bytes", "field_crc32")}
        return digest(json.dumps(keep, sort_keys=True, default=str))
    n = len(store)
    rows = sorted({round(j * (n - 1) / max(samples - 1, 1)) for j in range(min(samples, n))})
    parts: list[Any] = [n]
    for i in rows:
        record = store.read(i)
        parts += [
            f"{k}={bytes(v).hex() if isinstance(v, (bytes, memoryview)) else v}" for k, v in sorted(record.items())
        ]
    return digest(*parts)


def dataset_fingerprint(dataset: Any) -> str | None:
    """A digest of which samples ``dataset`` holds (not of where it is stored: a dataset moved
    from disk to object storage keeps it).

    Datasets with a ``fingerprint()`` method (:class:`mmloader.align.zip.Zipped`; give your own
    dataset one) give theirs; a store, the digest of its keys and content; anything else None:
    it cannot be told from another dataset of its size, and a resume says so.

    Args:
        dataset: a map-style dataset.
    """
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    keys = getattr(dataset, "keys", None)
    if keys is not None and callable(getattr(keys, "fingerprint", None)) and hasattr(dataset, "metadata"):
        return digest(keys.fingerprint(), store_content(dataset))
    return None


def digest(*parts: Any) -> str:
    """A short hex digest of strings, bytes and numpy arrays, in order."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, np.ndarray):
            h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        else:
            h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def callable_name(fn: Any) -> str:
    """How a callable option is recorded in a state: its module, qualified name and, for a
    Python function, a digest of its code (another lambda of the same name is another callable)."""
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    if code is None:
        return name
    return f"{name}@{digest(code.co_code, repr(code.co_consts), repr(code.co_names))[:12]}"
