"""Combine datasets converted in parts (``convert --part I/N``) into one, without re-encoding."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from ..errors import FormatError
from .atomic import AtomicDirectory
from .lmdb_store import LMDBWriter
from .shard_index import ShardIndexBuilder
from .tar_store import TarStore


def _user_metadata(stores) -> dict:
    first = stores[0].metadata.get("metadata", {})
    for s in stores[1:]:
        if s.metadata.get("metadata", {}) != first:
            raise FormatError(f"cannot merge: {s.path} has different metadata (e.g. class names) than "
                              f"{stores[0].path}")
    return dict(first)


def merge(parts: Sequence[str | os.PathLike], dst: str | os.PathLike, *, format: str | None = None,
          overwrite: bool = False, progress: bool = True) -> Path:
    """Concatenate ``parts`` in order into ``dst``.

    Shard parts: the shard files are hard-linked (or copied) and one manifest is
    written over all of them. LMDB parts: records are copied byte for byte.

    >>> merge(["out.part0", "out.part1"], "out")     # doctest: +SKIP
    """
    from . import open_store
    from .remote import is_url
    if is_url(str(dst)):  # merged locally, then uploaded, the manifest last
        import tempfile
        from .remote_write import _tmp_root, upload_existing, check_destination
        from .remote import Location
        fmt = format or ("lmdb" if str(dst).rstrip("/").lower().endswith(".lmdb") else None)
        for marker_fmt in ("tar", "lmdb"):
            check_destination(Location(str(dst)), marker_fmt, overwrite)
        with tempfile.TemporaryDirectory(prefix=".mmloader-merge-", dir=_tmp_root()) as tmp:
            local = merge(parts, os.path.join(tmp, "merged"), format=fmt, progress=progress)
            return upload_existing(local, str(dst), overwrite=overwrite, progress=progress)  # type: ignore[return-value]
    stores = [open_store(p) for p in parts]
    if any(is_url(str(p)) and s.format == "tar" for p, s in zip(parts, stores)):
        raise FormatError("merge reads tar parts from local folders; download remote parts first")
    fmt = format or ("tar" if all(isinstance(s, TarStore) for s in stores) else "lmdb")
    meta = _user_metadata(stores)
    total = sum(len(s) for s in stores)
    if fmt == "tar" and all(isinstance(s, TarStore) for s in stores):
        out = AtomicDirectory(dst, overwrite=overwrite)
        try:
            builder = ShardIndexBuilder(out.tmp)
            bar = tqdm(total=total, desc="merging", unit="sample", disable=not progress)
            n = 0
            for store in stores:
                keys, _ = store.key_table()
                for s, shard in enumerate(store.shards):
                    if shard["compressed"]:
                        raise FormatError(f"cannot merge compressed shard {store.shard_path(s)}")
                    name = f"data-{n:06d}.tar"
                    try:
                        os.link(store.shard_path(s), out.tmp / name)
                    except OSError:
                        shutil.copyfile(store.shard_path(s), out.tmp / name)
                    table = store.offset_table(s)
                    start = store.first_index(s)
                    for row in range(shard["count"]):
                        offsets = {f: (int(table[row, c, 0]), int(table[row, c, 1]))
                                   for c, f in enumerate(shard["fields"]) if table[row, c, 0] >= 0}
                        builder.add_sample(bytes(keys[start + row]).decode(), offsets)
                    builder.end_shard(name, shard["bytes"], shard["sha256"])
                    bar.update(shard["count"])
                    n += 1
            bar.close()
            builder.finish(meta, merged_from=[str(s.path) for s in stores])
            return out.commit()
        except BaseException:
            out.abort()
            raise
    if fmt != "lmdb":
        raise FormatError("tar output needs every part to be a shard directory")
    with LMDBWriter(dst, overwrite=overwrite, metadata=meta) as w:
        for store in stores:
            for i in tqdm(range(len(store)), desc=f"merging {Path(store.path).name}", unit="sample",
                          disable=not progress):
                rec = store.read(i)
                rec.pop("__index__")
                w.write(rec)
    return Path(dst).absolute()
