"""LMDB datasets on object storage: LMDB needs a local file, so ``NAME.lmdb/data.mdb`` is fetched
once per node into the shard cache (``cache_dir``; default ``$MMLOADER_CACHE_DIR`` or
``~/.cache/mmloader``), checked against its own metadata, then read as a local LMDB dataset.

The cached copy is keyed by the URL and the object's size and ETag, so a dataset replaced on the
server is fetched again; ranks and workers of one node share one copy (one download, the others
wait for it)."""
from __future__ import annotations

import os

from ..errors import FormatError
from .lmdb_store import KEYS_DB, LMDBStore
from .remote import Location, Policy, RemoteError
from .shard_cache import ShardCache, parse_limit

DATA = "data.mdb"


def open_remote_lmdb(url: str, *, storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                     cache_limit: int | str | None = None, progress: bool = True, retry_deadline: float | None = None,
                     request_timeout: float | None = None) -> LMDBStore:
    """The local copy of the LMDB dataset at ``url`` (fetched into the cache if needed)."""
    from tqdm import tqdm
    from .remote_tar import default_cache_dir
    loc = Location(url, storage_options or {}, Policy.from_env(retry_deadline=retry_deadline,
                                                               request_timeout=request_timeout))
    size, etag = loc.head(DATA, purpose="meta")
    if size is None:
        raise FormatError(f"{loc.url} is not an LMDB dataset: no {DATA} there")
    cache = ShardCache(cache_dir or default_cache_dir(), loc.url, parse_limit(cache_limit), tag=f"{size}-{etag}")
    hit = cache.lookup(DATA, size)
    if hit is None:
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"fetching {loc.url}", disable=not progress,
                  leave=False) as bar:
            hit = cache.fetch(DATA, size, lambda fd, prog: loc.download(DATA, fd, size, progress=prog, purpose="meta"),
                              wait=True, progress=bar.update)
        if hit is None:
            raise RemoteError(f"{loc.url}: {DATA} ({size} bytes) does not fit in the cache at {cache.root} "
                              f"(cache_limit={cache.limit}): raise cache_limit or free space")
    else:
        cache.touch(DATA, every=0)
    store = LMDBStore(hit.parent)
    try:
        _check(store)
    except FormatError as e:
        try:
            hit.unlink()  # a bad copy is not kept (the next open fetches it again)
        except OSError:
            pass
        raise FormatError(f"{loc.url}: the fetched copy does not match its metadata: {e}") from None
    store.url = loc.url  # type: ignore[attr-defined]
    return store


def _check(store: LMDBStore) -> None:
    """The environment holds what its metadata says: the key table and each field's record count."""
    meta = store.metadata
    env, dbs = store._env, store._dbs
    with env.begin() as txn:
        keys = txn.stat(dbs[KEYS_DB])["entries"]
        if keys != meta["count"]:
            raise FormatError(f"{keys} keys, metadata says {meta['count']}")
        for f, want in meta["field_counts"].items():
            db = dbs.get(f.encode())
            have = txn.stat(db)["entries"] if db is not None else 0
            if have != want:
                raise FormatError(f"field {f!r}: {have} records, metadata says {want}")
