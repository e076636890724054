"""The byte-level store interface both formats implement."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as _SequenceABC
from typing import Any, Iterator, Sequence

import numpy as np


class KeysView(_SequenceABC):
    """The sample keys of a store, read on demand: never a Python list of every key.

    >>> store.keys[0], "0001" in store.keys, len(store.keys)   # doctest: +SKIP
    """

    def __init__(self, store: "Store"):
        self._store = store

    def __len__(self) -> int:
        return len(self._store)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._store.key(j) for j in range(*i.indices(len(self)))]
        return self._store.key(i)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._store.index_of(key) is not None

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self._store.key(i)

    def index(self, key: str, *args) -> int:  # type: ignore[override]
        i = self._store.index_of(key)
        if i is None:
            raise ValueError(f"{key!r} is not a key of {self._store.path}")
        return i

    def fingerprint(self) -> str:
        """A digest of the whole key sequence: the count and every key, in order (a store may
        compute it faster, as ``key_digest()``; every store gives the same digest for the same
        keys, so readers of different formats compare)."""
        own = getattr(self._store, "key_digest", None)
        if callable(own):
            return str(own())
        h = key_hasher(len(self))
        for i in range(len(self)):
            h.update(b"\0" + self._store.key(i).encode())
        return h.hexdigest()


def key_hasher(count: int) -> Any:
    """The hash :meth:`KeysView.fingerprint` feeds ``b"\\0" + key`` for each key, in order."""
    return hashlib.blake2b(b"keys:" + str(count).encode(), digest_size=16)


class Store:
    """Map-style, bytes-only access to one dataset.

    ``store[i]`` -> ``{"__key__": key, "__index__": i, field: bytes, ...}``.
    Implementations open files lazily in the process that reads and pickle
    without handles, so they can be handed to DataLoader workers.
    """

    format: str = "?"
    path: str

    @property
    def metadata(self) -> dict:
        raise NotImplementedError

    @property
    def fields(self) -> list[str]:
        return list(self.metadata["fields"])

    @property
    def keys(self) -> KeysView:
        return KeysView(self)

    def __len__(self) -> int:
        raise NotImplementedError

    def key(self, index: int) -> str:
        raise NotImplementedError

    def field_values(self, indices: Sequence[int], field: str) -> list:
        """One field's stored bytes for each of ``indices`` (None where absent), without the
        keys: what filters over a whole column read (stores may do it faster than ``read_many``)."""
        return self.read_many(indices, [field])[1][field]

    def index_of(self, key: str) -> int | None:
        raise NotImplementedError

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """The shard each of ``rows`` lies in (what is read in one sequence): a shard dataset's
        files; in other formats, runs of 1024 consecutive rows."""
        rows = np.asarray(rows, dtype=np.int64)
        meta = self.metadata
        starts = meta.get("_starts_array") if isinstance(meta, dict) else None
        if starts is None:
            return rows // 1024
        return np.searchsorted(starts, rows, side="right") - 1

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def read_many(
        self, indices: Sequence[int], fields: Sequence[str], views: bool = False
    ) -> tuple[list[str], dict[str, list]]:
        """(keys, {field: [bytes or None per sample]}) for a batch of indices.

        ``views=True`` allows bytes-like views (``memoryview``) instead of ``bytes`` where a
        store can avoid a copy; callers consume them before the next read on this thread.
        """
        keys: list[str] = []
        columns: dict[str, list] = {f: [] for f in fields}
        for i in indices:
            rec = self.read(i, fields)
            keys.append(rec["__key__"])
            for f in fields:
                columns[f].append(rec.get(f))
        return keys, columns

    def field_size(self, index: int, field: str) -> int:
        """Stored byte size of one field of one sample (0 when absent)."""
        return len(self.read(index, [field]).get(field, b""))

    def field_sizes(self, indices: Sequence[int], field: str) -> np.ndarray:
        """:meth:`field_size` of many samples (int64 array); stores override it to batch the lookups."""
        return np.fromiter((self.field_size(int(i), field) for i in indices), dtype=np.int64, count=len(indices))

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.read(index)

    def get(self, key: str, fields: Sequence[str] | None = None) -> dict[str, Any]:
        i = self.index_of(key)
        if i is None:
            raise KeyError(f"no sample with key {key!r} in {self.path}")
        return self.read(i, fields)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self.read(i)

    def _check_index(self, index: int) -> int:
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for {self.path} ({n} samples)")
        return i

    def _check_indices(self, indices: Sequence[int]) -> list[int]:
        """A batch's indices as ints, checked by min/max (the bounds of each only when some is out)."""
        idx = [int(i) for i in indices]
        n = len(self)
        if idx and not (0 <= min(idx) and max(idx) < n):
            return [self._check_index(i) for i in idx]  # negative ones wrap; the first bad one raises
        return idx

    def reads_object_storage(self) -> bool:
        """Whether this store reads object storage where its samples are read (obstore, whose
        runtime does not survive ``fork()``: worker processes are then started, not forked)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"
