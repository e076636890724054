"""Benchmark data: photographic-looking 256-px JPEGs (~20 KB) with captions, as a raw pairs folder."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = (
    "a photo of the small large red green blue old new dog cat car tree house river mountain street "
    "person sitting standing near under beside with at in on during sunny cloudy evening"
).split()


def photo(seed: int, px: int = 256) -> Image.Image:
    """Smooth colour fields + mid-frequency texture + grain: compresses like a photo, not like noise."""
    rng = np.random.default_rng(seed)
    layers = np.zeros((px, px, 3), np.float32)
    for cells, amp in ((4, 120.0), (16, 45.0), (64, 26.0)):
        small = rng.normal(0, 1, (cells, cells, 3)).astype(np.float32)
        up = (
            np.asarray(
                Image.fromarray(((small - small.min()) / (np.ptp(small) + 1e-6) * 255).astype(np.uint8)).resize(
                    (px, px), Image.BICUBIC
                ),
                np.float32,
            )
            / 255
            - 0.5
        )
        layers += amp * up
    layers += rng.uniform(60, 190, 3).astype(np.float32)
    im = Image.fromarray(np.clip(layers, 0, 255).astype(np.uint8))
    from PIL import ImageDraw, ImageFilter

    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(4, 9))):  # objects: hard edges, like things in a scene
        x0, y0 = rng.integers(0, px - 20, 2)
        w, h = rng.integers(15, px // 2, 2)
        fill = tuple(int(c) for c in rng.integers(0, 255, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x0 + w, y0 + h], fill=fill)
    im = im.filter(ImageFilter.GaussianBlur(0.8))
    grain = rng.normal(0, 7.5, (px, px, 3)).astype(np.float32)
    return Image.fromarray(np.clip(np.asarray(im, np.float32) + grain, 0, 255).astype(np.uint8))


def caption(seed: int) -> str:
    rng = np.random.default_rng(seed + 1_000_003)
    return " ".join(rng.choice(WORDS, size=rng.integers(6, 14)))


def _write(args) -> int:
    out, start, stop, quality = args
    total = 0
    for i in range(start, stop):
        buf = io.BytesIO()
        photo(i).save(buf, "JPEG", quality=quality)
        (Path(out) / f"{i:07d}.jpg").write_bytes(buf.getvalue())
        (Path(out) / f"{i:07d}.txt").write_text(caption(i))
        total += buf.tell()
    return total


def make_folder(out: str | os.PathLike, count: int, quality: int = 90, workers: int | None = None) -> float:
    """Write ``count`` pairs into ``out``; returns the mean JPEG size in bytes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    step = max(1, count // (workers * 8))
    jobs = [(str(out), a, min(a + step, count), quality) for a in range(0, count, step)]
    with mp.get_context("fork").Pool(workers) as pool:
        total = sum(pool.map(_write, jobs))
    return total / max(count, 1)


if __name__ == "__main__":
    import sys

    print(make_folder(sys.argv[1], int(sys.argv[2])))


MEMORY_SECTION = "## Memory as the dataset grows 10x"


def write_section(results: str | os.PathLike, name: str, text: str) -> None:
    """Put ``text`` into RESULTS.md as section ``name``, between markers, keeping every other
    benchmark's section: each script owns its section and rewrites only that."""
    path = Path(results)
    begin, end = f"<!-- section {name} -->", f"<!-- end {name} -->"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def warm(path: str | os.PathLike) -> None:
    """Read every file under ``path`` once: "page cache warm" must hold for each measured run,
    and this VM's memory reclaim (kdamond) drops cold page cache between runs."""
    p = Path(path)
    for f in p.rglob("*") if p.is_dir() else [p]:
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 22):
                    pass
