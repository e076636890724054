"""A JSONL or CSV manifest, one row per sample -> image/txt/cls/json fields.

``--image-column`` names an image path relative to the manifest; ``--text-column``
and ``--label-column`` become ``txt`` and ``cls`` (labels that are not integers
are treated as class names: sorted, indexed, stored in the metadata as
``classes``). The other columns go into a ``json`` field, or only those listed
in ``--keep-columns``. Keys are the row numbers, or ``--key-column``.

    python -m converters.manifest captions.jsonl out/ --image-column file --text-column caption
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Sequence

from .common import ConversionError, Item, layout_parser, run


def read_rows(path: Path) -> list[dict]:
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise ConversionError(f"{path}:{n}: not valid JSON: {e}") from None
                if not isinstance(row, dict):
                    raise ConversionError(f"{path}:{n}: a row must be a JSON object")
                rows.append(row)
        return rows
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def build_items(args: argparse.Namespace) -> tuple[list[Item], dict]:
    path = Path(args.src)
    if not path.is_file():
        raise ConversionError(f"manifest {path} is not a file")
    rows = read_rows(path)
    base = path.parent
    columns = set().union(*(r.keys() for r in rows)) if rows else set()
    for opt in ("image_column", "text_column", "label_column", "key_column"):
        col = getattr(args, opt)
        if col and col not in columns:
            raise ConversionError(f"--{opt.replace('_', '-')} {col!r} is not a column of {path} "
                             f"(columns: {', '.join(sorted(columns))})")
    used = {c for c in (args.image_column, args.text_column, args.label_column, args.key_column) if c}
    keep = [c for c in args.keep_columns.split(",") if c] if args.keep_columns is not None else None
    labels = [r.get(args.label_column) for r in rows] if args.label_column else []
    classes = None
    if labels and not all(isinstance(l, int) or (isinstance(l, str) and l.strip().lstrip("-").isdigit())
                          for l in labels if l is not None):
        classes = sorted({str(l) for l in labels if l is not None})
    width = max(len(str(len(rows))), 9)
    items = []
    for n, row in enumerate(rows):
        key = str(row[args.key_column]) if args.key_column else f"{n:0{width}d}"
        item = Item(key=key, where=f"{path}:row {n + 1}")
        if args.image_column and row.get(args.image_column):
            img = base / str(row[args.image_column])
            ext = img.suffix[1:].lower() or "jpg"
            item.files[ext] = str(img)
        if args.text_column and row.get(args.text_column) is not None:
            item.values["txt"] = str(row[args.text_column])
        if args.label_column and row.get(args.label_column) not in (None, ""):
            label = row[args.label_column]
            item.values["cls"] = classes.index(str(label)) if classes else int(label)
        rest = {k: v for k, v in row.items() if k not in used and (keep is None or k in keep)}
        if rest:
            item.values["json"] = rest
        items.append(item)
    meta = {"layout": "manifest", "source": str(path.resolve())}
    if classes:
        meta["classes"] = classes
    return items, meta


def parser() -> argparse.ArgumentParser:
    p = layout_parser("manifest", __doc__)
    p.add_argument("--image-column", help="column holding an image path relative to the manifest")
    p.add_argument("--text-column", help="column stored as the txt field")
    p.add_argument("--label-column", help="column stored as the cls field")
    p.add_argument("--key-column", help="column used as the sample key (default: row number)")
    p.add_argument("--keep-columns", default=None,
                   help="comma-separated other columns to keep in the json field (default: all)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_items, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
