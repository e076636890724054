"""Write the manifest (``index.json``), per-shard offset indexes and the key index.

Per shard, ``<shard>.idx.npy`` is an int64 array of shape (samples, fields, 2)
holding each field's data offset and size (-1 when absent), so sample *i* is one
``pread`` with no scan, and a reader can start anywhere. ``keys.npy`` (fixed-width
bytes) and ``keys.order.npy`` (argsort) give key <-> index with a binary search.
All are loaded with ``mmap_mode="r"``: per-process memory does not grow with the
number of samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, cast

import numpy as np
from tqdm import tqdm

from ...errors import DuplicateKeyError, FormatError
from ..meta import TAR_FORMAT, FieldStats, make_metadata
from .stages import group_samples, is_compressed, tar_members

MANIFEST = "index.json"
KEYS_FILE = "keys.npy"
KEY_ORDER_FILE = "keys.order.npy"


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


class ShardIndexBuilder:
    """Collects samples shard by shard, then writes every index file.

    Keys go to a temporary file as they come (not a Python list), and become a
    fixed-width numpy array in :meth:`finish`.
    """

    def __init__(self, out_dir: str | os.PathLike, *, unique_keys: bool = True):
        self.out_dir = Path(out_dir)
        self.unique_keys = unique_keys
        self.shards: list[dict] = []
        self.stats = FieldStats()
        self.count = 0
        self._keyfile = tempfile.TemporaryFile(dir=self.out_dir)
        self._max_key = 1
        self._rows: list[dict[str, tuple[int, int]]] = []
        self._shard_fields: dict[str, int] = {}

    def add_sample(
        self, key: str, offsets: dict[str, tuple[int, int]], sizes_for_stats: dict[str, bytes] | None = None
    ):
        kb = key.encode("utf-8")
        self._keyfile.write(kb + b"\n")
        self._max_key = max(self._max_key, len(kb))
        for f in offsets:
            if f not in self._shard_fields:
                self._shard_fields[f] = len(self._shard_fields)
        self._rows.append(offsets)
        if sizes_for_stats is not None:
            self.stats.add(sizes_for_stats)
        else:
            for f, (_o, size) in offsets.items():
                self.stats.count[f] = self.stats.count.get(f, 0) + 1
                self.stats.nbytes[f] = self.stats.nbytes.get(f, 0) + size
        self.count += 1

    def end_shard(self, file: str, nbytes: int, sha256: str, compressed: bool = False) -> None:
        fields = list(self._shard_fields)
        table = np.full((len(self._rows), len(fields), 2), -1, dtype=np.int64)
        for r, offsets in enumerate(self._rows):
            for f, (o, s) in offsets.items():
                table[r, self._shard_fields[f]] = (o, s)
        idx_name = Path(file).name + ".idx.npy"
        _save_npy(self.out_dir / idx_name, table)
        self.shards.append(
            {
                "file": file,
                "count": len(self._rows),
                "bytes": nbytes,
                "sha256": sha256,
                "compressed": compressed,
                "fields": fields,
                "index": idx_name,
            }
        )
        self._rows, self._shard_fields = [], {}

    def finish(self, user_metadata: dict | None = None, **extra) -> dict:
        n = self.count
        keys = np.empty(n, dtype=f"S{self._max_key}")
        self._keyfile.seek(0)
        for i, line in enumerate(self._keyfile):
            keys[i] = line[:-1]
        self._keyfile.close()
        order = np.argsort(keys, kind="stable")
        if n > 1:
            same = keys[order[1:]] == keys[order[:-1]]
            if same.any():
                dup = keys[order[1:][same][0]].decode()
                if self.unique_keys:
                    raise DuplicateKeyError(f"duplicate sample key {dup!r} in {self.out_dir}")
                extra.setdefault("duplicate_keys", int(same.sum()))
        _save_npy(self.out_dir / KEYS_FILE, keys)
        _save_npy(self.out_dir / KEY_ORDER_FILE, order.astype(np.int64))
        manifest = make_metadata(
            TAR_FORMAT,
            n,
            self.stats,
            user_metadata,
            keys=KEYS_FILE,
            key_order=KEY_ORDER_FILE,
            shards=self.shards,
            **extra,
        )
        tmp = self.out_dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
        os.replace(tmp, self.out_dir / MANIFEST)  # the manifest appears last: its presence means complete
        return manifest


def build_index(
    directory: str | os.PathLike,
    output: str | os.PathLike | None = None,
    pattern: tuple[str, ...] = ("*.tar", "*.tgz", "*.tar.gz"),
    progress: bool = True,
) -> dict:
    """Index tar shards written by any tool: manifest + offset indexes + key index.

    Shards are read sequentially once (compressed ones too). ``output`` defaults to
    ``directory``, and then the manifest holds no local path (the folder may be published);
    when it differs, the manifest refers to the shards, and to ``directory`` as
    ``indexed_from``, by absolute path (an index of this machine's files). (URLs:
    :func:`mmloader.storage.build_index`.)

    Args:
        directory: the folder of shards.
        output: where the index goes (default: beside the shards).
        pattern: which files are shards.
        progress: show a progress bar.

    >>> build_index("foreign-shards/", output="foreign-index/")   # doctest: +SKIP
    """
    src = Path(directory).resolve()
    out = Path(output).resolve() if output else src
    if not src.is_dir():
        raise FormatError(f"{src} is not a directory")
    files = sorted({p for pat in pattern for p in src.glob(pat)})
    if not files:
        raise FormatError(f"{src} holds no tar shards matching {', '.join(pattern)}")
    out.mkdir(parents=True, exist_ok=True)
    builder = ShardIndexBuilder(out, unique_keys=False)
    for path in tqdm(files, desc="indexing shards", unit="shard", disable=not progress):
        index_shard(builder, path, path.name if out == src else str(path))
    if out == src:
        return builder.finish()
    return builder.finish(indexed_from=str(src))


def index_shard(builder: ShardIndexBuilder, path: str | os.PathLike, file: str, where: str | None = None) -> None:
    """Read one tar shard at ``path`` sequentially (hashing it on the way) and add its samples and
    offsets to ``builder`` under the name ``file``."""
    path = Path(path)
    where = where or str(path)
    compressed = is_compressed(path)
    h = hashlib.sha256()

    class _Tee:  # hash the raw file while tarfile reads it: one pass
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            b = self.f.read(n)
            h.update(b)
            return b

    with open(path, "rb") as raw:
        tee = _Tee(raw)
        try:
            for sample in group_samples(tar_members(path, with_data=False, fileobj=cast(IO[bytes], tee)), where=where):
                builder.add_sample(sample["__key__"], sample["__offsets__"])
        except Exception as e:  # tarfile.ReadError, EOFError, zlib.error ...
            raise FormatError(f"shard {where} is not a readable tar file: {e}") from e
        while raw_bytes := raw.read(1 << 22):  # trailing padding tarfile did not read
            h.update(raw_bytes)
    builder.end_shard(file, path.stat().st_size, h.hexdigest(), compressed=compressed)
