"""``mmloader index s3://bucket/shards/``: indexing tar shards already on object storage, each
downloaded once (several at once when small), the index uploaded beside them or kept in a local
folder, the manifest last. Apart from :mod:`.write`, which uploads datasets written here."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from ...errors import FormatError
from ..tar.index import ShardIndexBuilder, index_shard
from . import Location, RemoteError
from .write import _tmp_root, upload_dataset


def build_index_remote(
    url: str,
    output: str | os.PathLike | None = None,
    progress: bool = True,
    storage_options: dict | None = None,
    suffixes: tuple[str, ...] = (".tar", ".tgz", ".tar.gz"),
) -> dict:
    """``mmloader index s3://bucket/shards/``: index tar shards already on object storage (e.g.
    written by img2dataset). Each shard is downloaded once into a temporary file and read
    sequentially. The offset indexes, key index and manifest are uploaded beside the shards, the
    manifest last; or, with a local ``output`` folder (where nothing can be written beside the
    shards: a Hub dataset of someone else's), written there, the manifest last, naming the
    shards' URL (a Hub revision as its commit) and each shard's version (ETag): opening the
    folder reads the shards in place, and a shard replaced since is an error, never wrong bytes.

    Args:
        url: the folder of shards (one that lists: ``s3://``, ``gs://``, ``az://``, ``hf://``).
        output: None or ``url`` (beside the shards), or a local folder: new, or empty.
        progress: show a progress bar.
        storage_options: the client's settings.
        suffixes: which files are shards.
    """
    location = Location(url, storage_options or {})
    local = output is not None and "://" not in os.fspath(output)
    final = Path(os.fspath(output)).expanduser().resolve() if output is not None and local else Path()
    if local:
        if final.exists() and (not final.is_dir() or any(final.iterdir())):
            raise FileExistsError(f"{final} exists and is not an empty folder: the index needs a folder of its own")
    elif location.hub is not None:
        raise ValueError(
            f"{location.shown}: mmloader does not write to the Hub; keep the index in a local folder: "
            f"`mmloader index {location.shown} -o DIR`, then open DIR (the shards are read on the Hub)"
        )
    else:
        location.check_writable()  # an index is written beside the shards
        if output is not None and Location(os.fspath(output)).url != location.url:
            raise ValueError(
                f"--output {Location(os.fspath(output)).url}: an index of shards on object storage is written beside "
                f"them ({location.url}), or in a local folder"
            )
    if location.scheme == "http" and location.hub is None:
        raise ValueError(
            f"{location.shown}: a plain HTTP(S) server cannot list a folder, so its shards cannot be found: "
            "index a local copy, or shards on s3://, gs://, az:// or hf://"
        )
    listed = location.list()
    objects = sorted((n, size) for n, size in listed if n.endswith(suffixes) and "/" not in n)
    if not objects:
        nested = sorted({n.split("/")[0] for n, _s in listed if "/" in n and n.endswith(suffixes)})
        hint = f" (its sub-folders do: index each, e.g. {location.shown}/{nested[0]})" if nested else ""
        raise FormatError(f"{location.shown} holds no tar shards ({', '.join('*' + s for s in suffixes)}){hint}")
    versions = _shard_versions(location, [n for n, _s in objects]) if local else {}
    if local:
        made = not final.exists()
        # a new folder is built beside its final name and renamed into place; an empty one given
        # (`-o .`, a mount point) is filled in place: either way the manifest comes last
        final.parent.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent)) if made else final
        if made:
            umask = os.umask(0)
            os.umask(umask)
            out.chmod(0o777 & ~umask)  # as mkdir makes it, not mkdtemp's 0700: an index to share
        work = out
    else:
        work = Path(tempfile.mkdtemp(prefix=".mmloader-index-", dir=_tmp_root()))
        out = work / "index"
        out.mkdir()
    done = False
    try:
        with _terminate_as_interrupt():
            builder = ShardIndexBuilder(out, unique_keys=False)
            with tqdm(
                total=sum(s for _n, s in objects),
                unit="B",
                unit_scale=True,
                desc="indexing shards",
                disable=not progress,
            ) as bar:
                for name, shard in _downloaded(location, objects, work, bar.update):
                    index_shard(builder, shard, name, where=location.name_url(name))
            if not local:
                manifest = builder.finish(indexed_from=location.url)
                upload_dataset(out, location, "tar", progress=progress)
            else:
                for entry in builder.shards:
                    if versions.get(entry["file"]):
                        entry["etag"] = versions[entry["file"]]
                manifest = builder.finish(indexed_from=location.shown, shards_url=location.shown)
                if made:
                    os.replace(out, final)
            done = True
            return manifest
    finally:
        if not local:
            shutil.rmtree(work, ignore_errors=True)
        elif not done and made:
            shutil.rmtree(out, ignore_errors=True)  # an unfinished index leaves nothing under its name
        elif not done:
            for leftover in list(final.iterdir()):  # the folder given stays, empty as it was
                shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)


#: The most shards downloaded at once while an index is built. Location.download already reads
#: one shard by 8 concurrent 16 MiB ranges; small shards (one range each) are overlapped instead,
#: as many as keep those 128 MiB in memory at most.
DOWNLOADS_IN_FLIGHT = 8
IN_MEMORY_BYTES = 128 << 20


def _downloaded(
    location: Location, objects: list[tuple[str, int]], folder: Path, progress
) -> Iterator[tuple[str, Path]]:
    """Each shard of ``objects`` as (name, local file), in order, downloaded into ``folder``
    ahead of the one being indexed: several at once when they are small (one request each is
    one stream's bandwidth, rarely a store's), up to :data:`DOWNLOADS_IN_FLIGHT` and
    :data:`IN_MEMORY_BYTES`; each file is removed once the caller has read it. Leaving early (an
    error, Ctrl-C) stops the downloads in flight at their next chunk."""
    stop = threading.Event()
    largest = max((size for _n, size in objects), default=1)
    in_flight = max(1, min(DOWNLOADS_IN_FLIGHT, IN_MEMORY_BYTES // max(largest, 1)))

    def fetch(i: int, name: str, size: int) -> Path:
        path = folder / f".shard-{i}.partial"

        def chunk(n: int) -> None:
            if stop.is_set():
                raise InterruptedError(f"{name}: download stopped")
            progress(n)

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            location.download(name, fd, size, progress=chunk)
        finally:
            os.close(fd)
        return path

    pool = concurrent.futures.ThreadPoolExecutor(in_flight, thread_name_prefix="mmloader-index")
    todo = iter(enumerate(objects))
    pending: list[tuple[str, concurrent.futures.Future]] = []
    try:
        for i, (name, size) in todo:
            pending.append((name, pool.submit(fetch, i, name, size)))
            if len(pending) == in_flight:
                break
        while pending:
            name, future = pending.pop(0)
            path = future.result()
            try:
                yield name, path
            finally:
                path.unlink(missing_ok=True)
            for i, (following, size) in todo:
                pending.append((following, pool.submit(fetch, i, following, size)))
                break
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for leftover in folder.glob(".shard-*.partial"):
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (``kill``, ``timeout``, Slurm, Kubernetes) raises KeyboardInterrupt while the
    block runs, so that its clean-up runs as for Ctrl-C; only in the main thread, and only where
    SIGTERM still has its default action."""
    import signal
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _shard_versions(location: Location, names: list[str]) -> dict[str, str]:
    """name -> version (ETag) of each shard, pinned for the reads that index it: from one
    listing, else a HEAD per shard; none for a Hub dataset (its URL names the commit)."""
    if location.hub is not None:
        return {}
    wanted = set(names)
    try:
        versions = {n: e for n, e in location.versions().items() if n in wanted}
    except (FileNotFoundError, RemoteError, OSError):
        versions = {}
    for name in names:
        if name not in versions:
            _size, etag = location.head(name)
            if etag:
                versions[name] = etag
    for name, etag in versions.items():
        location.pin(name, etag)
    return versions
