"""Storage formats: LMDB environments and tar-shard directories, bytes in and bytes out."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import FormatError, MMLoaderError
from .arrow.store import ArrowStore, is_table
from .base import KeysView, Store
from .foreign.energon import EnergonStore, is_energon
from .foreign.img2dataset import Img2DatasetStore, is_img2dataset
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
    if p.is_dir() and (p / "data.mdb").is_file():
        return LMDBStore(p)
    if is_energon(p):  # prepared by `energon prepare` (an index.json too or not): its split honoured
        return EnergonStore(p, **_only(p, options, ("split", "split_config", "check_headers")))
    if (p.is_dir() and (p / MANIFEST).is_file()) or (p.is_file() and p.suffix == ".json"):
        folder = p if p.is_dir() else p.parent
        remote = _shards_url(folder / MANIFEST)
        if remote is not None:  # `mmloader index URL -o DIR`: the index here, the shards in place there
            from .remote.tar import RemoteTarStore

            return RemoteTarStore(remote, index_dir=folder, **options)
        return TarStore(p, **options)
    if "split" in options:
        raise TypeError(f"{p}: split= applies to Energon datasets (a folder with .nv-meta/); this is not one")
    if is_img2dataset(p):  # shards + .parquet + _stats.json, no index needed
        return Img2DatasetStore(p, **_only(p, options, ("check_headers",)))
    if p.is_dir() and (any(p.glob("*.tar")) or any(p.glob("*.tgz")) or any(p.glob("*.tar.gz"))):
        raise FormatError(f"{p} holds tar shards but no {MANIFEST}: run `mmloader index {p}` first")
    if is_table(p):  # a datasets save_to_disk folder, or Parquet: read in place
        return ArrowStore(p, **_only(p, options, ("cache_bytes",)))
    raise FormatError(
        f"{p} is neither an mmloader LMDB dataset (data.mdb), a shard directory ({MANIFEST}), an Arrow folder "
        "(datasets' save_to_disk) nor Parquet"
    )


def build_index(
    directory: str | os.PathLike,
    output: str | os.PathLike | None = None,
    progress: bool = True,
    storage_options: dict | None = None,
) -> dict:
    """Index tar shards written by any tool (manifest + offset indexes + key index): a local
    folder (:func:`~mmloader.storage.tar.index.build_index`), or a URL
    (:func:`~mmloader.storage.remote.write.build_index_remote`): the index beside the shards, or
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
        from .remote.write import build_index_remote

        return build_index_remote(
            os.fspath(directory), output=output, progress=progress, storage_options=storage_options
        )
    if storage_options:
        raise TypeError(f"{directory}: storage_options apply to URLs, not to a local folder")
    return build_local_index(directory, output=output, progress=progress)


def _shards_url(manifest: Path) -> str | None:
    """The URL of the shards a local index describes (its ``shards_url``), or None for shards
    beside it. The manifest is read again, checked, when the store opens."""
    import json

    try:
        with open(manifest, "rb") as f:
            head = json.loads(f.read())
    except (OSError, ValueError):
        return None  # the store's own reading names what is wrong
    url = head.get("shards_url") if isinstance(head, dict) else None
    if url is not None and not (isinstance(url, str) and is_url(url) and not url.lower().startswith("file:")):
        raise FormatError(f"{manifest}: shards_url {url!r} is not the URL of shards on object storage or the Hub")
    return url


def _only(path: Path, options: dict, accepted: tuple[str, ...]) -> dict:
    """``options``, or a TypeError naming those this kind of dataset does not take."""
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"{path}: options {unknown} do not apply to this dataset (it takes: {', '.join(accepted)})")
    return options


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


FORMATS = ("lmdb", "tar")


def format_for(path: str | os.PathLike, format: str | None = None) -> str:
    """The output format for ``path``: ``format`` if given, else ``"lmdb"`` for a ``.lmdb``
    suffix and ``"tar"`` (a shard directory) otherwise. The one place this rule lives.

    >>> format_for("out.lmdb"), format_for("out/"), format_for("out", "lmdb")
    ('lmdb', 'tar', 'lmdb')
    """
    if format is None:
        return "lmdb" if str(path).rstrip("/").lower().endswith(".lmdb") else "tar"
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
    if fmt == "lmdb":
        return LMDBWriter(path, **kwargs)
    return ShardWriter(path, **{k: v for k, v in shard_options.items() if v is not None}, **kwargs)
