"""A dataset prepared by Megatron-Energon (``energon prepare``) read in place: its tar shards
with the ``.nv-meta/`` folder beside them.

What ``energon prepare`` wrote is honoured as Energon reads it: the shards and sample counts of
``.nv-meta/.info.json`` (``.info.yaml`` before), the split's shards from ``split.yaml`` (or
``split.json``; brace patterns expanded), its ``exclude`` list (a shard name leaves the shard
out, ``shard.tar/KEY`` one sample), and the offsets of every sample's parts from
``index.sqlite`` (so no shard is scanned); a dataset prepared before ``index.sqlite`` existed
has its shards' headers walked instead. The split is ``train`` unless ``split=`` names another.

>>> ds = EnergonStore("coco-wds/", split="val"); ds[0]["jpg"][:2], ds.fields   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from ...errors import FormatError
from ..tar.store import TarStore
from .external_index import ExternalIndexStore, shard_samples, walk_shard

META = ".nv-meta"
#: query parameters per SQL statement (SQLite builds allow 999 at least)
_BATCH = 500


def expand_braces(pattern: str) -> list[str]:
    """A pattern expanded as Energon expands it (``braceexpand``, which webdataset brings):
    ``{000..002}``, ``{a,b}``, nested and stepped ranges.

    Args:
        pattern: a name with brace patterns.

    >>> expand_braces("p/{000..002}.tar"), expand_braces("{a,b}{1..2}")
    (['p/000.tar', 'p/001.tar', 'p/002.tar'], ['a1', 'a2', 'b1', 'b2'])
    """
    from braceexpand import braceexpand

    return list(braceexpand(pattern))


def is_energon(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder ``energon prepare`` prepared."""
    meta = Path(path) / META
    return meta.is_dir() and any((meta / n).is_file() for n in (".info.json", ".info.yaml"))


def _load(path: Path):
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise FormatError(f"{path}: unreadable Energon metadata ({e})") from None


class EnergonStore(ExternalIndexStore, TarStore):
    """A prepared Energon dataset; see the module's text.

    Args:
        path: the dataset folder (holding ``.nv-meta/``).
        split: the split part to read (``train``, ``val``, ``test``: those ``split.yaml`` names).
        split_config: the split file in ``.nv-meta/`` (Energon's ``split_config``).
        check_headers: check each member's tar header as it is read (see :class:`TarStore`).
    """

    indexed_by = "energon prepare"

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        split_config: str = "split.yaml",
        check_headers: bool = True,
    ):
        root = Path(path).resolve()
        self.path, self.split, self.check_headers, self.verify_checksums = str(root), split, check_headers, False
        self.split_config = split_config
        meta = root / META
        info_file = next((meta / n for n in (".info.json", ".info.yaml") if (meta / n).is_file()), None)
        if info_file is None:
            raise FormatError(f"{root} has no {META}/.info.json: prepare it with `energon prepare {root}`")
        info = _load(info_file)
        counts = info.get("shard_counts") if isinstance(info, dict) else None
        if not isinstance(counts, dict) or not counts:
            raise FormatError(f"{info_file}: no shard_counts (not written by energon prepare?)")
        self.all_shards = list(counts)  # index.sqlite's tar_file_id is the position here
        self._ids = {name: i for i, name in enumerate(self.all_shards)}
        split_file = meta / split_config
        if not split_file.is_file() and split_config == "split.yaml" and (meta / "split.json").is_file():
            split_file = meta / "split.json"
        splits = _load(split_file) if split_file.is_file() else None
        if not isinstance(splits, dict) or not isinstance(splits.get("split_parts"), dict):
            raise FormatError(
                f"{split_file}: no split_parts (run `energon prepare` with --split-ratio or --split-parts)"
            )
        parts = splits["split_parts"]
        if split not in parts:
            raise FormatError(f"{root}: no split {split!r} in {split_file.name} (splits: {', '.join(parts)})")
        excludes = {e for pattern in splits.get("exclude") or [] for e in expand_braces(str(pattern))}
        names = [n for pattern in parts[split] or [] for n in expand_braces(str(pattern)) if n not in excludes]
        unknown = [n for n in names if n not in counts]
        if unknown:
            raise FormatError(
                f"{split_file}: split {split!r} names shards {unknown[:3]} that {info_file.name} does not list"
            )
        if not names:
            raise FormatError(f"{root}: split {split!r} holds no shards (after excludes)")
        # sample excludes: "shard.tar/KEY", compared whole as Energon compares them (a key, or a
        # shard's folder, may hold "/" too)
        samples_out = {e for e in excludes if "/" in e}
        self.excluded: dict[str, set[str]] = {}
        for n in names:
            keys = {e[len(n) + 1 :] for e in samples_out if e.startswith(n + "/")}
            if keys:
                self.excluded[n] = keys
        self.sqlite = str(meta / "index.sqlite") if (meta / "index.sqlite").is_file() else None
        self.files = names
        self._positions = {name: i for i, name in enumerate(names)}
        self._reset_handles()
        fields, field_counts, dropped = self._survey(names, {n: int(counts[n]) for n in names})
        self._setup([(n, int(counts[n]) - dropped.get(n, 0)) for n in names], fields, field_counts)

    def __repr__(self) -> str:
        return f"EnergonStore({self.path!r}, split={self.split!r})"

    def identity(self) -> tuple:
        """What tells this store from another: the folder and the split read."""
        return (self.format, self.path, self.split, self.split_config)

    # -- the index ---------------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        if getattr(self, "_conn_pid", None) != os.getpid() or getattr(self, "_conn", None) is None:
            uri = "file:" + Path(self.sqlite or "").as_posix() + "?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._conn_pid = os.getpid()
        return self._conn

    def _tar_id(self, name: str) -> int:
        return self._ids[name]

    def _survey(self, names: list[str], counts: dict[str, int]) -> tuple[list[str], dict[str, int], dict[str, int]]:
        """(fields, samples having each, excluded samples per shard) of the split."""
        dropped: dict[str, int] = {}
        if self.sqlite is None:  # an older preparation: every shard's headers walked, once
            seen: set[str] = set()  # an excluded sample's fields too: the shard still holds them
            totals: dict[str, int] = {}
            for n in names:
                gone = self.excluded.get(n, ())
                dropped[n] = 0
                for key, offsets in shard_samples(os.path.join(self.path, n)):
                    seen.update(offsets)
                    if key in gone:
                        dropped[n] += 1
                        continue
                    for f in offsets:
                        totals[f] = totals.get(f, 0) + 1
            return sorted(seen), {f: totals.get(f, 0) for f in sorted(seen)}, dropped
        db = self._db()
        ids = [self._tar_id(n) for n in names]
        totals = {}
        try:
            for at in range(0, len(ids), _BATCH):
                batch = ids[at : at + _BATCH]
                for part, count in db.execute(
                    f"SELECT part_name, COUNT(*) FROM sample_parts WHERE tar_file_id IN ({','.join('?' * len(batch))}) "
                    "GROUP BY part_name",
                    batch,
                ):
                    totals[part] = totals.get(part, 0) + int(count)
            for n in names:
                out = sorted(self.excluded.get(n, ()))
                if not out:
                    continue
                tid, rows = self._tar_id(n), []
                for at in range(0, len(out), _BATCH):
                    chunk = out[at : at + _BATCH]
                    rows += db.execute(
                        f"SELECT sample_index FROM samples WHERE tar_file_id = ? AND sample_key IN "
                        f"({','.join('?' * len(chunk))})",
                        [tid, *chunk],
                    ).fetchall()
                dropped[n] = len(rows)
                for (index,) in rows:
                    for (part,) in db.execute(
                        "SELECT part_name FROM sample_parts WHERE tar_file_id = ? AND sample_index = ?", (tid, index)
                    ):
                        totals[part] -= 1
        except sqlite3.Error as e:
            raise FormatError(f"{self.sqlite}: unreadable Energon index ({e}): run `energon prepare` again") from None
        return sorted(totals), totals, dropped

    def shard_table(self, s: int) -> tuple[list[str], np.ndarray]:
        name = self.files[s]
        fields = self.metadata["fields"]
        gone = self.excluded.get(name, set())
        if self.sqlite is None:
            keys, table = walk_shard(self.shard_path(s), fields)
        else:
            tid, db = self._tar_id(name), self._db()
            column = {f: c for c, f in enumerate(fields)}
            try:
                samples = db.execute(
                    "SELECT sample_index, sample_key FROM samples WHERE tar_file_id = ? ORDER BY sample_index", (tid,)
                ).fetchall()
                table = np.full((len(samples), len(fields), 2), -1, dtype=np.int64)
                row_of = {index: r for r, (index, _k) in enumerate(samples)}
                for index, part, offset, size in db.execute(
                    "SELECT sample_index, part_name, content_byte_offset, content_byte_size FROM sample_parts "
                    "WHERE tar_file_id = ?",
                    (tid,),
                ):
                    table[row_of[index], column[part]] = (offset, size)
            except (sqlite3.Error, KeyError) as e:
                raise FormatError(f"{self.sqlite}: shard {name}: unreadable Energon index ({e})") from None
            keys = [k for _i, k in samples]
        if gone:
            keep = np.array([k not in gone for k in keys], dtype=bool)
            keys, table = [k for k, ok in zip(keys, keep) if ok], table[keep]
        return keys, table

    def index_of(self, key: str) -> int | None:
        starts = self.metadata["_starts"]
        if self.sqlite is not None:
            hits = self._db().execute("SELECT tar_file_id FROM samples WHERE sample_key = ?", (key,)).fetchall()
            names = [self.all_shards[t] for (t,) in hits]
            candidates: Sequence[int] = [
                self._positions[n] for n in names if n in self._positions and key not in self.excluded.get(n, ())
            ]
        else:
            candidates = range(len(self.files))
        for s in candidates:
            keys = self._keys_of(s)
            if key in keys:
                return starts[s] + keys.index(key)
        return None
