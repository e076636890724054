"""A JSONL or CSV manifest, one row per sample -> image/txt/cls/json fields.

``--image-column`` names an image path relative to the manifest (the field is named by
format: ``.jpeg``/``.JPG`` give ``jpg``; a path without an image extension is named by its
header); ``--video-column`` and ``--audio-column`` name video and audio files the same way
(field: the extension, ``mp4``, ``webm``, ``flac``, ``wav``...; checked from the header, see
``--check-decode``, ``--max-seconds``, ``--transcode``); ``--text-column`` and
``--label-column`` become ``txt`` and ``cls``. The other
columns go into a ``json`` field, or only those listed in ``--keep-columns``. Keys are the
row numbers, or ``--key-column``.

Labels: integral numbers are integers whatever their spelling (``1``, ``"1"``, ``1.0``,
``"1.0"`` are all 1). A column holding any other text is a column of class names: the
distinct names, sorted (Python string order: by code point, so ``B`` before ``a``), are
numbered 0, 1, 2, ... and stored in the metadata as ``classes``; numbers in such a column
are names too, as written, and the summary says so. An empty or absent label is a missing
label, never a class: a bad sample. A non-integral number (``1.5``) or a text that looks
like a number and is not one (``"²"``) is a bad sample with its reason.

Texts: a JSON string is stored as it is; a number or ``true``/``false`` as its JSON spelling
(``3`` -> ``"3"``), counted in the summary; NaN or infinity is no text (as ``null``); a list
or object (several captions?) is a bad sample with its reason.

Rows: a JSONL line that is not a JSON object, a CSV row with more or fewer cells than the
header, or text that is not UTF-8 is a bad sample named by file and line. A UTF-8
byte-order mark (as Excel writes) is ignored.
"""

from __future__ import annotations

import argparse
import codecs
import csv
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from mmloader.media.mediainfo import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS

from .common import (
    IMAGE_EXTENSIONS,
    ConversionError,
    Item,
    UsageError,
    canonical_extension,
    execute,
    item_source,
    label_kind,
    layout_parser,
)
from .items import strict_json

EXAMPLES = (
    "mmloader convert manifest captions.jsonl out/ --image-column file --text-column caption",
    "mmloader convert manifest clips.csv clips.lmdb --video-column video --audio-column audio "
    "--text-column caption --check-decode",
    "mmloader convert manifest labels.csv out.lmdb --image-column path --label-column label "
    "--keep-columns width,height",
)
LOOKED_FOR = "rows (JSON objects, one a line, in .jsonl/.ndjson/.json; otherwise CSV with a header)"


class Row:
    """One manifest row: its values, or what is wrong with it; ``where`` is FILE:LINE."""

    def __init__(self, where: str, values: dict | None = None, error: str | None = None):
        self.where, self.values, self.error = where, values or {}, error


def _decode(raw: bytes, first: bool) -> str:
    return (raw.removeprefix(codecs.BOM_UTF8) if first else raw).decode("utf-8")


def read_jsonl(path: Path) -> list[Row]:
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = _decode(raw, n == 1)
            except UnicodeDecodeError as e:
                rows.append(Row(where, error=f"not UTF-8 ({e.reason} at byte {e.start} of the line)"))
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                rows.append(Row(where, error=f"not valid JSON: {e}"))
                continue
            if not isinstance(row, dict):
                rows.append(Row(where, error=f"a row must be a JSON object, not a {type(row).__name__}"))
                continue
            rows.append(Row(where, row))
    return rows


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_csv(path: Path) -> tuple[list[Row], list[str]]:
    rows = []
    # surrogateescape: a row with bytes that are not UTF-8 becomes a bad row, not a failed conversion
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], []
        if any(_has_surrogates(h) for h in header):
            raise ConversionError(f"{path}:1: the header is not UTF-8")
        for cells in reader:
            where = f"{path}:{reader.line_num}"
            if not cells:  # csv gives [] for a blank line
                continue
            if any(_has_surrogates(c) for c in cells):
                rows.append(Row(where, error="not UTF-8"))
            elif len(cells) != len(header):
                rows.append(Row(where, error=f"{len(cells)} cells, the header has {len(header)}"))
            else:
                rows.append(Row(where, dict(zip(header, cells))))
    return rows, header


def _columns_text(columns) -> str:
    return ", ".join(repr(c) for c in columns)


def label_classes(rows: list[Row], column: str, notes: list[str]) -> tuple[list[str] | None, dict[int, Any]]:
    """(class names or None for numeric labels, {row number: int label or error text})."""
    kinds = [label_kind(r.values.get(column)) if r.error is None else ("skip", None) for r in rows]
    names = any(k == "name" for k, _ in kinds)
    out: dict[int, Any] = {}
    if not names:
        for n, (kind, value) in enumerate(kinds):
            if kind == "number":
                out[n] = value if isinstance(value, int) else f"bad label: {value!r} is not an integer"
            elif kind == "missing":
                out[n] = f"missing label: {column!r} is empty"
            elif kind == "bad":
                out[n] = f"bad label: {value}"
        return None, out

    def as_name(kind, value, raw):
        return value if kind == "name" else (raw.strip() if isinstance(raw, str) else json.dumps(raw))

    numbers = [r.values.get(column) for r, (k, _) in zip(rows, kinds) if k == "number"]
    classes = sorted({as_name(k, v, r.values.get(column)) for r, (k, v) in zip(rows, kinds) if k in ("name", "number")})
    index = {c: i for i, c in enumerate(classes)}
    for n, ((kind, value), row) in enumerate(zip(kinds, rows)):
        if kind in ("name", "number"):
            out[n] = index[as_name(kind, value, row.values.get(column))]
        elif kind == "missing":
            out[n] = f"missing label: {column!r} is empty"
        elif kind == "bad":
            out[n] = f"bad label: {value}"
    if numbers:
        notes.append(
            f"label column {column!r} mixes class names and numbers: {len(numbers)} numeric label(s), "
            f"e.g. {numbers[0]!r}, are class names as written (classes are sorted names)"
        )
    return classes, out


def build_items(args: argparse.Namespace, notes: list[str]) -> tuple[list[Item], dict]:
    path = Path(args.src)
    if not path.is_file():
        raise ConversionError(f"{path} is a folder; manifest converts one .jsonl or .csv file")
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = read_jsonl(path)
        columns = list(dict.fromkeys(k for r in rows for k in r.values))
    else:
        rows, columns = read_csv(path)
    if not rows:  # nothing to convert: a failure naming the source, not a usage error about columns
        raise ConversionError(
            f"no samples found in {path}: it holds no rows (looked for JSON objects, one "
            "per line, or CSV rows under a header)"
        )
    for opt in ("image_column", "video_column", "audio_column", "text_column", "label_column", "key_column"):
        col = getattr(args, opt)
        if col and col not in columns:
            raise UsageError(
                f"--{opt.replace('_', '-')} {col!r} is not a column of {path} "
                f"(columns: {_columns_text(columns) or 'none'})"
            )
    keep = [c for c in args.keep_columns.split(",") if c] if args.keep_columns is not None else None
    unknown = [c for c in keep or () if c not in columns]
    if unknown:
        raise UsageError(
            f"--keep-columns {','.join(unknown)}: not a column of {path} (columns: {_columns_text(columns) or 'none'})"
        )
    used = {
        c
        for c in (
            args.image_column,
            args.video_column,
            args.audio_column,
            args.text_column,
            args.label_column,
            args.key_column,
        )
        if c
    }
    classes, labels = label_classes(rows, args.label_column, notes) if args.label_column else (None, {})
    base = path.parent
    width = max(len(str(len(rows))), 9)
    items = []
    as_json: Counter = Counter()  # texts that were JSON numbers or booleans, by type
    nonfinite = no_text = 0  # NaN and infinities: in the json field (stored as null), as texts (none)
    for n, row in enumerate(rows):
        values = row.values
        key = f"{n:0{width}d}"
        if args.key_column and row.error is None:
            raw = values.get(args.key_column)
            key = "" if raw is None else str(raw)
        item = Item(key=key or f"{n:0{width}d}", where=row.where, error=row.error)
        items.append(item)
        if row.error is not None:
            continue
        if args.key_column and not key:
            item.error = f"empty key: {args.key_column!r} is empty"
            continue
        if args.image_column and values.get(args.image_column):
            img = base / str(values[args.image_column])
            ext = canonical_extension(img.suffix[1:])
            item.files[ext if ext in IMAGE_EXTENSIONS else ""] = str(img)
        for column, kind, known in (
            (args.video_column, "video", VIDEO_EXTENSIONS),
            (args.audio_column, "audio", AUDIO_EXTENSIONS),
        ):
            if column and values.get(column):
                media = base / str(values[column])
                ext = media.suffix[1:].lower()
                if ext not in known:
                    item.error = (
                        f"{kind} file {media.name!r}: the extension is not one of {', '.join(known)} "
                        f"(column {column!r})"
                    )
                elif ext in item.files:
                    item.error = f"two files for field {ext!r}: {item.files[ext]} and {media}"
                else:
                    item.files[ext] = str(media)
        if item.error:
            continue
        if args.text_column and values.get(args.text_column) is not None:
            text = values[args.text_column]
            if isinstance(text, (list, dict)):  # several captions, or a structure: not one text
                item.error = (
                    f"column {args.text_column!r} holds a JSON {'list' if isinstance(text, list) else 'object'}, "
                    "not a text (one caption per row, as a string; a column that is not --text-column is "
                    "kept in the json field)"
                )
                continue
            if isinstance(text, float) and not math.isfinite(text):  # NaN: no text, as null (counted)
                no_text += 1
            else:
                if not isinstance(text, str):  # a number or true/false: its JSON spelling, said in the summary
                    as_json[type(text).__name__] += 1
                    text = json.dumps(text)
                item.values["txt"] = text
        if args.label_column:
            label = labels[n]
            if isinstance(label, str):
                item.error = label
                continue
            item.values["cls"] = label
        rest = {k: v for k, v in values.items() if k not in used and (keep is None or k in keep)}
        if rest:
            item.values["json"], replaced = strict_json(rest)  # NaN is not JSON: null (missing)
            nonfinite += replaced
    if nonfinite:
        notes.append(f"{nonfinite} NaN or infinite value(s) in the json field stored as null (missing)")
    if no_text:
        notes.append(f"column {args.text_column!r}: {no_text} NaN or infinite value(s): no text, as for null")
    if as_json:
        said = ", ".join(f"{count} {kind}" for kind, count in sorted(as_json.items()))
        notes.append(f"column {args.text_column!r}: {said} value(s) stored as their JSON text (e.g. 3 -> '3')")
    meta: dict = {"layout": "manifest"}
    if classes:
        meta["classes"] = classes
    return items, meta


def parser() -> argparse.ArgumentParser:
    p = layout_parser("manifest", __doc__, EXAMPLES)
    p.add_argument("--image-column", help="column holding an image path relative to the manifest")
    p.add_argument(
        "--video-column", help="column holding a video path relative to the manifest (field: its extension, e.g. mp4)"
    )
    p.add_argument(
        "--audio-column", help="column holding an audio path relative to the manifest (field: its extension, e.g. flac)"
    )
    p.add_argument("--text-column", help="column stored as the txt field")
    p.add_argument(
        "--label-column",
        help="column stored as the cls field: integers as they are, class names numbered in sorted order (see above)",
    )
    p.add_argument("--key-column", help="column used as the sample key (default: row number)")
    p.add_argument(
        "--keep-columns", default=None, help="comma-separated other columns to keep in the json field (default: all)"
    )
    return p


prepare = item_source(build_items, LOOKED_FOR)


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
