"""backend="ray" on a local multi-node Ray cluster: throughput with 1 and 2 decode nodes, the
CPU the training process spends per batch, the cost of a batch's round trip, and Ray Data on
the same workload and cluster.

    pip install -e '.[bench]'
    python benchmarks/ray_loader.py                       # 3,000 256-px JPEGs, batch 64, 3 rounds
    python benchmarks/ray_loader.py --samples 1000 --rounds 1 --results benchmarks/RESULTS.md

The workload is decode-bound: each 256-px JPEG is decoded, randomly resized-cropped to 224 px
and flipped (``ImageReader(crop=Crop.random(224), flip=0.5)``), uint8 out, plus its caption.
Every case runs in a fresh process. The cluster is ``ray.cluster_utils.Cluster`` on this
machine: a head with no CPU (where the trainer runs, so no builder goes there) and one or two
decode nodes of one CPU each; on a 2-core machine "2 decode nodes" is the whole machine, the
trainer included.

Cases:

* ``thread``: the local thread backend, 2 threads in the training process (the baseline);
* ``ray-1node``, ``ray-2nodes``: ``mmloader.loader(stream, backend="ray")``;
* ``raydata-2nodes``: Ray Data, as its docs build a training input: ``read_parquet`` of the same
  JPEGs and captions, ``map_batches`` decoding with the same decoder (mmloader's reader, per
  sample), ``streaming_split(1)`` and ``iter_torch_batches``; its iterator has no state to
  resume from (ray-project/ray#37633), which the table says;
* ``overhead-thread``, ``overhead-ray``: raw bytes (nothing decoded), the same batches: the
  difference per batch is what a batch's trip through Ray costs.

Throughput and trainer CPU count the batches after the first; the first batch's wait is given
apart (mmloader's builders are started before it, as every epoch after a job's first finds
them; Ray Data starts its operators then). Trainer CPU is the training process's own user +
system time (``getrusage``) per batch. Spilled is what Ray wrote to disk from its object store.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

CASES = ["thread", "ray-1node", "ray-2nodes", "raydata-2nodes", "overhead-thread", "overhead-ray"]


def build(out: Path, samples: int) -> dict:
    """The JPEGs and captions as an LMDB (mmloader) and a Parquet table (Ray Data)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from data import caption, photo

    import mmloader

    lmdb, table = out / "pairs.lmdb", out / "pairs.parquet"
    if not lmdb.exists():
        jpgs, texts = [], []
        for i in range(samples):
            buf = io.BytesIO()
            photo(i).save(buf, "JPEG", quality=90)
            jpgs.append(buf.getvalue())
            texts.append(caption(i))
        with mmloader.writer_for(lmdb) as w:
            for i, (jpg, text) in enumerate(zip(jpgs, texts)):
                w.write({"__key__": f"{i:06d}", "jpg": jpg, "txt": text})
        pq.write_table(pa.table({"jpg": jpgs, "txt": texts}), table, row_group_size=256)
    return {"lmdb": str(lmdb), "parquet": str(table)}


def _image_options(raw: bool) -> dict:
    import mmloader

    return {"output": "raw"} if raw else {"crop": mmloader.Crop.random(224), "flip": 0.5}


def _stream(path: str, batch: int, raw: bool):
    import mmloader

    image = mmloader.ImageReader(path, "jpg", **_image_options(raw))
    ds = mmloader.zip(image=image, caption=mmloader.TextReader(path))
    return mmloader.Stream(ds, batch_size=batch, seed=0)


def _cluster(nodes: int):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def _spilled_mb() -> float:
    """MB Ray spilled from its object stores to disk so far (0 where it cannot say)."""
    try:
        from ray._private.internal_api import memory_summary

        summary = memory_summary(stats_only=True)
    except Exception:
        return 0.0
    for line in summary.splitlines():
        if line.strip().startswith("Spilled"):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return 0.0
    return 0.0


def _timed(batches) -> dict:
    """The first batch's wait (from asking for it), then samples/s and this process's CPU per batch
    over the batches after it (an engine that reads ahead while the first batch is awaited gains
    from that: Ray Data does)."""
    began = time.perf_counter()
    it = iter(batches)
    next(it)
    first = time.perf_counter() - began
    began, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    n = count = 0
    for batch in it:
        n += 1
        count += len(batch["caption"])
    wall = time.perf_counter() - began
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "samples_per_s": count / wall,
        "first_batch_s": first,
        "trainer_cpu_ms_per_batch": 1e3 * cpu / max(n, 1),
        "batches": n,
    }


def run_one(case: str, paths: dict, batch: int) -> dict:
    import mmloader

    raw = case.startswith("overhead")
    if case in ("thread", "overhead-thread"):
        return _timed(mmloader.loader(_stream(paths["lmdb"], batch, raw), 2, backend="thread"))
    nodes = 1 if case.endswith("1node") else 2
    cluster = _cluster(nodes)
    try:
        if case.startswith("raydata"):
            figures = _timed(_ray_data(paths["parquet"], batch))
        else:
            loader = mmloader.loader(_stream(paths["lmdb"], batch, raw), backend="ray", actors=nodes)
            import ray

            ray.get([a.built.remote() for a in loader.pool().actors])  # started, as later epochs find them
            figures = _timed(loader)
        figures["spilled_mb"] = _spilled_mb()
        return figures
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


def _ray_data(parquet: str, batch: int):
    import numpy as np
    import ray.data

    import mmloader

    reader = mmloader.ImageReader(None, "jpg", **_image_options(raw=False))

    def decode(rows: dict) -> dict:
        images = np.stack(
            [reader.from_record({"__key__": "", "jpg": jpg}).permute(1, 2, 0).numpy() for jpg in rows["jpg"]]
        )
        return {"image": images, "caption": rows["txt"]}

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.verbose_progress = False
    ctx.enable_progress_bars = False
    # The shuffle Ray's training guides recommend for speed: block order, then a local buffer
    # (a global random_shuffle() first decoded nothing for 18 s on 2,000 images here).
    ds = ray.data.read_parquet(parquet).randomize_block_order(seed=0).map_batches(decode, batch_size=batch)
    (split,) = ds.streaming_split(1)
    import torch

    def collate(rows: dict) -> dict:  # captions stay strings (the default collate takes numbers only)
        return {"image": torch.as_tensor(rows["image"]), "caption": list(rows["caption"])}

    return split.iter_torch_batches(
        batch_size=batch, drop_last=False, collate_fn=collate, local_shuffle_buffer_size=4 * batch
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--out", default=None, help="where the data goes (default: a temporary folder)")
    p.add_argument("--results", help="replace this RESULTS.md's section with the table")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a single case, in this fresh process
    p.add_argument("--paths", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, json.loads(args.paths), args.batch_size)))
        return 0
    out = Path(args.out or tempfile.mkdtemp(prefix="mmloader-ray-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    paths = build(out, args.samples)
    cases = args.cases.split(",")
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in cases:  # cases alternate within a round
            cmd = [sys.executable, __file__, "--one", case, "--paths", json.dumps(paths)]
            done = subprocess.run(
                cmd + ["--batch-size", str(args.batch_size)], capture_output=True, text=True, timeout=900
            )
            if done.returncode != 0:
                raise SystemExit(f"{case} failed:\n{done.stderr[-4000:]}")
            results[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {case}: {results[case][-1]}", file=sys.stderr)
    text = report(results, args)
    print(text)
    if args.results:
        from data import write_section

        write_section(args.results, "ray", text)
    return 0


def report(results: dict[str, list[dict]], args) -> str:
    import ray
    import torch

    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case]) if results.get(case) else float("nan")

    resumes = {"raydata-2nodes": "none (no iterator state)"}
    rows = []
    for case in results:
        rows.append(
            f"| {case} | {med(case, 'samples_per_s'):,.0f} | {med(case, 'first_batch_s'):.2f} | "
            f"{med(case, 'trainer_cpu_ms_per_batch'):.1f} | "
            f"{med(case, 'spilled_mb') if 'spilled_mb' in results[case][0] else 0:.0f} | "
            f"{resumes.get(case, 'exact, mid-epoch, any world size')} |"
        )
    lines = [
        '## Decoding on a Ray cluster (backend="ray")',
        "",
        f"Command: `python benchmarks/ray_loader.py --samples {args.samples} --batch-size {args.batch_size} "
        f"--rounds {args.rounds}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}, Ray {ray.__version__}; {time.strftime('%Y-%m-%d %H:%M')}  ",
        f"Data: {args.samples} 256-px JPEGs + captions; decoded, random-resized-cropped to 224 px and flipped "
        "(uint8); a local `ray.cluster_utils.Cluster`: a head with no CPU (the trainer's) and decode nodes of "
        "1 CPU each; medians of the rounds, each case in a fresh process.",
        "",
        "| case | samples/s | first batch (s) | trainer CPU per batch (ms) | spilled (MB) | mid-epoch resume |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        *rows,
        "",
    ]
    if "thread" in results and "ray-2nodes" in results:
        lines.append(
            f"Trainer CPU per batch, ray-2nodes / thread: **{med('ray-2nodes', 'trainer_cpu_ms_per_batch') / med('thread', 'trainer_cpu_ms_per_batch'):.2f}x**."
        )
    if "ray-1node" in results and "ray-2nodes" in results:
        lines.append(
            f"Throughput, 2 decode nodes / 1: **{med('ray-2nodes', 'samples_per_s') / med('ray-1node', 'samples_per_s'):.2f}x**."
        )
    if "raydata-2nodes" in results and "ray-2nodes" in results:
        lines.append(
            f'backend="ray" / Ray Data on the same 2 nodes: **{med("ray-2nodes", "samples_per_s") / med("raydata-2nodes", "samples_per_s"):.2f}x**.'
        )
    if "overhead-thread" in results and "overhead-ray" in results:
        per_batch = lambda c: 1e3 * args.batch_size / med(c, "samples_per_s")  # noqa: E731
        lines.append(
            f"What a batch costs to go through Ray (raw bytes, nothing decoded, at full throughput): "
            f"{per_batch('overhead-ray'):.2f} ms a batch against {per_batch('overhead-thread'):.2f} ms on the thread "
            "backend."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
