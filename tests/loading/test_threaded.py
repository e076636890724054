"""The thread backend's producers (mmloader/loading/threaded.py): batches in plan order, and a
batch that fails ends the pass without building later ones."""

from __future__ import annotations

import time

import pytest

from mmloader.loading.threaded import _Run


def test_batches_come_in_order_whichever_producer_builds_them():
    def task(j):
        def build():
            time.sleep(0.002 * ((7 * j) % 5))  # producers finish out of order
            return j

        return build

    run = _Run(iter([task(j) for j in range(40)]), producers=3, ahead=6, pin=False)
    assert list(run.batches(_release=lambda: None)) == list(range(40))


def test_a_failed_batch_ends_the_pass_and_no_later_batch_is_built():
    """A batch that raises (a server gone past its retry deadline) is raised in order, and the
    producers claim nothing after it: each later batch would first wait out the same failure,
    and the consumer waits for the batches under way before it raises (a 2 s deadline took
    4 s, and 21 s on a loaded machine, when the producer that failed went on to the next)."""
    started: list[int] = []

    def task(j):
        def build():
            started.append(j)
            if j == 0:
                time.sleep(0.05)  # the other producer has claimed batch 1 meanwhile
                raise ConnectionError("server gone")
            time.sleep(0.3)
            return j

        return build

    run = _Run(iter([task(j) for j in range(50)]), producers=2, ahead=10, pin=False)
    with pytest.raises(ConnectionError, match="server gone"):
        next(run.batches(_release=lambda: None))
    assert sorted(started) == [0, 1], f"batches started after the failure: {sorted(started)}"
