"""img2dataset's webdataset output read in place: a folder of ``NNNNN.tar`` shards, each with
``NNNNN.parquet`` (one row per URL, downloaded or not) and ``NNNNN_stats.json`` beside it.

Each shard's sample count is its ``_stats.json``'s ``successes`` (known when the dataset
opens); its keys and offsets come from its tar headers when it is first read (``tarfile`` seeks
over the data; nothing is written into the folder). Every sample's fields are what img2dataset
wrote: the image (``jpg``, ``webp`` or ``png``, as ``--encode_format`` chose), ``txt`` with the
caption when there was a caption column, and ``json`` with the metadata (``url``, ``caption``,
``key``, ``status``, ``width``, ``height``, ``original_width``, ``original_height``,
``exif``...), readable with :class:`~mmloader.JSONReader` and usable in filters
(``select(where="meta.width >= 256")``).

>>> ds = Img2DatasetStore("laion-out/"); ds[0]["json"]   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ...errors import FormatError
from ..tar.store import TarStore
from .external_index import ExternalIndexStore, shard_fields, walk_shard


def is_img2dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is img2dataset's webdataset output (tars with ``_stats.json`` beside them)."""
    p = Path(path)
    return p.is_dir() and any(p.glob("*_stats.json")) and any(p.glob("*.tar"))


class Img2DatasetStore(ExternalIndexStore, TarStore):
    """img2dataset's output folder; see the module's text.

    Args:
        path: the output folder.
        check_headers: check each member's tar header as it is read (see :class:`TarStore`).
    """

    indexed_by = "img2dataset"

    def __init__(self, path: str | os.PathLike, check_headers: bool = True):
        root = Path(path).resolve()
        self.path, self.check_headers, self.verify_checksums = str(root), check_headers, False
        shards: list[tuple[str, int]] = []
        for tar in sorted(root.glob("*.tar")):
            stats_file = tar.with_name(tar.stem + "_stats.json")
            if not stats_file.is_file():
                raise FormatError(
                    f"{tar} has no {stats_file.name} beside it: img2dataset writes it when a shard is complete "
                    "(an interrupted run leaves shards without one: run img2dataset again, or remove the shard)"
                )
            try:
                stats = json.loads(stats_file.read_text())
                count = int(stats["successes"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise FormatError(f"{stats_file}: not img2dataset's shard statistics ({e})") from None
            if count:
                shards.append((tar.name, count))
        if not shards:
            raise FormatError(
                f"{root}: img2dataset downloaded no image into any shard (every _stats.json: 0 successes)"
            )
        self._reset_handles()
        # img2dataset writes the same fields for every sample (a shard that differs is an error
        # when it is read): the first sample's are the dataset's
        fields = shard_fields(root / shards[0][0], first_sample=True)
        if not fields:
            raise FormatError(f"shard {root / shards[0][0]} holds no sample")
        total = sum(c for _n, c in shards)
        self._setup(shards, fields, {f: total for f in fields})

    def shard_table(self, s: int) -> tuple[list[str], np.ndarray]:
        keys, table = walk_shard(self.shard_path(s), self.metadata["fields"])
        missing = np.flatnonzero((table[..., 0] < 0).any(axis=1))
        if len(missing):
            row = int(missing[0])
            absent = [f for c, f in enumerate(self.metadata["fields"]) if table[row, c, 0] < 0]
            raise FormatError(
                f"shard {self.shard_path(s)}: sample {keys[row]!r} lacks {', '.join(absent)}, which img2dataset writes "
                "for every sample: the shard was not written by img2dataset, or was changed"
            )
        return keys, table

    def index_of(self, key: str) -> int | None:
        # img2dataset's keys begin with their shard's number (shard 00012: "00012" + row)
        starts = self.metadata["_starts"]
        # only the shards whose number begins the key: a key of no shard walks none
        for s in (s for s in range(len(self.shards)) if key.startswith(Path(self.shards[s]["file"]).stem)):
            keys = self._keys_of(s)
            if key in keys:
                return starts[s] + keys.index(key)
        return None
