"""The metadata record both formats carry (JSON)."""

from __future__ import annotations

import datetime
import zlib

from .._version import __version__

LMDB_FORMAT = "mmloader-lmdb"
TAR_FORMAT = "mmloader-tar"
#: Earlier manifests say this; read as TAR_FORMAT.
TAR_FORMATS = (TAR_FORMAT, "mmloader-shards")
FORMAT_VERSION = 1


class FieldStats:
    """Per-field sample count, byte total and CRC32 over values in index order (for verify)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.nbytes: dict[str, int] = {}
        self.crc: dict[str, int] = {}

    def add(self, fields: dict[str, bytes]) -> None:
        for f, v in fields.items():
            self.count[f] = self.count.get(f, 0) + 1
            self.nbytes[f] = self.nbytes.get(f, 0) + len(v)
            self.crc[f] = zlib.crc32(v, self.crc.get(f, 0))

    def as_dict(self) -> dict:
        return {"field_counts": dict(self.count), "field_bytes": dict(self.nbytes), "field_crc32": dict(self.crc)}


def make_metadata(fmt: str, count: int, stats: FieldStats, user: dict | None, **extra) -> dict:
    return {
        "format": fmt,
        "version": FORMAT_VERSION,
        "count": count,
        "fields": sorted(stats.count),
        **stats.as_dict(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": f"mmloader {__version__}",
        "metadata": dict(user or {}),
        **extra,
    }
