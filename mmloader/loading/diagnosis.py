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
    "read": (
        "read from local disk or a cache (remote stores: a bigger read-ahead), bigger shards, or more workers "
        "(a live source: a faster producer, or more readers)"
    ),
    "decode": (
        "more workers, decode images on the GPU (mmloader.GPUDecode), store them smaller (convert "
        "--resize-max) or decode at reduced scale (ImageReader(size=...)), or backend='ray' to decode "
        "on other machines"
    ),
    "collate": "let mmloader collate (its default builds columns, not rows), or pad less (bucketing, packing)",
}


def advice(figures: Mapping[str, float], workers: int | None = None) -> str:
    """One line, starting with what was found (``data keeps up``, ``<stage> is the
    bottleneck``, ``hand-over``, ``no stage figures``, then ``:``), then the figures it rests
    on and what to do.

    Args:
        figures: what ``loader.stats()`` returned over an interval of steady training.
        workers: the builders that made the batches; default the figures' ``builders`` (the
            thread backend's producers, the worker processes, the Ray backend's actors).
    """
    if not figures.get("batches"):
        return "no batches: none delivered yet"
    workers = max(1, int(workers if workers is not None else figures.get("builders", 1)))  # (0: the loop's thread)
    wait = float(figures.get("wait_fraction", 0.0))
    if wait < KEEPS_UP:
        return f"data keeps up: the loop waits for it {100 * wait:.0f}% of its time"
    stages = {s: float(figures[f"{s}_ms_per_batch"]) for s in STAGES if f"{s}_ms_per_batch" in figures}
    step = float(figures.get("compute_ms_per_batch", 0.0))
    gpu = float(figures.get("gpu_decode_ms_per_batch", 0.0))
    if gpu > 0.5 * float(figures.get("wait_ms_per_batch", 0.0)):  # the loop's own decode is its wait
        return (
            f"gpu decode is the bottleneck: GPUDecode takes {gpu:.1f} ms of the training process per batch (the "
            f"step {step:.1f} ms): on a GPU its decode queues and overlaps the step, so this is the CPU fallback "
            "(no CUDA device) or a small GPU; without a GPU, decode in the workers (ImageReader(output='tensor'))"
        )
    if not stages:
        return (
            f"no stage figures: the loop waits for data {100 * wait:.0f}% of its time, and its builders (a live "
            "source's, or the Ray backend's, which build elsewhere) do not time their stages: add builders "
            "(num_workers=, actors=, decode nodes)"
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
    return (
        f"hand-over: the loop waits for data {100 * wait:.0f}% of its time though {workers} builder(s) could make "
        f"a batch every {built_ms / workers:.1f} ms (the step takes {step:.1f} ms): the time goes in handing "
        "batches over (smaller batches: uint8 images, GPUDecode) or in too little prefetch (prefetch_factor=, "
        "in_flight=)"
    )


def at_step(figures: Mapping[str, float], step_ms: float, loading_ms: float) -> dict[str, float]:
    """The figures of a loop whose step takes ``step_ms``, from a benchmark that only loaded (a
    batch every ``loading_ms``): it would wait what loading takes beyond the step.

    >>> at_step({"batches": 10}, step_ms=5.0, loading_ms=7.5)["wait_fraction"]
    0.3333333333333333
    """
    wait = max(0.0, loading_ms - step_ms)
    return {
        **figures,
        "compute_ms_per_batch": step_ms,
        "wait_ms_per_batch": wait,
        "wait_fraction": wait / (wait + step_ms),
    }
