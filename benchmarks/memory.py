"""Memory and first-batch latency as the dataset grows 10x: 10k vs 100k samples, LMDB and tar.

    python benchmarks/memory.py                 # writes bench-out/memory-*.{lmdb,} and prints a table

Both datasets hold real 256-px JPEG bytes (cycled from a small generated set) and captions.
In a fresh process per case, a loader reads the same number of samples (``--read``, default
10,000) in shuffled order, with 2 worker processes (``backend="process"``: each worker's private
memory, USS and its anonymous part: Python objects, not file pages) and with the default for
this pipeline, threads (``backend="thread"``: one process); we record the PSS of the whole
process tree and the time to the first batch. Cases alternate within each repeat; the report
gives medians and the spread (min-max) of ``--repeats`` runs, and the growth of each repeat's
pair of runs. The first batch (~10-50 ms, mostly starting workers) varies by tens of percent
from run to run, so it also gets ``--first-runs`` short runs of its own (one batch each, sizes
alternating). Goal: growth under 10 MB per worker and under 10% for the tree, first batch
within 20%.
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


def dataset_path(out: Path, fmt: str, n: int) -> Path:
    return out / (f"memory-{n}.lmdb" if fmt == "lmdb" else f"memory-{n}")


def measure(path: str, read: int, workers: int, batch: int, backend: str) -> dict:
    import threading

    from data import warm

    import mmloader

    warm(path)  # the first batch must not wait on the disk
    from mmloader.cli.bench import _children, smaps_rollup

    ds = mmloader.zip(image=mmloader.ImageReader(path, output="raw"), caption=mmloader.TextReader(path))
    stream = mmloader.Stream(ds, batch_size=batch, seed=0)
    loader = (
        mmloader.loader(stream, num_workers=workers, persistent_workers=False)
        if backend == "process"
        else mmloader.loader(stream, num_workers=workers, backend="thread")
    )
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
    return {
        "first_batch_s": first,
        "tree_pss_mb": peaks["tree_pss"] / 2**20,
        "worker_uss_mb": peaks["uss"] / 2**20,
        "worker_anon_mb": peaks["anon"] / 2**20,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "bench-out"))
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--read", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--first-runs", type=int, default=15, help="extra one-batch runs per case for the first batch")
    p.add_argument("--backends", default="process,thread")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="its memory section is replaced")
    p.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.read, args.workers, args.batch_size, args.measure[1])))
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
            path = dataset_path(out, fmt, n)
            t0 = time.perf_counter()
            build(path, n, fmt, jpegs)
            print(f"{fmt} {n}: ready ({time.perf_counter() - t0:.0f} s)", flush=True)

    def run_case(path: Path, backend: str, read: int) -> dict:  # a fresh process per run
        cmd = [
            sys.executable,
            __file__,
            "--measure",
            str(path),
            backend,
            "--read",
            str(read),
            "--workers",
            str(args.workers),
            "--batch-size",
            str(args.batch_size),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.splitlines()[-1])

    backends = args.backends.split(",")
    cases = [(backend, fmt) for backend in backends for fmt in ("lmdb", "tar")]
    for rep in range(args.repeats):  # alternate the cases; each repeat measures both sizes back to back
        for backend, fmt in cases:
            for n in sizes:
                res = run_case(dataset_path(out, fmt, n), backend, args.read)
                rows.setdefault((backend, fmt, n), []).append(res)
                print(
                    f"repeat {rep}: {backend} {fmt} {n}: first {res['first_batch_s'] * 1000:.0f} ms, tree PSS "
                    f"{res['tree_pss_mb']:.0f} MB, worker USS {res['worker_uss_mb']:.1f} MB",
                    flush=True,
                )
    firsts: dict = {}
    for rep in range(args.first_runs):  # one batch each: the first batch's own sample, cases alternating
        for backend, fmt in cases:
            for n in sizes:
                res = run_case(dataset_path(out, fmt, n), backend, 1)
                firsts.setdefault((backend, fmt, n), []).append(res)
        print(f"first-batch run {rep + 1}/{args.first_runs} done", flush=True)
    for key, runs in rows.items():  # the first batch from every run, long and short
        firsts[key] = runs + firsts.get(key, [])
    (out / "memory-results.json").write_text(
        json.dumps(
            {"runs": [[*k, v] for k, v in rows.items()], "first_batch": [[*k, v] for k, v in firsts.items()]}, indent=1
        )
    )
    import statistics

    def cell(runs: list[dict], key: str, scale: float = 1.0, digits: int = 0) -> str:
        vals = [r[key] * scale for r in runs]
        return f"{statistics.median(vals):.{digits}f} ({min(vals):.{digits}f}-{max(vals):.{digits}f})"

    lines = [
        MEMORY_SECTION,
        "",
        f"Command: `python benchmarks/memory.py --repeats {args.repeats} --first-runs {args.first_runs}` "
        f"({sizes[0]:,} vs {sizes[-1]:,} "
        f"samples of the same 256-px JPEGs + captions, raw bytes; {args.workers} workers (processes, or "
        f"threads of one process) read the same {args.read:,} samples, shuffled; medians and (min-max) of "
        f"{args.repeats} fresh-process runs, cases alternating; the first batch over those and "
        f"{args.first_runs} one-batch runs more; {time.strftime('%Y-%m-%d %H:%M')}; load "
        f"average {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| backend | format | samples | first batch (ms) | tree PSS (MB) | worker USS (MB) | worker anonymous (MB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (backend, fmt, n), runs in rows.items():
        workers = backend == "process"
        lines.append(
            f"| {backend} | {fmt} | {n:,} | {cell(firsts[(backend, fmt, n)], 'first_batch_s', 1000)} | "
            f"{cell(runs, 'tree_pss_mb')} | "
            + (
                f"{cell(runs, 'worker_uss_mb', digits=1)} | {cell(runs, 'worker_anon_mb', digits=1)} |"
                if workers
                else "- | - |"
            )
        )
    lines += [
        "",
        f"Growth for {sizes[-1] // sizes[0]}x the samples (each repeat's pair of runs; median and range; "
        "goals: tree PSS <= 10%, first batch <= 20%, worker USS < 10 MB):",
        "",
    ]
    for backend, fmt in cases:
        a, b = rows[(backend, fmt, sizes[0])], rows[(backend, fmt, sizes[-1])]

        def growth(key: str, relative: bool = True, a=a, b=b) -> tuple[float, float, float]:
            d = [(y[key] / x[key] - 1) * 100 if relative else y[key] - x[key] for x, y in zip(a, b)]
            return statistics.median(d), min(d), max(d)

        pss = growth("tree_pss_mb")
        first = growth("first_batch_s", a=firsts[(backend, fmt, sizes[0])], b=firsts[(backend, fmt, sizes[-1])])
        text = (
            f"- {backend}, {fmt}: tree PSS {pss[0]:+.1f}% ({pss[1]:+.1f} to {pss[2]:+.1f}), first batch "
            f"{first[0]:+.0f}% ({first[1]:+.0f} to {first[2]:+.0f})"
        )
        met = pss[0] <= 10 and first[0] <= 20
        if backend == "process":
            uss = growth("worker_uss_mb", relative=False)
            text += f", worker USS {uss[0]:+.1f} MB ({uss[1]:+.1f} to {uss[2]:+.1f})"
            met = met and uss[0] < 10
        lines.append(text + f": **{'met' if met else 'not met'}** (medians)")
    section = "\n".join(lines) + "\n"
    print(section)
    write_section(args.results, "memory", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
