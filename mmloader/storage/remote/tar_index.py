"""The index side of a :class:`~.tar.RemoteTarStore`: the manifest (every object's version
pinned first), the key index and the offset tables, fetched once per process, from beside the
shards or a local ``index_dir``. Apart from :mod:`.tar` (reading samples) and :mod:`.tar_cache`
(whole shards): what is known of the shards before any byte of one is read."""

from __future__ import annotations

import hashlib
import io
import logging
import os
from typing import Sequence

import numpy as np

from ...errors import FormatError
from ..tar.index import MANIFEST
from ..tar.store import TarStore, checked_index, compressed_shard, prepare_manifest
from . import Location, RemoteError, RemoteUnavailableError, join

log = logging.getLogger("mmloader")

MAX_INDEXES = 4096  # offset tables kept per process (16 bytes per sample and field each)


def offsets_from_bytes(data: bytes, where: str) -> np.ndarray:
    try:
        table = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as e:
        raise FormatError(f"{where}: unreadable offset index: {e}") from None
    if table.dtype != np.int64 or table.ndim != 3 or table.shape[2] != 2:
        raise FormatError(f"{where}: not an offset index (dtype {table.dtype}, shape {table.shape})")
    table.flags.writeable = False
    return table


class _RemoteIndex(TarStore):
    """:class:`~mmloader.storage.tar.store.TarStore`'s metadata and indexes read from object
    storage (or ``index_dir``); :class:`~.tar.RemoteTarStore` sets the attributes below."""

    location: Location
    url: str
    #: a local folder holding the manifest and indexes, or None: beside the shards
    index_dir: str | None

    def _manifest_path(self) -> str:
        return self._index_path(MANIFEST)

    def _index_path(self, name: str) -> str:
        """Where the index file ``name`` lies: in ``index_dir``, else beside the shards."""
        return os.path.join(self.index_dir, name) if self.index_dir is not None else join(self.url, name)

    def _index_files(self, names: list[str]) -> list[bytes]:
        """The manifest's key and offset files: from ``index_dir``, else beside the shards."""
        if self.index_dir is None:
            return self.location.get_many(names, purpose="meta")
        out = []
        for name in names:
            try:
                with open(self._index_path(name), "rb") as f:
                    out.append(f.read())
            except FileNotFoundError:
                raise FileNotFoundError(f"{self._index_path(name)}: no such file") from None
        return out

    def _local_index_metadata(self) -> dict:
        """The manifest of an index kept in ``index_dir``, every shard pinned to the version it
        was indexed at (the ETag the manifest records; a Hub dataset's commit is in its URL): a
        shard replaced since is an ObjectChangedError, never bytes at another file's offsets."""
        assert self.index_dir is not None
        with open(self.manifest_path, "rb") as f:
            text = f.read()
        meta = prepare_manifest(text, self.manifest_path)
        for shard in meta["shards"]:
            if shard.get("etag"):
                self.location.pin(shard["file"], shard["etag"])
        meta["_digest"] = hashlib.sha256(text).hexdigest()[:16]
        return meta

    @property
    def metadata(self) -> dict:
        if self._meta is None and self.index_dir is not None:
            self._meta = self._local_index_metadata()
        if self._meta is None:
            # Pin every object's version first (one listing per 1,000 objects), then read the
            # manifest as that version: the indexes and shards read later, in this process or
            # in workers (the pins travel with the store), are the ones the manifest describes,
            # or the read fails with ObjectChangedError — never a mixture of two datasets.
            try:
                versions = self.location.versions()
            except RemoteUnavailableError:
                # no answer for the whole retry_deadline: asking for the manifest now would wait
                # as long again (an open takes one deadline at most)
                raise
            except (FileNotFoundError, RemoteError, OSError) as e:
                log.debug("%s: no listing (%s); versions are pinned as objects are first read", self.url, e)
                versions = {}
            for name, etag in versions.items():
                self.location.pin(name, etag)
            try:
                text = self.location.get(MANIFEST, purpose="meta")
            except FileNotFoundError:
                raise FormatError(f"{self.url} has no {MANIFEST}{self._tar_hint()}") from None
            self._meta = prepare_manifest(text, self.manifest_path)
            if not versions:
                self._pin_by_head()
            self._meta["_digest"] = hashlib.sha256(text if isinstance(text, bytes) else text.encode()).hexdigest()[:16]
        return self._meta

    #: Above this many shards, a store that cannot list pins lazily (each process at its first
    #: answer) instead of asking for every shard's version when it opens.
    MAX_HEAD_PINS = 4096

    def _pin_by_head(self) -> None:
        """Where there is no listing (plain HTTP), pin each shard's version with a HEAD request,
        concurrently, so that worker processes share one set of versions. A Hub dataset needs
        none: its commit is pinned, and its files never change."""
        assert self._meta is not None  # called by metadata, once it is read
        if self.location.hub is not None:
            return
        names = [sh["file"] for sh in self._meta["shards"]]
        if not names or len(names) > self.MAX_HEAD_PINS:
            return
        from concurrent.futures import ThreadPoolExecutor

        try:
            with ThreadPoolExecutor(16, thread_name_prefix="mmloader-head") as pool:
                answers = list(pool.map(lambda n: self.location.head(n, purpose="meta"), names))
        except (RemoteError, OSError) as e:
            log.debug("%s: versions not pinned at open (%s)", self.url, e)
            return
        for name, (_size, etag) in zip(names, answers):
            self.location.pin(name, etag)

    def _tar_hint(self) -> str:
        try:
            names = [n for n, _ in self.location.list(purpose="meta")]
        except Exception:
            return ""
        if any(n.endswith((".tar", ".tgz", ".tar.gz")) for n in names) and self.location.hub is not None:
            return (
                f" (it holds tar files but no {MANIFEST}: index them once into a local folder, "
                f"`mmloader index {self.url} -o DIR`, and open DIR: the shards stay on the Hub, read in place)"
            )
        if any(n.endswith((".tar", ".tgz", ".tar.gz")) for n in names):
            return (
                f" (it holds tar files but no manifest: a writer killed before publishing leaves its shards "
                f"without {MANIFEST}, and indexing those would publish half a dataset; if they are complete "
                f"shards written by another tool, run `mmloader index {self.url}` (the index beside them), or "
                f"`mmloader index {self.url} -o DIR` and open DIR (the index in a local folder))"
            )
        if any(n.endswith("data.mdb") for n in names):
            return " (it holds an LMDB data.mdb: name the dataset by its .lmdb folder)"
        if not names:
            where = "the path in the repository (and its revision)" if self.location.hub else "the bucket and the path"
            return f" (nothing is stored under this prefix: check {where})"
        return ""

    def shard_path(self, s: int) -> str:
        return join(self.url, self.shards[s]["file"])

    def _key_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # into locals: another thread may have set _keys and not yet _order (then both load here)
        keys, order = self._keys, self._order
        if keys is None or order is None:
            meta = self.metadata
            raw = self._index_files([meta["keys"], meta["key_order"]])
            keys = np.load(io.BytesIO(raw[0]), allow_pickle=False)
            order = np.load(io.BytesIO(raw[1]), allow_pickle=False)
            self._keys, self._order = keys, order
        return keys, order

    def _shard_index(self, s: int) -> np.ndarray:
        table = self._idx.get(s)
        if table is None:
            self.fetch_indexes([s])
            table = self._idx[s]
        return table

    def fetch_indexes(self, shards: Sequence[int]) -> None:
        """Fetch the offset tables of ``shards`` not held yet, concurrently."""
        missing = sorted({int(s) for s in shards if int(s) not in self._idx})
        if not missing:
            return
        meta = self.metadata
        for s in missing:
            if meta["shards"][s]["compressed"]:
                raise compressed_shard(self.shard_path(s))
        names = [meta["shards"][s]["index"] for s in missing]
        try:
            raw = self._index_files(names)
        except FileNotFoundError as e:
            raise FormatError(f"{e}: an offset index listed in {self.manifest_path} is missing") from None
        with self._lock:
            for s, name, data in zip(missing, names, raw):
                self._idx[s] = checked_index(offsets_from_bytes(data, self._index_path(name)), meta["shards"][s])
                while len(self._idx) > MAX_INDEXES:
                    self._idx.popitem(last=False)
