"""Where a batch's time goes in the thread that builds it: reading stored bytes, then decoding
(with its transforms), then collating. The counters are per thread, so builders running side by
side (the thread backend) do not mix; the stream adds each batch's share to counters its
loader reads (:meth:`mmloader.loading.control.SharedControl.add_stage_times`).

>>> with timed("read"):
...     pass
>>> spent("read") >= 0.0
True
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

STAGES = ("read", "decode", "collate")  # decode: what building a batch took besides the others
_local = threading.local()


def spent(stage: str) -> float:
    """Seconds this thread spent in ``stage`` so far."""
    return getattr(_local, stage, 0.0)


@contextmanager
def timed(stage: str) -> Iterator[None]:
    """Count the time of the block as ``stage`` in this thread."""
    started = time.perf_counter()
    try:
        yield
    finally:
        setattr(_local, stage, spent(stage) + time.perf_counter() - started)
