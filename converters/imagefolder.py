"""``ROOT/CLASS/*.jpg`` -> image field (named by format: ``jpg``, ``png``, ...) + ``cls``.

Class indices are those of ``torchvision.datasets.ImageFolder`` on the same folder
(sorted class folder names; the names go into the dataset metadata as ``classes``),
with one difference: hidden folders and files (``.ipynb_checkpoints``, ``.DS_Store``)
and datasets found under ROOT (the destination, an earlier conversion) are not input,
where torchvision would make a hidden folder a class. Image files are found by the same
extensions as torchvision (jpg jpeg png ppm bmp pgm tif tiff webp, any case), and the
field names the format, not the spelling: ``.jpg``, ``.jpeg`` and ``.JPEG`` files all
give field ``jpg``. A folder that cannot be read is a bad sample; a class folder
without images is kept (indices do not shift) and noted in the summary.

Symbolic links to folders are followed, as torchvision does, but each file is read once, at
its own place: a link back into its own path (a loop) is not followed, a link to a folder
inside ROOT is not followed (its files are read, with their own class, where they are), and a
real folder reached twice is read once; the summary says each in a line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .common import (
    IMAGE_EXTENSIONS,
    ConversionError,
    Item,
    SourceWalker,
    canonical_extension,
    execute,
    item_source,
    layout_parser,
)

EXAMPLES = (
    "mmloader convert imagefolder train/ train.lmdb --workers 2",
    "mmloader convert imagefolder train/ train-shards/ --shard-size 5000 --resize-max 512",
)
LOOKED_FOR = f"ROOT/CLASS/ folders holding image files ({', '.join(IMAGE_EXTENSIONS)})"


def find_classes(root: Path, walker: SourceWalker, broken: list[Item] | None = None) -> list[str]:
    """Class folders as torchvision finds them (sorted names of entries that are folders); a
    symbolic link that leads nowhere or in a loop is no class there either, and is reported here
    as a bad sample (``broken``), never left out without a word."""
    try:
        listing = sorted(os.scandir(root), key=lambda e: e.name)
    except NotADirectoryError:
        raise ConversionError(f"{root} is a file; imagefolder converts a folder ROOT/CLASS/images") from None
    except OSError as e:
        raise ConversionError(f"cannot read the source {root}: {e.strerror or e}") from None
    entries = []
    for e in listing:
        try:
            if e.is_dir():
                entries.append(e.name)
                continue
            problem = "a symbolic link to nothing" if e.is_symlink() else None
        except OSError as err:  # e.g. a link in a loop
            problem = f"a symbolic link that cannot be followed ({err.strerror or err})"
        if problem and broken is not None and not e.name.startswith("."):
            broken.append(Item(key=e.name, where=e.path, error=f"not a class folder: {problem}"))
    classes = [c for c in entries if not walker.excluded_dir(str(root), c)]
    if not classes:
        raise ConversionError(
            f"no samples found in {root}: looked for {LOOKED_FOR}, found no class folder"
            + (f"; {'; '.join(walker.notes())}" if walker.notes() else "")
        )
    return classes


def build_items(args: argparse.Namespace, notes: list[str]) -> tuple[list[Item], dict]:
    root = Path(args.src)
    walker = SourceWalker(root, args.dst, followlinks=True)
    broken: list[Item] = []
    classes = find_classes(root, walker, broken)
    items: list[Item] = []
    other: list[str] = []
    empty: list[str] = []
    for index, cls in enumerate(classes):
        # torchvision walks sorted(os.walk(class_dir, followlinks=True)) with sorted file names.
        found = len(items)
        for dirpath, files in sorted(walker.walk(str(root / cls))):
            for name in files:
                ext = os.path.splitext(name)[1][1:].lower()
                if ext not in IMAGE_EXTENSIONS:
                    other.append(os.path.join(dirpath, name))
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                key = os.path.splitext(rel)[0]
                items.append(
                    Item(
                        key=key,
                        files={canonical_extension(ext): os.path.join(dirpath, name)},
                        values={"cls": index},
                        where=os.path.join(dirpath, name),
                    )
                )
        errors = [e for e in walker.error_items() if e.key == cls or e.key.startswith(cls + "/")]
        if len(items) == found and not errors:
            empty.append(cls)
    items += walker.error_items() + broken
    notes += walker.notes()
    if other:
        notes.append(f"not input: {len(other)} file(s) that are not images, e.g. {other[0]}")
    if empty:
        notes.append(f"class folder(s) without images (kept, so indices match): {', '.join(empty)}")
    return items, {"layout": "imagefolder", "classes": classes}


def parser() -> argparse.ArgumentParser:
    return layout_parser("imagefolder", __doc__, EXAMPLES)


prepare = item_source(build_items, LOOKED_FOR)


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
