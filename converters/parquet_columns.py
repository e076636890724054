"""The parquet converter's columns: which Arrow types can serve as the image, text, label or key
column, why a file's schema cannot (a schema that differs), which other columns go into the json
field, datasets' features in the schema metadata, and the label mapping (ClassLabel names, or
class names numbered in sorted order). Kept apart from reading and planning so the rules on
columns read in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .common import label_kind
from .parquet_tables import Table, _pa, read_batches


# -- columns ---------------------------------------------------------------------------------------
def _has_binary(t) -> bool:
    pa = _pa()
    if _is_bytes(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_binary(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_binary(t.value_type)
    if pa.types.is_dictionary(t):
        return _has_binary(t.value_type)
    return False


def _is_text(t) -> bool:
    pa = _pa()
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t)
    )


def _is_bytes(t) -> bool:
    pa = _pa()
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or getattr(pa.types, "is_binary_view", lambda _t: False)(t)
    )


def image_kind(t) -> str | None:
    """bytes | struct (HF Image) | path, or None for a type that holds no image."""
    pa = _pa()
    if _is_bytes(t):
        return "bytes"
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and _is_bytes(t.field("bytes").type):
        return "struct"
    if _is_text(t):
        return "path"
    return None


def _check_type(role: str, t) -> str | None:
    """Why a column of type ``t`` cannot serve as ``role``, or None."""
    pa = _pa()
    if role == "image" and image_kind(t) is None:
        return f"is {t}: an image column holds bytes, a datasets Image struct {{bytes, path}} or a path"
    if role == "text" and not (_is_text(t) or _is_bytes(t)):
        return f"is {t}: a text column holds strings (or UTF-8 bytes)"
    if role == "label":
        v = t.value_type if pa.types.is_dictionary(t) else t
        if not (pa.types.is_integer(v) or pa.types.is_floating(v) or _is_text(v)):
            return f"is {t}: a label column holds integers or class names"
    if role == "key" and (pa.types.is_nested(t) or _has_binary(t)):
        return f"is {t}: a key column holds strings or integers"
    return None


def hf_features(schema) -> dict:
    """The datasets features recorded in a table's schema metadata ({} when none)."""
    meta = (schema.metadata or {}) if schema is not None else {}
    raw = meta.get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


@dataclass
class Columns:
    image: str | None
    text: str | None
    label: str | None
    key: str | None
    keep: list[str] | None

    def named(self) -> dict[str, str]:
        return {
            role: c
            for role, c in (("image", self.image), ("text", self.text), ("label", self.label), ("key", self.key))
            if c
        }


def schema_problem(table: Table, cols: Columns) -> str | None:
    """Why this file's rows cannot be converted with these columns (a schema that differs)."""
    names = table.schema.names
    for role, c in cols.named().items():
        if c not in names:
            return f"schema differs: this file has no column {c!r} (its columns: {', '.join(map(repr, names))})"
        why = _check_type(role, table.schema.field(c).type)
        if why:
            return f"schema differs: column {c!r} {why}"
    return None


def json_columns(table: Table, cols: Columns) -> tuple[list[str], list[str]]:
    """(columns kept in the json field, binary columns left out) for one file."""
    named = set(cols.named().values())
    keep, binary = [], []
    for f in table.schema:
        if f.name in named or (cols.keep is not None and f.name not in cols.keep):
            continue
        (binary if _has_binary(f.type) else keep).append(f.name)
    return keep, binary


# -- labels ----------------------------------------------------------------------------------------
def label_table(tables: list[Table], cols: Columns, notes: list[str]) -> tuple[list[str] | None, dict | None]:
    """(class names or None, {raw value: int label or error text}) — None mapping: integers as they
    are (with an HF ClassLabel's -1 a missing label)."""
    pa = _pa()
    c = cols.label
    good = [t for t in tables if t.error is None and schema_problem(t, cols) is None]
    for t in good:
        feature = hf_features(t.schema).get(c, {})
        if feature.get("_type") == "ClassLabel" and pa.types.is_integer(t.schema.field(c).type):
            return list(feature.get("names") or []), None
    if good and all(pa.types.is_integer(t.schema.field(c).type) for t in good):
        return None, None
    uniques: set = set()  # a pass over the label column alone: the class names are the sorted distinct names
    for t in good:
        for _g, _r, batch in read_batches(t, [c], 0, t.rows, errors=[]):
            uniques.update(batch.column(0).unique().to_pylist())
    uniques.discard(None)
    kinds = {v: label_kind(v) for v in uniques}
    names = any(k == "name" for k, _ in kinds.values())
    mapping: dict = {}
    if not names:
        for v, (kind, value) in kinds.items():
            if kind == "number":
                mapping[v] = value if isinstance(value, int) else f"bad label: {value!r} is not an integer"
            elif kind == "missing":
                mapping[v] = f"missing label: {c!r} is empty"
            else:
                mapping[v] = f"bad label: {value}"
        return None, mapping

    def as_name(v, kind, value):
        return value if kind == "name" else (v.strip() if isinstance(v, str) else json.dumps(v))

    classes = sorted({as_name(v, k, x) for v, (k, x) in kinds.items() if k in ("name", "number")})
    index = {name: i for i, name in enumerate(classes)}
    numbers = [v for v, (k, _x) in kinds.items() if k == "number"]
    for v, (kind, value) in kinds.items():
        if kind in ("name", "number"):
            mapping[v] = index[as_name(v, kind, value)]
        elif kind == "missing":
            mapping[v] = f"missing label: {c!r} is empty"
        else:
            mapping[v] = f"bad label: {value}"
    if numbers:
        notes.append(
            f"label column {c!r} mixes class names and numbers: numeric label(s) such as {numbers[0]!r} "
            "are class names as written (classes are sorted names)"
        )
    return classes, mapping
