"""The format registry: every dataset format mmloader opens, in the order a local path is
recognised, and the ones it writes. ``open_store``, experiment configs, ``inspect`` and
``writer_for`` all read it; a new format is a folder under ``storage/`` and one entry here
(docs/contributing.md)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Store


@dataclass(frozen=True)
class Format:
    """One dataset format.

    Attributes:
        name: as every option spells it (``format="lmdb"``, ``--format tar``).
        what: how messages describe a dataset of it ("an LMDB dataset (data.mdb)").
        recognise: whether a local path holds a dataset of this format (cheap: names and
            small files only).
        open: the store for a recognised path, given the caller's options.
        writer: a writer for a local path, for formats mmloader writes.
        suffixes: names ending so are this format (for writing, and for single files).
    """

    name: str
    what: str
    recognise: Callable[[Path], bool]
    open: Callable[[Path, dict[str, Any]], Store]
    writer: Callable[..., Any] | None = None
    suffixes: tuple[str, ...] = ()


def _only(path: Path, options: Mapping[str, Any], accepted: tuple[str, ...]) -> dict[str, Any]:
    """``options``, or a TypeError naming those this kind of dataset does not take."""
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"it takes: {', '.join(accepted)}" if accepted else "it takes none"
        raise TypeError(f"{path}: options {unknown} do not apply to this dataset ({takes})")
    return dict(options)


def has_tar_shards(p: Path) -> bool:
    """A folder holding tar shards (indexed or not)."""
    return p.is_dir() and any(any(p.glob(pattern)) for pattern in ("*.tar", "*.tgz", "*.tar.gz"))


def _lmdb() -> Format:
    from .lmdb.store import LMDBStore, LMDBWriter

    return Format(
        "lmdb",
        "an mmloader LMDB dataset (data.mdb)",
        lambda p: p.is_dir() and (p / "data.mdb").is_file(),
        lambda p, options: LMDBStore(p, **_only(p, options, ())),
        LMDBWriter,
        (".lmdb",),
    )


def _energon() -> Format:
    from .foreign.energon import EnergonStore, is_energon

    return Format(
        "energon",
        "a dataset prepared by energon prepare (.nv-meta/)",
        is_energon,
        lambda p, options: EnergonStore(p, **_only(p, options, ("split", "split_config", "check_headers"))),
    )


def _tar() -> Format:
    from .tar.index import MANIFEST
    from .tar.store import TarStore
    from .tar.writer import ShardWriter

    def open_tar(p: Path, options: dict[str, Any]) -> Store:
        folder = p if p.is_dir() else p.parent
        remote = _shards_url(folder / MANIFEST)
        if remote is not None:  # `mmloader index URL -o DIR`: the index here, the shards in place there
            from .remote.tar import RemoteTarStore

            return RemoteTarStore(remote, index_dir=folder, **options)
        return TarStore(p, **_only(p, options, ("check_headers", "verify_checksums")))

    return Format(
        "tar",
        f"a shard directory ({MANIFEST})",
        lambda p: (p.is_dir() and (p / MANIFEST).is_file()) or (p.is_file() and p.name == MANIFEST),
        open_tar,
        ShardWriter,
    )


def _img2dataset() -> Format:
    from .foreign.img2dataset import Img2DatasetStore, is_img2dataset

    return Format(
        "img2dataset",
        "img2dataset's output (shards, .parquet, _stats.json)",
        is_img2dataset,
        lambda p, options: Img2DatasetStore(p, **_only(p, options, ("check_headers",))),
    )


def _arrow() -> Format:
    from .arrow.files import is_table
    from .arrow.store import ArrowStore

    return Format(
        "arrow",
        "an Arrow folder (datasets' save_to_disk), Parquet files",
        lambda p: is_table(p) and not has_tar_shards(p),
        lambda p, options: ArrowStore(p, **_only(p, options, ("cache_bytes",))),
        suffixes=(".parquet",),
    )


def _text() -> Format:
    from .text.store import TextLinesStore

    def open_text(p: Path, options: dict[str, Any]) -> Store:
        index = _only(p, options, ("index_path",)).get("index_path")
        return TextLinesStore(p, index_path=None if index is None else Path(index))

    return Format(
        "text",
        "a text file, one sample per line",
        lambda p: p.is_file() and p.suffix.lower() in TEXT_SUFFIXES,
        open_text,
        suffixes=TEXT_SUFFIXES,
    )


#: The suffixes of text files read one sample per line.
TEXT_SUFFIXES = (".txt", ".text")

_BUILDERS = (_lmdb, _energon, _tar, _img2dataset, _arrow, _text)
_FORMATS: dict[str, Format] = {}


def formats() -> Mapping[str, Format]:
    """Every format by name, in the order a local path is recognised (built on first use: the
    store modules it names import this one's package)."""
    if not _FORMATS:
        for build in _BUILDERS:
            fmt = build()
            _FORMATS[fmt.name] = fmt
    return _FORMATS


def recognise(path: str | os.PathLike) -> Format | None:
    """The format of the dataset at a local ``path``, or None."""
    p = Path(path)
    return next((fmt for fmt in formats().values() if fmt.recognise(p)), None)


def writable() -> tuple[str, ...]:
    """The formats mmloader writes."""
    return tuple(name for name, fmt in formats().items() if fmt.writer is not None)


def _shards_url(manifest: Path) -> str | None:
    """The URL of the shards a local index describes (its ``shards_url``), or None for shards
    beside it. The manifest is read again, checked, when the store opens."""
    import json

    from ..errors import FormatError
    from .remote import is_url

    try:
        with open(manifest, "rb") as f:
            head = json.loads(f.read())
    except (OSError, ValueError):
        return None  # the store's own reading names what is wrong
    url = head.get("shards_url") if isinstance(head, dict) else None
    if url is not None and not (isinstance(url, str) and is_url(url) and not url.lower().startswith("file:")):
        raise FormatError(f"{manifest}: shards_url {url!r} is not the URL of shards on object storage or the Hub")
    return url
