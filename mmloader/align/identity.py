"""What identifies a dataset in a resume state: its size and a digest of the samples it holds.

A state saved by a loader names the plan it belongs to; a dataset is part of that plan
through its fingerprint, so a source replaced by another of the same size, or a filter
that keeps other samples, is seen as a change (and never resumed into silently).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def dataset_fingerprint(dataset: Any) -> str:
    """A digest of which samples ``dataset`` holds (not of where it is stored: a dataset moved
    from disk to object storage keeps it).

    Datasets with a ``fingerprint()`` method (:class:`mmloader.align.zip.Zipped`) give theirs;
    others with key views the keys' digest; anything else only its type and length, which
    cannot tell two datasets of the same size apart.

    Args:
        dataset: a map-style dataset.
    """
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    keys = getattr(dataset, "keys", None)
    if keys is not None and callable(getattr(keys, "fingerprint", None)):
        return str(keys.fingerprint())
    return f"{type(dataset).__qualname__}:{len(dataset)}"


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
    """How a callable option is recorded in a state: its module and qualified name."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
