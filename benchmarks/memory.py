"""Memory and first-batch latency as the dataset grows 10x: 10k vs 100k samples, LMDB and tar.

    python benchmarks/memory.py                 # writes bench-out/memory-*.{lmdb,} and prints a table

Both datasets hold real 256-px JPEG bytes (cycled from a small generated set) and captions.
In a fresh process per case, a loader with 2 worker processes reads the same number of
samples (``--read``, default 10,000) in shuffled order; we record each worker's private
memory (USS, and its anonymous part: Python objects, not file pages), the PSS of the whole
process tree, and the time to the first batch. Goal: growth under 10 MB per worker and
under 10% for the tree, first batch within 20%.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def build(path: Path, n: int, fmt: str, jpegs: list[bytes]) -> None:
    import mmloader
    if path.exists():
        return
    from data import caption
    with mmloader.writer_for(path, fmt, shard_size=1000) as w:
        for i in range(n):
            w.write({"__key__": f"{i:08d}", "jpg": jpegs[i % len(jpegs)], "txt": caption(i)})


def measure(path: str, read: int, workers: int, batch: int) -> dict:
    import threading
    import mmloader
    from data import warm
    warm(path)  # the first batch must not wait on the disk
    from mmloader.bench import _children, smaps_rollup
    ds = mmloader.zip(image=mmloader.ImageReader(path, output="raw"), caption=mmloader.TextReader(path))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=batch, seed=0), num_workers=workers,
                             persistent_workers=False)
    peaks = {"anon": 0, "uss": 0, "tree_pss": 0}

    def poll_memory():  # every 20 ms while the workers live (a 1 s sampler would miss a 0.5 s run)
        while not done.is_set():
            tree = smaps_rollup(os.getpid())["pss"]
            for c in _children(os.getpid()):
                m = smaps_rollup(c)
                tree += m["pss"]
                peaks["anon"], peaks["uss"] = max(peaks["anon"], m["anonymous"]), max(peaks["uss"], m["uss"])
            peaks["tree_pss"] = max(peaks["tree_pss"], tree)
            time.sleep(0.02)
    done = threading.Event()
    t = threading.Thread(target=poll_memory, daemon=True)
    n, first = 0, None
    it = iter(loader)  # held until the poll is done: the workers live while they are measured
    t0 = time.perf_counter()
    for b in it:
        if first is None:
            first = time.perf_counter() - t0
            # Poll only from here: reading a process's smaps takes its mmap lock, which would
            # slow the very page faults the first batch is made of.
            t.start()
        n += len(b["__key__"])
        if n >= read:
            break
    time.sleep(0.05)  # one more poll with every batch read
    done.set()
    if t.ident is not None:
        t.join()
    del it
    return {"first_batch_s": first, "tree_pss_mb": peaks["tree_pss"] / 2**20,
            "worker_uss_mb": peaks["uss"] / 2**20, "worker_anon_mb": peaks["anon"] / 2**20}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "bench-out"))
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--read", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="its memory section is replaced")
    p.add_argument("--measure", nargs=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.read, args.workers, args.batch_size)))
        return 0
    import io
    from data import MEMORY_SECTION, photo, write_section
    jpegs = []
    for i in range(256):
        buf = io.BytesIO()
        photo(i).save(buf, "JPEG", quality=90)
        jpegs.append(buf.getvalue())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = {}
    for fmt in ("lmdb", "tar"):
        for n in sizes:
            path = out / (f"memory-{n}.lmdb" if fmt == "lmdb" else f"memory-{n}")
            t0 = time.perf_counter()
            build(path, n, fmt, jpegs)
            print(f"{fmt} {n}: ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    for rep in range(args.repeats):  # alternate the cases; keep medians
        for fmt in ("lmdb", "tar"):
            for n in sizes:
                path = out / (f"memory-{n}.lmdb" if fmt == "lmdb" else f"memory-{n}")
                res = json.loads(subprocess.run([sys.executable, __file__, "--measure", str(path), "--read",
                                                 str(args.read), "--workers", str(args.workers)],
                                                capture_output=True, text=True, check=True).stdout.splitlines()[-1])
                rows.setdefault((fmt, n), []).append(res)
    import statistics
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rows.items()}
    lines = [MEMORY_SECTION, "",
             f"Command: `python benchmarks/memory.py --repeats {args.repeats}` ({sizes[0]:,} vs {sizes[-1]:,} "
             f"samples of the same 256-px JPEGs + captions; {args.workers} worker processes read the same "
             f"{args.read:,} samples, shuffled; medians of {args.repeats} fresh-process runs; "
             f"{time.strftime('%Y-%m-%d %H:%M')}).", "",
             "| format | samples | first batch (ms) | tree PSS (MB) | worker USS (MB) | worker anonymous (MB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for (fmt, n), r in med.items():
        lines.append(f"| {fmt} | {n:,} | {r['first_batch_s'] * 1000:.0f} | {r['tree_pss_mb']:.0f} | "
                     f"{r['worker_uss_mb']:.1f} | {r['worker_anon_mb']:.1f} |")
    lines.append("")
    for fmt in ("lmdb", "tar"):
        a, b = med[(fmt, sizes[0])], med[(fmt, sizes[-1])]
        lines.append(f"- {fmt}: {sizes[-1] // sizes[0]}x the samples -> worker USS "
                     f"{b['worker_uss_mb'] - a['worker_uss_mb']:+.1f} MB, anonymous "
                     f"{b['worker_anon_mb'] - a['worker_anon_mb']:+.1f} MB, tree PSS "
                     f"{100 * (b['tree_pss_mb'] / a['tree_pss_mb'] - 1):+.1f}%, first batch "
                     f"{100 * (b['first_batch_s'] / a['first_batch_s'] - 1):+.0f}%")
    section = "\n".join(lines) + "\n"
    print(section)
    write_section(args.results, "memory", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
