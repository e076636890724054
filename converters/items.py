"""The data of a conversion: items, options, and the errors a conversion raises."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)

#: Files larger than this are refused before a byte is read (``--max-file-bytes``). 256 MiB is
#: several times the largest ordinary photo or scan (a JPEG at the 150-megapixel ``max_pixels``
#: cap is ~30-80 MB), while ``--workers N`` holds at most N such files in memory at once.
DEFAULT_MAX_FILE_BYTES = 256 << 20
#: How much of an image file is read to check its header before the rest is read.
PROBE_BYTES = 64 << 10

ON_ERROR_HELP = (
    "raise (default): stop at the first bad sample with its file and reason, nothing "
    "written; skip: leave bad samples out, list them in DST.skipped.tsv and count them "
    "in the summary"
)


class ConversionError(Exception):
    """The conversion cannot go on (bad paths, bad data under ``--on-error raise``); nothing is
    left behind. Exit status 1."""


class UsageError(ConversionError):
    """An option value that cannot work, found after parsing (e.g. ``--require`` naming a field no
    sample has). Exit status 2, like argparse's own usage errors."""


class ItemError(Exception):
    """One raw sample cannot be converted; ``path`` names the offending file (and line/row)."""

    def __init__(self, reason: str, path: str | os.PathLike = ""):
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason, self.path = reason, str(path)


class Skipped(ItemError):
    """Left out by a policy the user chose (e.g. blank lines): reported, never a failure."""


@dataclass
class Item:
    """One sample to convert: its key and, per field, a file path or an inline value."""

    key: str
    files: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    error: str | None = None  # a problem found while listing the raw folder (or reading a row)
    #: field -> bytes given inline (a table cell), checked exactly as a file's bytes would be;
    #: field "" is an image whose header names the field
    data: dict[str, bytes] = field(default_factory=dict)
    #: field -> where its inline bytes came from, for error messages ("column 'image', row group 3")
    origin: dict[str, str] = field(default_factory=dict)


@dataclass
class Options:
    format: str | None = None
    resize_max: int | None = None
    quality: int = 90
    check_decode: bool = False
    require: tuple[str, ...] = ()
    max_pixels: int = 150_000_000
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_seconds: float | None = None
    transcode: Any = None  # mmloader.media.mediainfo.Transcode


def strict_json(value: Any) -> tuple[Any, int]:
    """``value`` with every NaN and infinity (which ``json.dumps`` writes as ``NaN``, not JSON to a
    strict parser) replaced by None (``null``: missing), and how many were replaced.

    >>> strict_json({"a": float("nan"), "b": [1.5, float("inf")]})
    ({'a': None, 'b': [1.5, None]}, 2)
    """
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None, 1
    if isinstance(value, dict):
        pairs = [(k, *strict_json(v)) for k, v in value.items()]
        return {k: v for k, v, _n in pairs}, sum(n for _k, _v, n in pairs)
    if isinstance(value, (list, tuple)):
        parts = [strict_json(v) for v in value]
        return [v for v, _n in parts], sum(n for _v, n in parts)
    return value, 0
