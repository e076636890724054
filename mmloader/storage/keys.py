"""Sample-key and field-name rules shared by both formats.

WebDataset splits a member name at the first dot of its basename into
(key, field), so a key's basename must not contain a dot; tar extraction
tools would write outside the target for absolute paths or ``..``.
"""

from __future__ import annotations

import re
import struct

from ..errors import KeyValidationError

#: Sample *i* is stored under this 8-byte big-endian key: LMDB keeps them in
#: index order, so index -> record is one B-tree lookup and writes can append.
INDEX_KEY = struct.Struct(">Q")

RESERVED_FIELDS = frozenset({"__key__", "__keys__", "__index__", "__meta__", "__url__", "__local_path__"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_KEY_BYTES = 400  # LMDB's default max key size is 511 bytes; leave room for encoding


def validate_key(key: object) -> str:
    """Return ``key`` if it can name a sample in every format, else raise naming it."""
    if not isinstance(key, str):
        raise KeyValidationError(f"sample key {key!r} must be a str, not {type(key).__name__}")
    if not key:
        raise KeyValidationError("sample key is empty")
    if _CONTROL.search(key) or "\\" in key:
        raise KeyValidationError(f"sample key {key!r} contains a control character or backslash")
    if key.startswith("/"):
        raise KeyValidationError(f"sample key {key!r} is an absolute path")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise KeyValidationError(f"sample key {key!r} has an empty, '.' or '..' path component")
    if "." in parts[-1]:
        raise KeyValidationError(
            f"sample key {key!r} has a dot in its basename; WebDataset splits member names at the "
            "first dot, so the key would not survive a round trip (replace the dot, e.g. with '_')"
        )
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise KeyValidationError(f"sample key {key[:40]!r}... is longer than {MAX_KEY_BYTES} bytes")
    return key


def validate_field(field: object) -> str:
    """Field names become tar extensions and LMDB sub-database names."""
    if not isinstance(field, str) or not field:
        raise KeyValidationError(f"field name {field!r} must be a non-empty str")
    if field in RESERVED_FIELDS or field.startswith("__"):
        raise KeyValidationError(f"field name {field!r} is reserved (names starting with '__')")
    if "/" in field or _CONTROL.search(field) or field.startswith(".") or field.endswith("."):
        raise KeyValidationError(
            f"field name {field!r} must not contain '/' or control characters or start/end with '.'"
        )
    if field != field.lower():
        raise KeyValidationError(
            f"field name {field!r} has upper-case letters; WebDataset lower-cases "
            f"extensions when it reads a shard, so it would not round-trip: use "
            f"{field.lower()!r}"
        )
    return field


def split_member_name(name: str) -> tuple[str, str] | None:
    """Split a tar member name into (key, field) as WebDataset's ``base_plus_ext`` and
    ``group_by_keys`` do: the key ends at the first dot of the basename, and the field is
    lower-cased (``x.JPG`` is field ``jpg``, for WebDataset and for mmloader alike).

    >>> split_member_name("a/b/0001.txt.gz"), split_member_name("x.JPG"), split_member_name("noext")
    (('a/b/0001', 'txt.gz'), ('x', 'jpg'), None)
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1 or dot == len(name) - 1:
        return None
    return name[:dot], name[dot + 1 :].lower()
