"""Sequential tar reading as short generator stages (WebDataset-compatible grouping).

``tar_members(path) -> (name, offset, size, data)``; ``group_samples(members) ->
{"__key__", field: bytes}``. Used for compressed shards (which cannot be
sliced), for ``mmloader index`` and for ``verify``. Nothing is extracted to disk.
"""

from __future__ import annotations

import logging
import os
import tarfile
from typing import IO, Final, Iterable, Iterator, cast

from ...errors import FormatError
from ..keys import split_member_name

log = logging.getLogger("mmloader")

GZIP_MAGIC = b"\x1f\x8b"


def is_compressed(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        head = f.read(6)
    return head[:2] == GZIP_MAGIC or head[:3] == b"BZh" or head == b"\xfd7zXZ\x00"


def safe_member_name(name: str) -> bool:
    parts = name.split("/")
    return not (name.startswith("/") or ".." in parts or "\\" in name or "\n" in name)


def tar_members(
    path: str | os.PathLike, with_data: bool = True, fileobj: IO[bytes] | None = None
) -> Iterator[tuple[str, int, int, bytes | None]]:
    """Yield ``(name, data_offset, size, data)`` for each regular-file member, in order.

    Directories are passed over silently; links, devices and unsafe names
    (absolute, ``..``) are passed over with a warning: we never follow them.
    For compressed shards offsets are positions in the decompressed stream.
    """
    mode: Final = "r|*"
    with tarfile.open(name=None if fileobj else str(path), mode=mode, fileobj=fileobj) as tf:
        for member in tf:
            tf.members = []  # type: ignore[attr-defined]  # TarFile.members: not in the stubs; tarfile keeps every header otherwise: O(members) memory
            if member.isdir():
                continue
            if not member.isreg():
                log.warning(
                    "%s: ignoring tar member %r (%s, not a regular file)",
                    path,
                    member.name,
                    "link" if member.issym() or member.islnk() else "special file",
                )
                continue
            if not safe_member_name(member.name):
                log.warning("%s: ignoring tar member with unsafe name %r", path, member.name)
                continue
            data = cast(IO[bytes], tf.extractfile(member)).read() if with_data else None  # a regular file: not None
            yield member.name, member.offset_data, member.size, data


def group_samples(members: Iterable[tuple[str, int, int, bytes | None]], where: str = "") -> Iterator[dict]:
    """Group consecutive members sharing a key into samples, as WebDataset does.

    Each sample dict has ``__key__``, ``__offsets__`` ({field: (offset, size)}) and
    ``field: bytes`` when data was read.
    """
    current: dict | None = None
    for name, offset, size, data in members:
        split = split_member_name(name)
        if split is None:
            log.warning("%s: ignoring tar member %r without a field extension", where, name)
            continue
        key, field = split
        if current is not None and current["__key__"] != key:
            yield current
            current = None
        if current is None:
            current = {"__key__": key, "__offsets__": {}}
        if field in current["__offsets__"]:  # e.g. x.jpg and x.JPG: WebDataset refuses it too
            raise FormatError(
                f"{where}: sample {key!r} has field {field!r} twice (member {name!r}); "
                "one of them would be dropped: remove or rename it"
            )
        current["__offsets__"][field] = (offset, size)
        if data is not None:
            current[field] = data
    if current is not None:
        yield current
