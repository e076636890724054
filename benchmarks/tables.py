"""Arrow and Parquet read in place, against HF ``datasets`` reading the same image-text table.

    python benchmarks/tables.py                  # writes bench-out/tables-*, prints a table
    python benchmarks/tables.py --rows 20000 --repeats 3 --results benchmarks/RESULTS.md

The table: ``--rows`` photographic 256-px JPEGs (~20 KB, cycled from 512 distinct ones) with
captions, as HF ``datasets`` holds it (an ``Image`` column ``jpg`` and a string column ``txt``),
saved with ``save_to_disk`` and ``to_parquet`` in files of 5,000 rows (one row group each). Every loader reads one
shuffled epoch with ``--workers`` workers in batches of ``--batch-size`` and delivers what a
training step takes: uint8 image tensors ``(B, 3, 256, 256)`` and the captions.

- ``mmloader-arrow``, ``mmloader-parquet``: the folder and the Parquet files read in place
  (``mmloader.loader``'s default backend).
- ``mmloader-tar``: the same table converted once (``mmloader convert parquet``): what a
  conversion buys.
- ``hf-map``: ``load_from_disk(...).with_format("torch")`` in a ``torch`` DataLoader,
  ``shuffle=True`` (PIL decodes the ``Image`` column).
- ``hf-streaming``: ``load_dataset("parquet", streaming=True)`` shuffled with a 1,000-sample
  buffer, ``with_format("torch")``, in a DataLoader (workers split the files).

Then memory as the table grows 10x (``--memory-rows``, small 64-px images): ``memory.py``'s
measurement (a fresh process, 2 worker processes reading the same number of samples) on the
Arrow folder and on Parquet in place.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
SECTION = "## Arrow and Parquet in place (`benchmarks/tables.py`)"


def build(out: Path, rows: int, px: int, convert: bool = True) -> dict:
    """The table as save_to_disk folder, Parquet files and (``convert``) converted tar shards."""
    import datasets
    from data import caption, photo

    stem = f"tables-{rows}-{px}px-v4"
    paths = {"arrow": out / f"{stem}-arrow", "parquet": out / f"{stem}-parquet"}
    if convert:
        paths["tar"] = out / f"{stem}-tar"
    if all(p.exists() for p in paths.values()):
        return paths
    jpegs = []
    for i in range(min(rows, 512)):
        buf = io.BytesIO()
        photo(i, px).save(buf, "JPEG", quality=90)
        jpegs.append(buf.getvalue())

    def gen():
        for i in range(rows):
            yield {"jpg": {"bytes": jpegs[i % len(jpegs)], "path": None}, "txt": caption(i)}

    features = datasets.Features({"jpg": datasets.Image(), "txt": datasets.Value("string")})
    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=str(out / "hf-cache"))
    # files of 5,000 rows (at least 2): a table 10x larger has 10x the files, as sharded datasets
    # do, so its row groups (decoded whole) stay the size they were
    shards = max(2, -(-rows // 5000))
    ds.save_to_disk(str(paths["arrow"]), num_shards=shards)
    paths["parquet"].mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        ds.shard(shards, k, contiguous=True).to_parquet(str(paths["parquet"] / f"part-{k:04d}.parquet"))
    if not convert:
        return paths
    mm = str(Path(sys.executable).parent / "mmloader")
    subprocess.run(
        [mm, "convert", "parquet", str(paths["parquet"]), str(paths["tar"]), "--image-column", "jpg",
         "--text-column", "txt", "--shard-size", "2000", "-q"],
        check=True,
    )  # fmt: skip
    return paths


def run(case: str, paths: dict, workers: int, batch: int) -> dict:
    """One shuffled epoch of ``case``: samples/s and the first batch's wait."""
    import torch
    from data import warm

    import mmloader

    path = (
        paths[case.split("-")[1]] if case.startswith("mmloader") else paths["arrow" if case == "hf-map" else "parquet"]
    )
    warm(path)
    if case.startswith("mmloader"):
        ds = mmloader.zip(
            image=mmloader.ImageReader(str(path), field="jpg"), text=mmloader.TextReader(str(path), field="txt")
        )
        loader = mmloader.loader(mmloader.Stream(ds, batch_size=batch, seed=0), num_workers=workers)
    elif case == "hf-map":
        import datasets

        table = datasets.load_from_disk(str(path)).with_format("torch")
        loader = torch.utils.data.DataLoader(table, batch_size=batch, shuffle=True, num_workers=workers)
    else:
        import datasets

        files = sorted(str(p) for p in Path(path).glob("*.parquet"))
        stream = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        stream = stream.shuffle(seed=0, buffer_size=1000).with_format("torch")
        loader = torch.utils.data.DataLoader(stream, batch_size=batch, num_workers=workers)
    n, first = 0, None
    t0 = time.perf_counter()
    for b in loader:
        images = b["image"] if "image" in b else b["jpg"]
        assert images.dtype == torch.uint8 and images.shape[1] == 3, (case, images.shape)
        n += len(images)
        if first is None:
            first = time.perf_counter() - t0
    return {"samples_per_s": n / (time.perf_counter() - t0), "first_batch_s": first, "samples": n}


def memory(path: Path, read: int, workers: int) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "memory.py"), "--measure", str(path), "process", "--read", str(read),
         "--workers", str(workers), "--batch-size", "64"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "bench-out"))
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default="mmloader-arrow,mmloader-parquet,mmloader-tar,hf-map,hf-streaming")
    p.add_argument("--memory-rows", default="10000,100000", help="table sizes of the memory measurement")
    p.add_argument("--memory-read", type=int, default=10_000)
    p.add_argument("--results", help="replace this RESULTS.md's section with the table")
    p.add_argument("--case", nargs=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.case:
        paths = {k: Path(v) for k, v in json.loads(os.environ["TABLES_PATHS"]).items()}
        print(json.dumps(run(args.case[0], paths, args.workers, args.batch_size)))
        return 0
    t0 = time.perf_counter()
    paths = build(out, args.rows, 256)
    print(f"table of {args.rows:,} rows ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    env = {**os.environ, "TABLES_PATHS": json.dumps({k: str(v) for k, v in paths.items()})}
    cases = [c for c in args.cases.split(",") if c and c != "none"]
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for rep in range(args.repeats):  # a fresh process per run, cases alternating
        for case in cases:
            cmd = [
                sys.executable,
                __file__,
                "--case",
                case,
                "--workers",
                str(args.workers),
                "--batch-size",
                str(args.batch_size),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:
                print(f"{case}: failed\n{done.stderr[-2000:]}", flush=True)
                continue
            res = json.loads(done.stdout.splitlines()[-1])
            results[case].append(res)
            print(
                f"repeat {rep}: {case}: {res['samples_per_s']:.0f} samples/s, first batch {res['first_batch_s'] * 1000:.0f} ms",
                flush=True,
            )
    saved = out / f"tables-{args.rows}-results.json"  # --cases none keeps the last throughput figures
    if cases:
        saved.write_text(json.dumps(results))
    elif saved.exists():
        results = json.loads(saved.read_text())
        cases = list(results)
    sizes = [int(s) for s in args.memory_rows.split(",")]
    mem: dict[tuple[str, int], dict] = {}
    for n in sizes:
        small = build(out, n, 64, convert=False)
        for kind in ("arrow", "parquet"):
            mem[kind, n] = memory(small[kind], min(args.memory_read, n), args.workers)
            print(f"memory {kind} {n:,} rows: {mem[kind, n]}", flush=True)

    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case]) if results[case] else float("nan")

    hf_best = max((med(c, "samples_per_s") for c in ("hf-map", "hf-streaming") if c in results), default=float("nan"))
    lines = [
        SECTION,
        "",
        f"Command: `python benchmarks/tables.py --rows {args.rows} --repeats {args.repeats}` ({args.rows:,} rows of 256-px "
        f"JPEGs + captions; {args.workers} workers, batch {args.batch_size}, one shuffled epoch per run, fresh "
        f"processes, cases alternating; medians of {args.repeats}; {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| loader | samples/s | vs the better HF datasets | first batch |",
        "| --- | ---: | ---: | ---: |",
    ]
    for case in cases:
        sps = med(case, "samples_per_s")
        lines.append(f"| {case} | {sps:,.0f} | {sps / hf_best:.2f}x | {med(case, 'first_batch_s') * 1000:.0f} ms |")
    lines += [
        "",
        f"Memory as the table grows {sizes[-1] // sizes[0]}x (64-px JPEGs; 2 worker processes read the same "
        f"{min(args.memory_read, sizes[0]):,} samples, shuffled; peaks):",
        "",
        "| in place | rows | worker USS | worker anonymous | tree PSS | first batch |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (kind, n), m in mem.items():
        lines.append(
            f"| {kind} | {n:,} | {m['worker_uss_mb']:.1f} MB | {m['worker_anon_mb']:.1f} MB | {m['tree_pss_mb']:.0f} MB "
            f"| {m['first_batch_s'] * 1000:.0f} ms |"
        )
    lines += [
        "",
        "Worker USS counts the pages of memory-mapped files a worker touched, so it moves from run to run; "
        "anonymous memory is what a worker holds itself. Arrow: flat. Parquet: a worker holds the row-group cache "
        "(`cache_bytes`; here its 64 MiB minimum) and what the allocator keeps of decoded groups, so its memory "
        "grows until the table outgrows the cache (the smallest table's images, 22 MB, fit whole) and is flat "
        "beyond it. Handing freed groups back after each eviction (`release_unused()`) held it lower but cost 30% "
        "of the throughput; the system allocator held more.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.results:
        from data import write_section

        write_section(args.results, "tables", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
