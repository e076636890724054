"""How fast mmloader.select filters a json metadata column, and how fast its cache answers.

    python benchmarks/selection.py --samples 10000000     # writes bench-out/select-10000000.lmdb

An LMDB dataset of ``--samples`` records, each a small img2dataset-style json (clip score,
width, height, status, url) plus a label, is filtered on two json fields and the label:
``meta.clip_score >= 0.28 and meta.width >= 256 and label != 3``. The first run reads and parses
the whole column (one ``json.loads`` per chunk of 16,384 values); the second run finds the result
in the cache. Prints seconds and samples per second of each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

EXPRESSION = "meta.clip_score >= 0.28 and meta.width >= 256 and label != 3"


def build(path: Path, n: int) -> None:
    import numpy as np

    import mmloader

    if path.exists():
        return
    rng = np.random.default_rng(0)
    scores, widths = rng.uniform(0.1, 0.4, n).round(4), rng.integers(64, 1024, n)
    started = time.perf_counter()
    with mmloader.LMDBWriter(path, map_size=1 << 36, commit_every=100_000) as w:
        for i in range(n):
            meta = {
                "clip_score": float(scores[i]),
                "width": int(widths[i]),
                "height": int(widths[i]) * 3 // 4,
                "status": "success",
                "url": f"https://example.com/{i}.jpg",
            }
            w.write({"__key__": f"{i:09d}", "json": json.dumps(meta).encode(), "cls": str(i % 10).encode()})
            if i and i % 1_000_000 == 0:
                print(f"  wrote {i:,} samples in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(f"built {n:,} samples in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    args = parser.parse_args()
    import mmloader

    path = args.out / f"select-{args.samples}.lmdb"
    args.out.mkdir(exist_ok=True)
    build(path, args.samples)
    cache = args.out / "select-cache"
    shutil.rmtree(cache, ignore_errors=True)
    ds = mmloader.zip(meta=mmloader.JSONReader(str(path)), label=mmloader.LabelReader(str(path)))
    rows = []
    for run in ("first (reads the column)", "again (from the cache)"):
        started = time.perf_counter()
        kept = mmloader.select(ds, EXPRESSION, cache_dir=cache, progress=False)
        seconds = time.perf_counter() - started
        rows.append((run, seconds, len(kept)))
    print(f"filter {EXPRESSION!r} over {args.samples:,} samples")
    print(f"  {'run':<26} {'seconds':>9} {'samples/s':>12} {'kept':>10}")
    for run, seconds, kept_n in rows:
        print(f"  {run:<26} {seconds:>9.2f} {args.samples / seconds:>12,.0f} {kept_n:>10,}")


if __name__ == "__main__":
    main()
