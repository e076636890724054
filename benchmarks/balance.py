"""Compute-balanced packed steps: how unevenly attention cost falls on data-parallel ranks, with
and without ``Packing(balance="attention")``, on the packing benchmark's data.

    python benchmarks/balance.py                         # the packing benchmark's 40,000 samples
    python benchmarks/balance.py --samples 10000 --worlds 8,64

Each global step gives every rank ``R`` packed rows of ``L`` tokens (4 at 4,096, 2 at 8,192, as
benchmarks/packing.py). A row's attention cost is the sum of its samples' squared lengths (each
sample attends within itself, FlashAttention's varlen). Per step: the slowest rank's cost over
the mean rank's (what the others wait for); reported as the mean and the 99th percentile over
an epoch's steps, and the share of the epoch's compute the ranks spend waiting. Planning only:
no sample is read (the rows are those the loader delivers: tests/loading/test_balanced_packing.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from mmloader.planning.balance import deal_step, row_costs  # noqa: E402
from mmloader.planning.packing import pack_rows  # noqa: E402


def imbalance(costs: np.ndarray, world: int, per: int, deal: bool) -> tuple[np.ndarray, float]:
    """(per-step max/mean over an epoch's whole global steps, share of compute spent waiting)."""
    steps = len(costs) // (world * per)
    ratios, waited, total = np.empty(steps), 0.0, 0.0
    for s in range(steps):
        # rank r's rows of step s, as the plan splits an epoch: contiguous per rank
        rows = np.concatenate([np.arange(per) + r * steps * per + s * per for r in range(world)])
        step = costs[rows]
        if deal:
            step = step[deal_step(step, world)]
        per_rank = step.reshape(world, per).sum(axis=1)
        ratios[s] = per_rank.max() / per_rank.mean()
        waited += float(per_rank.max() * world - per_rank.sum())
        total += float(per_rank.max() * world)
    return ratios, waited / total if total else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=40_000)
    p.add_argument("--worlds", default="8,64")
    p.add_argument("--lengths", default="4096,8192", help="token budgets L")
    p.add_argument("--work", default="/tmp/packbench", help="the packing benchmark's data (made there if absent)")
    p.add_argument("--results", help="replace this RESULTS.md's section with the table")
    args = p.parse_args()
    from packing import make_data

    lengths = np.load(make_data(Path(args.work), args.samples) / "lengths.npy").astype(np.int64)
    lines = [
        "## Compute-balanced packed steps",
        "",
        f"Command: `python benchmarks/balance.py --samples {args.samples} --worlds {args.worlds}`; "
        f"{time.strftime('%Y-%m-%d %H:%M')}  ",
        "Data: the packing benchmark's (captions with one 576-token image, and documents with 0-6); a row's cost "
        "is the sum of its samples' squared lengths; per global step, the slowest rank's cost over the mean rank's, "
        "then the mean and 99th percentile over the epoch, and the share of compute spent waiting for the slowest.",
        "",
        "| L | rows per rank | ranks | steps | max/mean, plan's split | max/mean, balanced | p99 plan / balanced | waiting, plan / balanced |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for capacity in map(int, args.lengths.split(",")):
        per = 4 if capacity <= 4096 else 2
        clipped = np.minimum(lengths, capacity)
        members, offsets = pack_rows(clipped, capacity, seed=0, epoch=0)
        costs = row_costs(clipped[members], offsets, "attention")
        for world in map(int, args.worlds.split(",")):
            plain, wait_plain = imbalance(costs, world, per, deal=False)
            dealt, wait_dealt = imbalance(costs, world, per, deal=True)
            lines.append(
                f"| {capacity} | {per} | {world} | {len(plain)} | {plain.mean():.3f} | {dealt.mean():.3f} | "
                f"{np.percentile(plain, 99):.3f} / {np.percentile(dealt, 99):.3f} | "
                f"{100 * wait_plain:.1f}% / {100 * wait_dealt:.1f}% |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.results:
        from data import write_section

        write_section(args.results, "balance", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
