"""Files grouped by stem -> one sample per stem, one field per extension.

``a/b/0001.jpg``, ``a/b/0001.txt``, ``a/b/0001.json`` -> key ``a/b/0001`` with
fields ``jpg``, ``txt``, ``json`` (the layout of img2dataset and COCO-style
caption dumps). ``x.txt.gz`` gives field ``txt.gz``.

    python -m converters.pairs RAW/ out.lmdb --workers 2 --require jpg,txt
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .common import Item, layout_parser, run


def split_name(rel: str) -> tuple[str, str]:
    """``a/b/x.txt.gz`` -> (``a/b/x``, ``txt.gz``); ``a/b/x.jpg`` -> (``a/b/x``, ``jpg``)."""
    stem, ext = os.path.splitext(rel)
    if ext.lower() == ".gz":
        stem, inner = os.path.splitext(stem)
        ext = inner + ext
    return stem, ext[1:].lower()


def build_items(args: argparse.Namespace) -> tuple[list[Item], dict]:
    root = Path(args.src)
    top = str(root)
    groups: dict[str, Item] = {}
    for dirpath, dirnames, filenames in os.walk(top):  # plain strings: pathlib costs ~20 us a file
        dirnames.sort()
        prefix = os.path.relpath(dirpath, top).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            rel = prefix + name
            stem, field = split_name(rel)
            if not field:
                continue
            full = os.path.join(dirpath, name)
            item = groups.get(stem)
            if item is None:
                item = groups[stem] = Item(key=stem, where=os.path.join(top, stem))
            if field in item.files:  # e.g. x.JPG and x.jpg: never silently pick one
                item.error = f"two files for field {field!r}: {item.files[field]} and {full}"
            item.files[field] = full
    items = sorted(groups.values(), key=lambda it: it.key)
    return items, {"layout": "pairs", "source": str(root.resolve())}


def parser() -> argparse.ArgumentParser:
    return layout_parser("pairs", __doc__)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_items, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
