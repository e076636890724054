"""LMDB datasets on object storage: LMDB needs a local file, so ``NAME.lmdb/data.mdb`` is fetched
once per node into the shard cache (``cache_dir``; default ``$MMLOADER_CACHE_DIR`` or
``~/.cache/mmloader``), checked against its own metadata, then read as a local LMDB dataset.

The cached copy is keyed by the URL and the object's size and ETag, so a dataset replaced on the
server is fetched again; ranks and workers of one node share one copy (one download, the others
wait for it)."""

from __future__ import annotations

import contextlib
import contextvars
import os

from ...errors import FormatError
from ..lmdb.fork_gate import FORK_GATE
from ..lmdb.store import KEYS_DB, LMDBStore, check_lmdb_file, lmdb_required_size
from . import Location, Policy, RemoteError
from .shard_cache import ShardCache, default_cache_dir, parse_limit

DATA = "data.mdb"

#: Whether storage work shows progress bars when its caller does not say (``progress=None``):
#: the CLI's ``-q`` turns them off for a whole command (:func:`progress_bars`).
_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("mmloader_progress", default=True)


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """Within the block, storage progress bars not asked for explicitly (the fetch of an LMDB
    copy, uploads) follow ``enabled``.

    >>> with progress_bars(False):
    ...     show_progress(None), show_progress(True)
    (False, True)
    """
    token = _PROGRESS.set(bool(enabled))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def show_progress(progress: bool | None) -> bool:
    """``progress`` if given, else the default set by :func:`progress_bars` (True)."""
    return _PROGRESS.get() if progress is None else bool(progress)


def open_remote_lmdb(
    url: str,
    *,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    progress: bool | None = None,
    retry_deadline: float | None = None,
    request_timeout: float | None = None,
) -> LMDBStore:
    """The local copy of the LMDB dataset at ``url`` (fetched into the cache if needed).

    Before anything is downloaded, the object's two LMDB meta pages are read (two small ranged
    reads) and its size checked against them: a truncated upload is refused here, naming the URL.
    The cached copy is checked the same way before LMDB maps it (a short file would crash the
    process with SIGBUS), then against its own metadata; a bad copy is removed from the cache."""
    from tqdm import tqdm

    loc = Location(
        url, storage_options or {}, Policy.from_env(retry_deadline=retry_deadline, request_timeout=request_timeout)
    )
    size, etag = loc.head(DATA, purpose="meta")
    if size is None:
        raise FormatError(f"{loc.shown} is not an LMDB dataset: no {DATA} there")
    remote_name = loc.name_url(DATA)
    cache = ShardCache(
        cache_dir or default_cache_dir(), loc.url, parse_limit(cache_limit), tag=f"{loc.identity()}|{size}-{etag}"
    )  # another endpoint's bucket of that name is another dataset
    hit = cache.lookup(DATA, size)
    if hit is None:

        def read(offset: int, n: int) -> bytes:
            return bytes(loc.get_ranges([(DATA, offset, min(offset + n, size))], purpose="meta")[0])

        lmdb_required_size(read, size, remote_name)  # a bad object is refused before it is downloaded
        with tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            desc=f"fetching {loc.shown}",
            disable=not show_progress(progress),
            leave=False,
        ) as bar:
            hit = cache.fetch(
                DATA,
                size,
                lambda fd, prog: loc.download(DATA, fd, size, progress=prog, purpose="meta"),
                wait=True,
                progress=bar.update,
            )
        if hit is None:
            raise RemoteError(
                f"{loc.shown}: {DATA} ({size} bytes) does not fit in the cache at {cache.root} "
                f"(cache_limit={cache.limit}): raise cache_limit or free space"
            )
    else:
        cache.touch(DATA, every=0)

    def discard() -> None:  # a bad copy is not kept (the next open fetches it again)
        try:
            hit.unlink()
        except OSError:
            pass

    try:
        check_lmdb_file(hit, where=f"{remote_name} (cached copy {hit})")  # before LMDB maps it
    except FormatError:
        discard()
        raise
    store = LMDBStore(hit.parent)
    try:
        _check(store)
    except FormatError as e:
        discard()
        raise FormatError(f"{loc.shown}: the fetched copy does not match its metadata: {e}") from None
    store.url = loc.shown  # type: ignore[attr-defined]
    return store


def _check(store: LMDBStore) -> None:
    """The environment holds what its metadata says: the key table and each field's record count."""
    meta = store.metadata
    env, dbs = store._env, store._dbs
    with FORK_GATE.hold(), env.begin() as txn:
        keys = txn.stat(dbs[KEYS_DB])["entries"]
        if keys != meta["count"]:
            raise FormatError(f"{keys} keys, metadata says {meta['count']}")
        for f, want in meta["field_counts"].items():
            db = dbs.get(f.encode())
            have = txn.stat(db)["entries"] if db is not None else 0
            if have != want:
                raise FormatError(f"field {f!r}: {have} records, metadata says {want}")
