"""Generate a raw image+caption folder the demo model can really learn from.

Each sample is a coloured shape on a coloured background, with a caption that
describes it ("a small red circle on a blue background") and a class label
(the shape). Layout: ``OUT/NNNNNN.jpg``, ``.txt``, ``.cls`` (the ``pairs`` layout).

    python samples/make_data.py demo-out/raw --count 2000
"""
from __future__ import annotations

import argparse
import os
import random
import sys

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (235, 210, 40),
           "purple": (150, 60, 190), "white": (245, 245, 245), "black": (20, 20, 20), "orange": (240, 140, 30)}
SHAPES = ["circle", "square", "triangle"]
SIZES = {"small": 0.3, "large": 0.7}


def render(rng: random.Random, px: int) -> tuple[Image.Image, str, int]:
    shape = rng.randrange(len(SHAPES))
    fg, bg = rng.sample(sorted(COLOURS), 2)
    size_name = rng.choice(sorted(SIZES))
    im = Image.new("RGB", (px, px), COLOURS[bg])
    draw = ImageDraw.Draw(im)
    r = SIZES[size_name] * px / 2
    cx = rng.uniform(r, px - r)
    cy = rng.uniform(r, px - r)
    if SHAPES[shape] == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[fg])
    elif SHAPES[shape] == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[fg])
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=COLOURS[fg])
    caption = f"a {size_name} {fg} {SHAPES[shape]} on a {bg} background"
    return im, caption, shape


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--size", type=int, default=64, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", default=None, help="also write captions to this text file, "
                   "one per line (a text-only source for mixing experiments)")
    p.add_argument("--corpus-lines", type=int, default=5000)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    for i in range(args.count):
        im, caption, label = render(rng, args.size)
        stem = os.path.join(args.out, f"{i:06d}")
        im.save(stem + ".jpg", quality=90)
        with open(stem + ".txt", "w") as f:
            f.write(caption)
        with open(stem + ".cls", "w") as f:
            f.write(str(label))
    print(f"wrote {args.count} image+caption pairs to {args.out}")
    if args.corpus:
        with open(args.corpus, "w") as f:
            for _ in range(args.corpus_lines):
                f.write(render(rng, 8)[1] + "\n")
        print(f"wrote {args.corpus_lines} captions, one per line, to {args.corpus}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
