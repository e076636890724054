"""What a live source costs per sample, against a plain generator in a DataLoader.

    python benchmarks/live.py                  # 200,000 samples a run, batch 64, 2 workers

The same generator (each reader's own slice: a key and a small tensor, the cheapest sample,
so that what is measured is the path, not the work) is read

* by a plain ``torch.utils.data.DataLoader`` over an ``IterableDataset`` that splits it by
  worker (what people write by hand; no rank agreement, no checkpoints, no stall timeout),
* by ``mmloader.live`` through ``mmloader.loader`` on each backend.

Then the ranks' agreement alone: the ``all_reduce`` of one integer that a live stream runs
before each batch, timed on 2 gloo ranks on loopback. Prints samples/s (median of
``--rounds``) and the overhead per sample.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

import mmloader  # noqa: E402


def slice_samples(part: int, count: int):
    x = torch.zeros(16)
    for i in range(count):
        yield {"__key__": f"p{part}-{i}", "x": x}


class PlainGenerator(torch.utils.data.IterableDataset):
    """The hand-written baseline: each worker iterates its own slice."""

    def __init__(self, per_worker: int):
        self.per_worker = per_worker

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        yield from slice_samples(info.id if info else 0, self.per_worker)


def plain(samples: int, batch: int, workers: int) -> float:
    loader = torch.utils.data.DataLoader(
        PlainGenerator(samples // workers), batch_size=batch, num_workers=workers, multiprocessing_context="fork"
    )
    began = time.perf_counter()
    n = sum(len(b["__key__"]) for b in loader)
    return n / (time.perf_counter() - began)


def live(samples: int, batch: int, workers: int, backend: str) -> float:
    readers = workers if backend == "process" else 1
    per_reader = samples // readers
    source = mmloader.live(lambda r, w, k, K: slice_samples(k, per_reader), name="bench")
    stream = mmloader.LiveStream(source, batch_size=batch, steps=samples // batch)
    kwargs = {"multiprocessing_context": "fork"} if backend == "process" else {}
    loader = mmloader.loader(stream, workers, backend=backend, **kwargs)
    began = time.perf_counter()
    n = sum(len(b["__key__"]) for b in loader)
    return n / (time.perf_counter() - began)


def _agree_rank(rank: int, init: str, calls: int, out: str) -> None:
    from mmloader.live_sources.agree import READY, agree, agreement_group

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    group = agreement_group(None)
    for _ in range(50):
        agree(READY, group, 2, rank)
    began = time.perf_counter()
    for _ in range(calls):
        agree(READY, group, 2, rank)
    if rank == 0:
        Path(out).write_text(str((time.perf_counter() - began) / calls))
    dist.destroy_process_group()


def agreement_cost(calls: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t")
        tmp.spawn(_agree_rank, args=(os.path.join(d, "init"), calls, out), nprocs=2, join=True)
        return float(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = {
        "plain generator in a DataLoader (2 worker processes)": lambda: plain(args.samples, args.batch, args.workers),
        "mmloader.live, process backend": lambda: live(args.samples, args.batch, args.workers, "process"),
        "mmloader.live, thread backend": lambda: live(args.samples, args.batch, args.workers, "thread"),
    }
    rates = {}
    for name, run in runs.items():
        rates[name] = statistics.median(run() for _ in range(args.rounds))
    base = next(iter(rates.values()))
    print(f"{args.samples:,} samples a run, batch {args.batch}, {args.workers} workers, median of {args.rounds}")
    print("| path | samples/s | overhead per sample |")
    print("| --- | ---: | ---: |")
    for name, rate in rates.items():
        extra = 1e6 / rate - 1e6 / base
        print(f"| {name} | {rate:,.0f} | {'' if rate == base else f'{extra:+.2f} us'} |")
    cost = agreement_cost(2_000)
    print(
        f"\nthe ranks' agreement (all_reduce of one int64, 2 gloo ranks on loopback): {cost * 1e6:.0f} us a batch, "
        f"{cost * 1e6 / args.batch:.2f} us a sample at batch {args.batch}"
    )


if __name__ == "__main__":
    main()
