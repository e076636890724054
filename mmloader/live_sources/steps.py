"""Which steps of a live pass are live batches, and how many stored batches a run of steps holds,
for a live share of a mix (``batch_composition="source"``: whole batches alternate). Apart from
:mod:`.stream` as plain arithmetic over step numbers, shared by its lengths, states and builders."""

from __future__ import annotations

import sys
from typing import Iterator

import numpy as np


def is_live_step(step: int, share: float) -> bool:
    """Whether step ``step`` of an epoch is a live batch (``batch_composition="source"``)."""
    return int(np.floor((step + 1) * share)) > int(np.floor(step * share))


def stored_steps(steps: int, share: float, composition: str) -> int:
    """Stored batches among an epoch's first ``steps`` steps."""
    if composition == "sample":
        return steps
    return steps - int(np.floor(steps * share))


def steps_holding(left: int, before: int, share: float) -> int:
    """The fewest steps after ``before`` that hold ``left`` stored batches (``batch_composition="source"``)."""
    done = stored_steps(before, share, "source")
    lo, hi = 0, int((left + 1) / (1 - share)) + 2
    while lo < hi:
        mid = (lo + hi) // 2
        if stored_steps(before + mid, share, "source") - done >= left:
            hi = mid
        else:
            lo = mid + 1
    return lo


def stored_by_step(
    plans: Iterator[tuple], worker: int, workers: int, before: int, share: float
) -> Iterator[tuple | None]:
    """The stored part of each stored step of reader ``worker`` of ``workers`` after ``before``
    (``batch_composition="source"``), in order, taken from ``plans``: the stored part's batches
    of the pass, in order."""
    done = stored_steps(before, share, "source")
    k = 0  # stored batches of this pass taken from `plans` so far
    for j in range(worker, sys.maxsize, workers):
        if is_live_step(before + j, share):
            continue
        want = stored_steps(before + j + 1, share, "source") - done - 1  # step j holds stored batch `want` of the pass
        part = None
        while k <= want:
            part = next(plans, None)
            if part is None:
                return
            k += 1
        yield part
