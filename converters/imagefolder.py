"""``ROOT/CLASS/*.jpg`` -> image field (its real extension) + ``cls``.

Class indices are exactly those of ``torchvision.datasets.ImageFolder`` on the
same folder (sorted class directory names); the class names go into the
dataset metadata as ``classes``.

    python -m converters.imagefolder train/ train.lmdb --workers 2
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .common import ConversionError, IMAGE_EXTENSIONS, Item, layout_parser, run


def find_classes(root: Path) -> list[str]:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise ConversionError(f"{root} has no class directories (expected ROOT/CLASS/image files)")
    return classes


def build_items(args: argparse.Namespace) -> tuple[list[Item], dict]:
    root = Path(args.src)
    classes = find_classes(root)
    items: list[Item] = []
    for index, cls in enumerate(classes):
        # torchvision walks sorted(os.walk(class_dir, followlinks=True)) with sorted file names.
        for dirpath, _dirs, files in sorted(os.walk(root / cls, followlinks=True)):
            for name in sorted(files):
                stem, ext = os.path.splitext(name)
                if ext[1:].lower() not in IMAGE_EXTENSIONS:
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                key = os.path.splitext(rel)[0]
                items.append(Item(key=key, files={ext[1:].lower(): os.path.join(dirpath, name)},
                                  values={"cls": index}, where=os.path.join(dirpath, name)))
    return items, {"layout": "imagefolder", "classes": classes, "source": str(root.resolve())}


def parser() -> argparse.ArgumentParser:
    return layout_parser("imagefolder", __doc__)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_items, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
