"""Storage formats: LMDB environments and tar-shard directories, bytes in and bytes out."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import FormatError, MMLoaderError
from .arrow.store import ArrowStore
from .base import KeysView, Store
from .foreign.energon import EnergonStore
from .foreign.img2dataset import Img2DatasetStore
from .formats import Format, formats, has_tar_shards, recognise, writable
from .lmdb.store import LMDBStore, LMDBWriter
from .remote import is_url
from .tar.index import MANIFEST
from .tar.index import build_index as build_local_index
from .tar.store import TarStore
from .tar.writer import ShardWriter

__all__ = [
    "open_store",
    "open_url",
    "is_url",
    "Store",
    "KeysView",
    "LMDBStore",
    "LMDBWriter",
    "TarStore",
    "ArrowStore",
    "EnergonStore",
    "Img2DatasetStore",
    "ShardWriter",
    "build_index",
    "writer_for",
    "format_for",
    "FORMATS",
    "Format",
    "formats",
    "recognise",
]


#: A URL scheme followed by a single slash: a typo, or a URL that went through pathlib.Path.
_HALF_URL = re.compile(r"(?i)(s3a?|gcs?|az|azure|abfss?|https?):/(?!/)")


def open_store(path: str | os.PathLike | Store, **options) -> Store:
    """Open an LMDB dataset, a shard directory (or its ``index.json``), or a table read in place
    (a ``datasets`` ``save_to_disk`` folder, Parquet files: :class:`ArrowStore`), a dataset
    prepared by ``energon prepare`` (:class:`EnergonStore`; ``split=`` picks the split, default
    ``train``) or img2dataset's output folder (:class:`Img2DatasetStore`); nothing is read yet.

        Shard options: ``check_headers`` (default True), ``verify_checksums`` (default False).
        A URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) opens the dataset on object storage:
        see :func:`open_url` for its options.

        >>> ds = open_store("data.lmdb"); len(ds)    # doctest: +SKIP
    """
    if isinstance(path, Store):
        return path
    if is_url(path):
        return open_url(str(path), **options)
    p = Path(path)
    if not p.exists():
        half = _HALF_URL.match(os.fspath(path))
        if half:  # "http:/host/ds", or a URL made a Path (which merges "//" into "/")
            from .remote.redaction import redact_url

            url = f"{half.group(1)}://{os.fspath(path)[half.end() :].lstrip('/')}"
            raise FileNotFoundError(
                f"dataset {redact_url(url).replace('://', ':/', 1)} does not exist: with one slash after "
                f"'{half.group(1)}:' it is a local path; a URL takes two ({redact_url(url)}), and is given as a "
                "string (a pathlib.Path merges the two slashes)"
            )
        raise FileNotFoundError(f"dataset {p} does not exist")
    fmt = recognise(p)
    if "split" in options and (fmt is None or fmt.name != "energon"):
        raise TypeError(f"{p}: split= applies to Energon datasets (a folder with .nv-meta/); this is not one")
    if fmt is not None:
        return fmt.open(p, options)
    if has_tar_shards(p):
        raise FormatError(f"{p} holds tar shards but no {MANIFEST}: run `mmloader index {p}` first")
    kinds = [f.what for f in formats().values()]
    raise FormatError(f"{p} is not a dataset mmloader opens; it is none of: {'; '.join(kinds)}")


def build_index(
    directory: str | os.PathLike,
    output: str | os.PathLike | None = None,
    progress: bool = True,
    storage_options: dict | None = None,
) -> dict:
    """Index tar shards written by any tool (manifest + offset indexes + key index): a local
    folder (:func:`~mmloader.storage.tar.index.build_index`), or a URL
    (:func:`~mmloader.storage.remote.index.build_index_remote`): the index beside the shards, or
    in a local ``output`` folder that then opens as the dataset, its shards read in place.

    Args:
        directory: the folder or URL (``s3://``, ``gs://``, ``az://``, ``hf://``) of the shards.
        output: where the index goes (default: beside the shards).
        progress: show a progress bar.
        storage_options: the client's settings, for a URL.

    >>> build_index("foreign-shards/", output="foreign-index/")              # doctest: +SKIP
    >>> build_index("hf://datasets/ORG/NAME/train", output="name-index/")   # doctest: +SKIP
    """
    if is_url(directory):
        from .remote.index import build_index_remote

        return build_index_remote(
            os.fspath(directory), output=output, progress=progress, storage_options=storage_options
        )
    if storage_options:
        raise TypeError(f"{directory}: storage_options apply to URLs, not to a local folder")
    return build_local_index(directory, output=output, progress=progress)


def open_url(
    url: str,
    *,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    **options,
) -> Store:
    """A dataset on object storage. The format follows the name as for local paths: a ``.lmdb``
    suffix is an LMDB dataset (fetched once per node into ``cache_dir``), anything else a shard
    directory read in place (:class:`~mmloader.storage.remote.tar.RemoteTarStore`: manifest and
    offset indexes fetched once per process, samples by ranged reads).

    ``storage_options``: client settings (``endpoint``, ``region``, ``access_key_id``, ...;
    by default the standard environment). ``cache_dir``/``cache_limit`` (default
    ``$MMLOADER_CACHE_DIR``/``$MMLOADER_CACHE_LIMIT``): a node-local cache of whole shards.
    Other options: ``readahead``, ``readahead_bytes``, ``chunk_bytes``, ``coalesce``,
    ``retry_deadline``, ``request_timeout``, ``max_in_flight``, ``check_headers``,
    ``verify_checksums``.
    """
    cache_dir = cache_dir if cache_dir is not None else os.environ.get("MMLOADER_CACHE_DIR") or None
    if cache_limit is None:  # the environment's limit applies where there is a cache to limit
        cache_limit = os.environ.get("MMLOADER_CACHE_LIMIT") or None
        if cache_dir is None and format_for(url) != "lmdb":
            cache_limit = None
    if format_for(url) == "lmdb":
        from .remote.lmdb import open_remote_lmdb

        lmdb_options = {k: options.pop(k) for k in ("progress", "retry_deadline", "request_timeout") if k in options}
        if options:
            from .remote.redaction import redact_url

            raise TypeError(
                f"{redact_url(url)}: options {sorted(options)} apply to shard directories, not to LMDB datasets"
            )
        return open_remote_lmdb(
            url, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit, **lmdb_options
        )
    from .remote.tar import RemoteTarStore

    table_options = {k: options.pop(k) for k in ("cache_bytes",) if k in options}
    if url.rstrip("/").lower().endswith(".parquet"):  # one Parquet file, read in place
        return ArrowStore(url, storage_options=storage_options, **table_options, **options)
    store = RemoteTarStore(
        url, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit, **options
    )
    try:
        store.metadata  # noqa: B018  one GET: a missing or foreign dataset is an error here, naming the URL
    except FormatError as e:
        # no index.json, no tar: a folder of Parquet files (the Hub's refs/convert/parquet) is a
        # table (img2dataset's output holds .parquet files beside its tars: that is no table)
        if f"has no {MANIFEST}" not in str(e):
            raise
        try:
            names = [n for n, _s in store.location.list(purpose="meta") if "/" not in n]
        except (OSError, MMLoaderError):
            names = []
        if not any(n.endswith(".parquet") for n in names) or any(
            n.endswith((".tar", ".tgz", ".tar.gz")) for n in names
        ):
            raise
        keep = {k: v for k, v in options.items() if k in ("retry_deadline", "request_timeout")}
        return ArrowStore(url, storage_options=storage_options, **table_options, **keep)
    return store


#: The formats mmloader writes: the registry's formats with a writer.
FORMATS = writable()


def format_for(path: str | os.PathLike, format: str | None = None) -> str:
    """The output format for ``path``: ``format`` if given, else the written format whose suffix
    ``path`` has (``"lmdb"`` for ``.lmdb``), else ``"tar"`` (a shard directory). The one place
    this rule lives.

    >>> format_for("out.lmdb"), format_for("out/"), format_for("out", "lmdb")
    ('lmdb', 'tar', 'lmdb')
    """
    if format is None:
        name = str(path).rstrip("/").lower()
        suffixed = (f for f in FORMATS if formats()[f].suffixes and name.endswith(formats()[f].suffixes))
        return next(suffixed, "tar")
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: expected one of {', '.join(FORMATS)}")
    return format


def writer_for(path: str | os.PathLike, format: str | None = None, **kwargs):
    """An :class:`LMDBWriter` or :class:`ShardWriter` for ``path`` (format by :func:`format_for`).

    ``shard_size`` (samples) and ``shard_bytes`` apply to tar only (an LMDB dataset is one
    file), so one call serves both formats. A URL (``s3://bucket/ds/``) writes locally and
    uploads, the manifest last (``storage_options=`` for the client).

    >>> with writer_for("pairs.lmdb") as w:                               # doctest: +SKIP
    ...     w.write({"__key__": "0001", "jpg": jpeg_bytes, "txt": "a red circle"})
    """
    fmt = format_for(path, format)
    shard_options = {k: kwargs.pop(k, None) for k in ("shard_size", "shard_bytes")}
    if is_url(path):  # written locally, uploaded, manifest last (storage.remote.write)
        from .remote.write import RemoteWriter

        opts = {k: v for k, v in shard_options.items() if v is not None} if fmt == "tar" else {}
        return RemoteWriter(str(path), fmt, **opts, **kwargs)
    writer = formats()[fmt].writer
    assert writer is not None  # FORMATS are the formats with a writer
    if fmt == "tar":
        kwargs.update({k: v for k, v in shard_options.items() if v is not None})
    return writer(path, **kwargs)
