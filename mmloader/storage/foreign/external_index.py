"""Tar shards that another tool indexed (Megatron-Energon, img2dataset): :class:`TarStore`'s
reads, with the manifest built in memory from that tool's metadata and each shard's offset
table and keys made on first use, in the process that reads — nothing is written beside the
shards, and nothing of the dataset is held beyond the shards in use.

A subclass gives the shards and their sample counts (known when the dataset opens: the plan
needs them), the fields and how many samples have each, and :meth:`shard_table` (a shard's keys
and offsets). A shard whose table disagrees with the counts the dataset opened with is a
:class:`~mmloader.errors.FormatError` naming it: a plan is never run over other samples than
it was made for.
"""

from __future__ import annotations

import os
import tarfile
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ...errors import FormatError
from ..tar.stages import group_samples

#: Shards whose keys and offsets a process keeps (16 bytes per sample and field, plus the keys).
MAX_TABLES = 64


def shard_samples(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, tuple[int, int]]]]:
    """Each sample of an uncompressed tar as (key, {field: (data offset, size)}), in tar order,
    from its headers alone (``tarfile`` seeks over the data).

    Args:
        path: the shard.
    """
    try:
        with tarfile.open(str(path), mode="r:") as tf:
            members = []
            for member in tf:
                tf.members = []  # type: ignore[attr-defined]  # tarfile keeps every header otherwise
                if member.isreg():
                    members.append((member.name, member.offset_data, member.size, None))
    except (tarfile.TarError, EOFError, OSError) as e:
        raise FormatError(f"shard {path} is not a readable tar file: {e}") from None
    for sample in group_samples(members, where=str(path)):
        yield sample["__key__"], sample["__offsets__"]


def walk_shard(path: str | os.PathLike, fields: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Keys and the ``(samples, fields, 2)`` offset table (data offset, size; -1: absent) of an
    uncompressed tar, from its headers alone.

    Args:
        path: the shard.
        fields: the offset table's columns.
    """
    column = {f: c for c, f in enumerate(fields)}
    keys: list[str] = []
    rows: list[list[tuple[int, int]]] = []
    for key, offsets in shard_samples(path):
        row = [(-1, -1)] * len(fields)
        for f, (offset, size) in offsets.items():
            if f not in column:
                raise FormatError(
                    f"shard {path}: sample {key!r} has field {f!r}, which the dataset's metadata does not list ({', '.join(fields)})"
                )
            row[column[f]] = (offset, size)
        keys.append(key)
        rows.append(row)
    return keys, np.asarray(rows, dtype=np.int64).reshape(len(rows), len(fields), 2)


def shard_fields(path: str | os.PathLike, first_sample: bool = False) -> list[str]:
    """The fields (member extensions) of an uncompressed tar, from its headers alone: of every
    sample, or of the first one only.

    Args:
        path: the shard.
        first_sample: stop after the first sample's members.
    """
    from ..tar.stages import split_member_name

    key, fields = None, set()
    try:
        with tarfile.open(str(path), mode="r:") as tf:
            for member in tf:
                tf.members = []  # type: ignore[attr-defined]  # tarfile keeps every header otherwise
                split = split_member_name(member.name) if member.isreg() else None
                if split is None:
                    continue
                if first_sample and key is not None and split[0] != key:
                    break
                key = split[0]
                fields.add(split[1])
    except (tarfile.TarError, EOFError, OSError) as e:
        raise FormatError(f"shard {path} is not a readable tar file: {e}") from None
    return sorted(fields)


class ExternalIndexStore:
    """The part of an externally indexed store that :class:`TarStore` lacks; mixed in before it.

    Subclasses set ``self.path`` and call :meth:`_setup` from ``__init__``, and define
    :meth:`shard_table` and :meth:`index_of`.
    """

    path: str
    _meta: dict | None
    check_headers: bool
    verify_checksums: bool
    #: what indexed the shards, for messages ("energon prepare", "img2dataset")
    indexed_by = "another tool"

    def _setup(self, shards: list[tuple[str, int]], fields: list[str], field_counts: dict[str, int]) -> None:
        """The manifest, in memory: ``shards`` as (file, sample count), in dataset order."""
        starts = np.concatenate([[0], np.cumsum([c for _f, c in shards], dtype=np.int64)]).astype(np.int64)
        self._meta = {
            "format": "mmloader-tar",
            "count": int(starts[-1]),
            "fields": list(fields),
            "field_counts": dict(field_counts),
            "shards": [{"file": f, "count": int(c), "fields": list(fields), "compressed": False} for f, c in shards],
            "indexed_by": self.indexed_by,
            "_starts": starts.tolist(),
            "_starts_array": starts,
            "_columns": [{f: i for i, f in enumerate(fields)}] * len(shards),
        }
        self.manifest_path = Path(self.path)  # named in messages: the dataset folder
        self._reset_handles()  # type: ignore[attr-defined]  # TarStore's

    def _reset_handles(self) -> None:
        super()._reset_handles()  # type: ignore[misc]
        self._shard_keys: OrderedDict[int, list[str]] = OrderedDict()

    #: per-process state (descriptors, caches, connections): never pickled
    _PER_PROCESS = ("_lock", "_pid", "_fds", "_closing", "_idx", "_keys", "_order", "_shard_keys", "_conn", "_conn_pid")

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._PER_PROCESS}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_handles()

    @property
    def metadata(self) -> dict:
        assert self._meta is not None
        return self._meta

    def shard_table(self, s: int) -> tuple[list[str], np.ndarray]:
        """Shard ``s``'s keys and ``(samples, fields, 2)`` offset table, in dataset order."""
        raise NotImplementedError

    def _shard_index_locked(self, s: int) -> np.ndarray:
        table = self._idx.get(s)  # type: ignore[attr-defined]
        if table is None:
            keys, table = self.shard_table(s)
            want = self.metadata["shards"][s]["count"]
            if len(keys) != want or table.shape[0] != want:
                raise FormatError(
                    f"shard {self.shard_path(s)} holds {len(keys)} samples, but {self.indexed_by}'s metadata "  # type: ignore[attr-defined]
                    f"lists {want}: the shard was changed after it was indexed (index it again)"
                )
            table.flags.writeable = False
            self._idx[s], self._shard_keys[s] = table, keys  # type: ignore[attr-defined]
            while len(self._idx) > MAX_TABLES:  # type: ignore[attr-defined]
                old, _ = self._idx.popitem(last=False)  # type: ignore[attr-defined]
                self._shard_keys.pop(old, None)
        else:
            self._idx.move_to_end(s)  # type: ignore[attr-defined]
        return table

    def _keys_of(self, s: int) -> list[str]:
        self._shard_index(s)  # type: ignore[attr-defined]  # makes the keys too
        with self._lock:  # type: ignore[attr-defined]
            keys = self._shard_keys.get(s)
        if keys is None:  # dropped by another thread between the two steps
            keys, _table = self.shard_table(s)
        return keys

    def _keys_at(self, idx: np.ndarray) -> list[str]:
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        starts = self.metadata["_starts_array"]
        shard_of = np.searchsorted(starts, idx, side="right") - 1
        return [self._keys_of(int(s))[int(i - starts[s])] for i, s in zip(idx.tolist(), shard_of.tolist())]

    def key(self, index: int) -> str:
        return self._keys_at(np.array([self._check_index(index)]))[0]  # type: ignore[attr-defined]

    def key_table(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, order) of every sample, built here (``verify`` and ``merge`` use it)."""
        keys = np.array(
            [k.encode() for s in range(len(self.metadata["shards"])) for k in self._keys_of(s)], dtype=np.bytes_
        )
        return keys, np.argsort(keys, kind="stable")

    def _key_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.key_table()
