"""What holds a training loop up, said in a line from :meth:`loader.stats()` figures.

The builders (worker processes, threads) spend ``read + decode + collate`` milliseconds on a
batch each, so ``workers`` of them make ``workers * 1000 / that`` batches a second; the loop
takes one every ``compute`` milliseconds. When the builders could not keep up, the largest
stage is the one to work on; when they could and the loop still waits, the time goes in
between: handing batches to the training process (their size), or too little prefetch.

>>> advice({"batches": 100, "wait_fraction": 0.02}, workers=4)
'data keeps up: the loop waits for it 2% of its time'
>>> figures = {"batches": 100, "wait_fraction": 0.6, "compute_ms_per_batch": 10.0,
...            "read_ms_per_batch": 2.0, "decode_ms_per_batch": 70.0, "collate_ms_per_batch": 1.0}
>>> advice(figures, workers=2).split(":")[0]
'decode is the bottleneck'
"""

from __future__ import annotations

import math
from typing import Mapping

from ..readers.timing import STAGES

KEEPS_UP = 0.05  # a loop that waits less than this share of its time is not held up by data

REMEDIES = {
    "read": "read from local disk or a cache (remote stores: a bigger read-ahead), bigger shards, or more workers",
    "decode": (
        "more workers, decode images on the GPU (mmloader.GPUDecode), store them smaller (convert "
        "--resize-max) or decode at reduced scale (ImageReader(size=...)), or backend='ray' to decode "
        "on other machines"
    ),
    "collate": "let mmloader collate (its default builds columns, not rows), or pad less (bucketing, packing)",
}


def advice(figures: Mapping[str, float], workers: int, step_ms: float | None = None) -> str:
    """One line: whether data keeps up with the loop, else which stage to work on and how.

    Args:
        figures: what ``loader.stats()`` returned (over an interval of steady training).
        workers: the builders that made the batches (``num_workers``; the Ray backend's actors).
        step_ms: the training step's milliseconds, where the loop measured has none (a
            benchmark); default: the figures' ``compute_ms_per_batch``.
    """
    if not figures.get("batches"):
        return "no batches delivered yet"
    workers = max(1, workers)  # (no workers: the loop's own thread builds)
    wait = float(figures.get("wait_fraction", 0.0))
    if step_ms is None and wait < KEEPS_UP:
        return f"data keeps up: the loop waits for it {100 * wait:.0f}% of its time"
    stages = {s: float(figures[f"{s}_ms_per_batch"]) for s in STAGES if f"{s}_ms_per_batch" in figures}
    step = float(step_ms if step_ms is not None else figures.get("compute_ms_per_batch", 0.0))
    if not stages:
        return (
            f"the loop waits for data {100 * wait:.0f}% of its time; these builders do not report their "
            "stages (the Ray backend's build elsewhere): add builders (actors=, decode nodes)"
        )
    built_ms = sum(stages.values())
    needed = math.ceil(built_ms / step) if step > 0 else workers + 1
    if needed > workers:
        slow = max(stages, key=lambda s: stages[s])
        return (
            f"{slow} is the bottleneck: {stages[slow]:.1f} of the {built_ms:.1f} ms a builder spends per batch "
            f"({', '.join(f'{s} {v:.1f}' for s, v in stages.items())}); {workers} builder(s) make a batch every "
            f"{built_ms / workers:.1f} ms, the step takes {step:.1f} ms (about {needed} builders would keep up): "
            f"{REMEDIES[slow]}"
        )
    if step_ms is not None:
        return f"data keeps up: {workers} builder(s) make a batch every {built_ms / workers:.1f} ms, the step takes {step:.1f} ms"
    return (
        f"the loop waits for data {100 * wait:.0f}% of its time though {workers} builder(s) could make a batch "
        f"every {built_ms / workers:.1f} ms (the step takes {step:.1f} ms): the time goes in handing batches "
        "over (smaller batches: uint8 images, GPUDecode) or in too little prefetch (prefetch_factor=, in_flight=)"
    )
