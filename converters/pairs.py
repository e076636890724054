"""Files grouped by stem -> one sample per stem, one field per extension.

``a/b/0001.jpg``, ``a/b/0001.txt``, ``a/b/0001.json`` -> key ``a/b/0001`` with
fields ``jpg``, ``txt``, ``json`` (the layout of img2dataset and COCO-style
caption dumps; ``clip.mp4`` + ``clip.txt`` + ``clip.flac`` likewise for video and audio).
``x.txt.gz`` gives field ``txt.gz``. Image fields are named by
format, not by the file's spelling: ``x.JPEG``, ``x.jpeg`` and ``x.jpg`` all give
``jpg`` (two of them for one stem is an error for that sample), ``x.tiff`` gives
``tif``. Hidden files and folders, datasets found under the folder and the
destination (when it lies inside the folder) are not input; folders behind
symlinks are not followed; a folder that cannot be read is a bad sample.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .common import ConversionError, Item, SourceWalker, canonical_extension, execute, item_source, layout_parser

EXAMPLES = (
    "mmloader convert pairs RAW/ out.lmdb --workers 2 --require jpg,txt",
    "mmloader convert pairs CLIPS/ clips.lmdb --require mp4,txt --check-decode --max-seconds 30",
    "mmloader convert pairs RAW/ shards/ --shard-size 5000 --on-error skip",
    "python -m mmloader.converters.pairs RAW/ out.lmdb",
)
LOOKED_FOR = "files grouped by stem (x.jpg + x.txt + ...), in the folder and its subfolders"


def split_name(rel: str) -> tuple[str, str]:
    """``a/b/x.txt.gz`` -> (``a/b/x``, ``txt.gz``); ``a/b/x.JPEG`` -> (``a/b/x``, ``jpg``)."""
    stem, ext = os.path.splitext(rel)
    if ext.lower() == ".gz":
        stem, inner = os.path.splitext(stem)
        ext = inner + ext
    return stem, canonical_extension(ext[1:])


def build_items(args: argparse.Namespace, notes: list[str]) -> tuple[list[Item], dict]:
    root = Path(args.src)
    if not root.is_dir():
        raise ConversionError(
            f"{root} is a file; pairs converts a folder of files grouped by stem (x.jpg + x.txt + ...)"
        )
    top = str(root)
    walker = SourceWalker(top, args.dst)
    groups: dict[str, Item] = {}
    no_ext: list[str] = []
    for dirpath, filenames in walker.walk():  # plain strings: pathlib costs ~20 us a file
        prefix = os.path.relpath(dirpath, top).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        for name in filenames:
            rel = prefix + name
            stem, field = split_name(rel)
            full = os.path.join(dirpath, name)
            if not field:
                no_ext.append(full)
                continue
            item = groups.get(stem)
            if item is None:
                item = groups[stem] = Item(key=stem, where=os.path.join(top, stem))
            if field in item.files:  # e.g. x.JPG and x.jpeg: never silently pick one
                item.error = f"two files for field {field!r}: {item.files[field]} and {full}"
            item.files[field] = full
    items = sorted([*groups.values(), *walker.error_items()], key=lambda it: it.key)
    notes += walker.notes()
    if no_ext:
        notes.append(f"not input: {len(no_ext)} file(s) without an extension, e.g. {no_ext[0]}")
    return items, {"layout": "pairs"}


def parser() -> argparse.ArgumentParser:
    return layout_parser("pairs", __doc__, EXAMPLES)


prepare = item_source(build_items, LOOKED_FOR)


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
