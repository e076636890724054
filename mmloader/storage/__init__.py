"""Storage formats: LMDB environments and tar-shard directories, bytes in and bytes out."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import FormatError
from .base import KeysView, Store
from .lmdb_store import LMDBStore, LMDBWriter
from .shard_index import MANIFEST
from .tar_store import TarStore, build_index
from .tar_writer import ShardWriter

__all__ = ["open_store", "Store", "KeysView", "LMDBStore", "LMDBWriter", "TarStore", "ShardWriter",
           "build_index", "writer_for"]


def open_store(path: str | os.PathLike | Store, **options) -> Store:
    """Open an LMDB dataset or a shard directory (or its ``index.json``); nothing is read yet.

    Shard options: ``check_headers`` (default True), ``verify_checksums`` (default False).

    >>> ds = open_store("data.lmdb"); len(ds)    # doctest: +SKIP
    """
    if isinstance(path, Store):
        return path
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset {p} does not exist")
    if p.is_dir() and (p / "data.mdb").is_file():
        return LMDBStore(p)
    if (p.is_dir() and (p / MANIFEST).is_file()) or (p.is_file() and p.suffix == ".json"):
        return TarStore(p, **options)
    if p.is_dir() and (any(p.glob("*.tar")) or any(p.glob("*.tgz")) or any(p.glob("*.tar.gz"))):
        raise FormatError(f"{p} holds tar shards but no {MANIFEST}: run `mmloader index {p}` first")
    raise FormatError(f"{p} is neither an mmloader LMDB dataset (data.mdb) nor a shard directory "
                      f"({MANIFEST})")


def writer_for(path: str | os.PathLike, format: str | None = None, **kwargs):
    """An :class:`LMDBWriter` or :class:`ShardWriter` for ``path``.

    ``format`` is ``"lmdb"`` or ``"tar"``; by default a ``.lmdb`` suffix means LMDB.
    ``shard_size``/``shard_bytes`` apply to tar only.
    """
    fmt = format or ("lmdb" if str(path).rstrip("/").endswith(".lmdb") else "tar")
    shard_size = kwargs.pop("shard_size", None)
    shard_bytes = kwargs.pop("shard_bytes", None)
    if fmt == "lmdb":
        return LMDBWriter(path, **kwargs)
    if fmt == "tar":
        if shard_size:
            kwargs["max_samples"] = shard_size
        if shard_bytes:
            kwargs["max_bytes"] = shard_bytes
        return ShardWriter(path, **kwargs)
    raise ValueError(f"unknown format {fmt!r}: expected 'lmdb' or 'tar'")
