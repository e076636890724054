"""How an Arrow type maps to a field's bytes and kind: a column's cell kind (bytes, text, an HF
``Image``/``Audio`` struct, numbers, JSON), datasets' features in the schema metadata, and the
media kind a value's first bytes tell. Pure functions of types and values, kept apart from the
store so the type mapping reads in one place.
"""

from __future__ import annotations

import json
from typing import Any

from .files import _pa


def _cell_kind(t) -> str:
    """How a column's cells become bytes: bytes, text, struct (HF Image/Audio), number or json.
    A dictionary-encoded column (pandas ``category``) is its values' kind."""
    pa = _pa()
    if pa.types.is_dictionary(t):
        return _cell_kind(t.value_type)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if getattr(pa.types, "is_binary_view", lambda _t: False)(t):
        return "bytes"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t):
        return "text"
    if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} in ({"bytes"}, {"bytes", "path"}):
        return "struct"  # datasets' Image and Audio: {bytes, path}; any other struct is JSON
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    return "json"


def _hf_features(schema) -> dict[str, str]:
    """Column -> the ``_type`` of its feature in the ``huggingface`` schema metadata that datasets
    writes (``save_to_disk``, ``to_parquet``): ``Image``, ``Audio``, ``Value``...; empty without it."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
        return {name: str(f.get("_type", "")) for name, f in features.items() if isinstance(f, dict)}
    except (KeyError, ValueError, TypeError, AttributeError):
        return {}


#: First bytes of the image, audio and video files a binary column may hold.
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")
_AUDIO_MAGIC = (b"fLaC", b"OggS", b"ID3")


def _media_kind(data: bytes | None) -> str | None:
    """``image``, ``audio`` or ``video`` from a value's first bytes, or None.

    >>> _media_kind(b"\\x89PNG\\r\\n\\x1a\\n..."), _media_kind(b"fLaC..."), _media_kind(b"\\0\\0\\0\\x18ftypisom")
    ('image', 'audio', 'video')
    """
    if not data:
        return None
    head = bytes(data[:16])
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return "image"
    if len(head) > 2 and head[0] == 0x50 and head[1] in b"123456" and head[2] in b" \t\r\n#":
        return "image"  # netpbm (ppm, pgm)
    if head.startswith(_AUDIO_MAGIC) or (head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"):
        return "audio"
    if head[4:8] == b"ftyp":
        return "audio" if head[8:12] in (b"M4A ", b"M4B ") else "video"
    if head[:4] == b"\x1a\x45\xdf\xa3" or (head[:4] == b"RIFF" and head[8:11] == b"AVI"):
        return "video"
    return None


def _is_json_text(data: bytes | None) -> bool:
    """Whether a text value is a JSON object or array."""
    if not data or data.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _json_default(value: Any):
    """JSON for what a table holds that JSON does not: bytes as base64 text, the rest as text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode()
    return str(value)


def _is_view(t) -> bool:
    pa = _pa()
    return any(getattr(pa.types, f, lambda _t: False)(t) for f in ("is_string_view", "is_binary_view"))
