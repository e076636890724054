"""Writing datasets to object storage: write locally, upload, publish the manifest last.

A shard directory is written by a :class:`ShardWriter` into a local temporary folder; each shard
is uploaded as soon as it is complete (and removed locally, so local disk holds a shard or two),
the offset and key indexes at the end, and ``index.json`` — the manifest, whose presence is what
makes a dataset — strictly last. Readers therefore never see half a dataset: a killed or failed
upload leaves no manifest. A writer that fails (an exception in its ``with`` block, a failed upload)
deletes the objects it uploaded before it stops (best effort: a killed process cannot, and leaves
shards without ``index.json``, which ``mmloader index`` must not be run on). Replacing a dataset
(``overwrite``) removes the old manifest just before the first new object is uploaded (a writer
that fails before that leaves the old dataset as it was), so a reader sees the old dataset or
none, never a mixture, then removes old objects the new dataset does not have once the new
manifest is in place. An LMDB dataset is one object (``data.mdb``), uploaded whole (a multipart
upload becomes visible only when complete), so a failed upload leaves the old one or none.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Mapping

from tqdm import tqdm

from ...errors import FormatError
from ..lmdb.store import LMDBWriter
from ..tar.index import MANIFEST
from ..tar.writer import ShardWriter
from ..write.atomic import AtomicWriter
from . import Location

log = logging.getLogger("mmloader")


def _tmp_root() -> str:
    return os.environ.get("MMLOADER_TMPDIR") or tempfile.gettempdir()


def check_destination(location: Location, fmt: str, overwrite: bool) -> None:
    """FileExistsError when a dataset is already at ``location`` and ``overwrite`` is not given;
    a :class:`~mmloader.storage.remote.RemoteError` naming a missing bucket, an invalid bucket
    name or refused access before anything is written."""
    location.check_writable()
    # A HEAD answer has no body, so there a missing bucket looks like a missing object: a LIST
    # (of the one name, so it stays small) gets the server's NoSuchBucket / InvalidBucketName.
    location.list(MANIFEST)
    marker = MANIFEST if fmt == "tar" else "data.mdb"
    if not overwrite and location.exists(marker):
        raise FileExistsError(
            f"{location.url} already holds a dataset ({marker}); pass overwrite=True (CLI: --overwrite) to replace it"
        )


def check_remote_destination(url: str, overwrite: bool, storage_options: dict | None = None) -> None:
    """Fail early (FileExistsError) when ``url`` already holds a dataset of either format and
    ``overwrite`` is not given; also checks that the location answers at all."""
    location = Location(url, storage_options or {})
    for fmt in ("tar", "lmdb"):
        check_destination(location, fmt, overwrite)


class _Uploads:
    """What one writer did at its location: the names it started uploading, whether its manifest
    is in place, and the old dataset it replaces (whose manifest is removed just before the first
    upload, so a writer that fails before uploading anything leaves the old dataset as it was)."""

    def __init__(self, location: Location, old_text: bytes | None = None):
        self.location = location
        self.old_text = old_text
        self.old = json.loads(old_text) if old_text is not None else None
        self.names: set[str] = set()
        self.published = False
        self._old_removed = False
        self._lock = threading.Lock()

    def start(self, name: str) -> None:
        """Call before uploading ``name``."""
        with self._lock:
            if self.old is not None and not self._old_removed:
                self.location.delete(MANIFEST)  # readers see the old dataset or none, never a mixture
                self._old_removed = True
            self.names.add(name)

    def undo(self) -> None:
        """After a failure before the manifest was in place: delete what was uploaded (best effort;
        nothing else), and put the old manifest back if none of the old dataset's objects was
        replaced."""
        if self.published:
            return
        for name in sorted(self.names, key=lambda n: n == MANIFEST, reverse=True):  # a manifest first
            try:
                self.location.delete(name)
            except Exception as e:  # best effort: the failure being reported matters more
                log.warning("%s: could not delete %s after the failed write: %s", self.location.url, name, e)
        if not self._old_removed:
            return
        assert self.old is not None and self.old_text is not None  # only an old manifest is removed (start)
        if not (self.names - {MANIFEST}) & _names_of(self.old):
            try:
                self.location.put_bytes(MANIFEST, self.old_text)
            except Exception as e:
                log.warning("%s: could not restore the replaced dataset's %s: %s", self.location.url, MANIFEST, e)


class _UploadingShardWriter(ShardWriter):
    """A :class:`ShardWriter` that uploads each shard once it is complete and removes it locally."""

    def __init__(self, directory, location: Location, uploads: _Uploads, **kwargs):
        super().__init__(directory, **kwargs)
        self.location, self.uploads = location, uploads
        self._uploads: list[concurrent.futures.Future] = []
        self._uploader = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mmloader-upload")
        self.uploaded: list[str] = []

    def _close_shard(self) -> None:
        if self._file is None:
            return
        super()._close_shard()
        synced, name = self._syncs[-1], self._index.shards[-1]["file"]
        path = self._dir.tmp / name

        def upload() -> None:
            synced.result()
            self.uploads.start(name)
            self.location.put_file(name, path)
            self.uploaded.append(name)
            os.unlink(path)

        self._uploads.append(self._uploader.submit(upload))

    def wait_uploads(self) -> None:
        self._uploader.shutdown(wait=True)
        for f in self._uploads:
            f.result()

    def abort(self) -> None:
        self._uploader.shutdown(wait=True, cancel_futures=True)
        super().abort()


class RemoteWriter(AtomicWriter):
    """``writer_for("s3://bucket/ds/")``: the same ``write``/``close`` as the local writers.

    >>> with RemoteWriter("s3://bucket/ds", "tar", shard_size=1000) as w:   # doctest: +SKIP
    ...     w.write({"__key__": "0001", "jpg": jpeg_bytes, "txt": "a cat"})
    """

    def __init__(
        self,
        url: str,
        fmt: str,
        *,
        overwrite: bool = False,
        storage_options: dict | None = None,
        progress: bool | None = None,
        metadata: Mapping | None = None,
        **kwargs: Any,
    ):
        from .lmdb import show_progress

        self.location = Location(url, storage_options or {})
        self.path = self.url = self.location.url
        self.fmt, self.overwrite, self.progress = fmt, overwrite, show_progress(progress)
        check_destination(self.location, fmt, overwrite)
        self._uploads = _Uploads(self.location)
        self._tmp = tempfile.mkdtemp(prefix=".mmloader-upload-", dir=_tmp_root())
        try:
            local = os.path.join(self._tmp, "ds.lmdb" if fmt == "lmdb" else "ds")
            if fmt == "lmdb":
                self._inner: Any = LMDBWriter(local, metadata=metadata, **kwargs)
            else:
                self._uploads = _Uploads(self.location, _old_manifest_text(self.location) if overwrite else None)
                self._inner = _UploadingShardWriter(local, self.location, self._uploads, metadata=metadata, **kwargs)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise

    @property
    def count(self) -> int:
        return self._inner.count

    def write(self, sample: Mapping[str, Any]) -> int:
        return self._inner.write(sample)

    def close(self) -> str:  # type: ignore[override]
        try:
            if self.fmt == "lmdb":
                local = self._inner.close()
                upload_dataset(local, self.location, "lmdb", progress=self.progress)
            else:
                inner: _UploadingShardWriter = self._inner
                inner._close_shard()
                inner.wait_uploads()
                local = inner.close()
                upload_dataset(
                    local, self.location, "tar", progress=self.progress, skip=set(inner.uploaded), uploads=self._uploads
                )
        except BaseException:
            self.abort()
            raise
        shutil.rmtree(self._tmp, ignore_errors=True)
        return self.url

    def abort(self) -> None:
        """Stop: uploads in flight finish or are cancelled, then the objects this writer uploaded
        are deleted (unless its manifest is already in place) and the local files removed."""
        try:
            self._inner.abort()  # waits for the uploads in flight
        except Exception:
            pass
        try:
            self._uploads.undo()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _old_manifest_text(location: Location) -> bytes | None:
    try:
        text = location.get(MANIFEST)
    except FileNotFoundError:
        return None
    return text if isinstance(text, bytes) else bytes(text)


def _names_of(manifest: dict) -> set[str]:
    names = {MANIFEST, manifest.get("keys", ""), manifest.get("key_order", "")}
    for s in manifest.get("shards", []):
        names |= {s["file"], s["index"]}
    return {n for n in names if n}


def upload_dataset(
    local: str | os.PathLike,
    location: Location,
    fmt: str,
    progress: bool = True,
    skip: AbstractSet[str] = frozenset(),
    uploads: _Uploads | None = None,
) -> None:
    """Upload a local dataset folder: every file but the manifest (shards, then indexes), then the
    manifest. ``skip``: names already uploaded. ``uploads``: records what is uploaded (for
    :meth:`_Uploads.undo` after a failure) and holds the manifest being replaced (removed before
    the first upload; its objects the new one does not list are deleted after the new manifest
    is in place)."""
    local = Path(local)
    uploads = uploads if uploads is not None else _Uploads(location)
    if fmt == "lmdb":
        files = [local / "data.mdb"]
    else:
        files = sorted(
            (
                p
                for p in local.iterdir()
                if p.is_file() and p.name != MANIFEST and not p.name.startswith(".") and p.name not in skip
            ),
            key=lambda p: (not p.name.endswith(".tar"), p.name),
        )
    total = sum(p.stat().st_size for p in files)
    with tqdm(
        total=total, unit="B", unit_scale=True, desc=f"uploading to {location.url}", disable=not progress, leave=False
    ) as bar:
        with concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="mmloader-upload") as pool:

            def put(p: Path) -> None:
                if fmt == "tar":  # one object (data.mdb) replaces the old one whole, or fails leaving it
                    uploads.start(p.name)
                location.put_file(p.name, p)
                bar.update(p.stat().st_size)

            for f in [pool.submit(put, p) for p in files]:
                f.result()
        if fmt == "tar":
            uploads.start(MANIFEST)
            location.put_file(MANIFEST, local / MANIFEST)  # last: its presence means complete
    uploads.published = True
    if uploads.old is not None and fmt == "tar":
        new = json.loads((local / MANIFEST).read_text())
        for name in sorted(_names_of(uploads.old) - _names_of(new)):
            try:
                location.delete(name)
            except Exception as e:  # the new dataset is in place: a leftover is no failure
                log.warning("%s: could not delete %s of the replaced dataset: %s", location.url, name, e)


def upload_existing(
    local: str | os.PathLike,
    url: str,
    *,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict | None = None,
) -> str:
    """Upload a finished local dataset (LMDB or shard directory) to ``url``, manifest last."""
    location = Location(url, storage_options or {})
    location.check_writable()
    local = Path(local)
    fmt = "lmdb" if (local / "data.mdb").is_file() else "tar"
    if fmt == "tar" and not (local / MANIFEST).is_file():
        raise FormatError(f"{local} is not a dataset (no data.mdb or {MANIFEST})")
    check_destination(location, fmt, overwrite)
    uploads = _Uploads(location, _old_manifest_text(location) if (overwrite and fmt == "tar") else None)
    try:
        upload_dataset(local, location, fmt, progress=progress, uploads=uploads)
    except BaseException:
        uploads.undo()  # no half-uploaded dataset left behind
        raise
    return location.url
