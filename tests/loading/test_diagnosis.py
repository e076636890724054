"""What holds a loop up (mmloader/loading/diagnosis.py), from stats figures: the stage to work
on when the builders cannot keep up, the hand-over when they could, nothing when data keeps up."""

from __future__ import annotations

import pytest

from mmloader.loading.diagnosis import REMEDIES, advice, at_step


def _figures(wait=0.5, step=10.0, read=1.0, decode=1.0, collate=1.0, batches=50) -> dict:
    return {
        "batches": batches,
        "wait_fraction": wait,
        "compute_ms_per_batch": step,
        "read_ms_per_batch": read,
        "decode_ms_per_batch": decode,
        "collate_ms_per_batch": collate,
    }


@pytest.mark.parametrize("slow", ["read", "decode", "collate"])
def test_the_slowest_stage_is_named_with_its_remedy_and_the_builders_it_would_take(slow):
    said = advice(_figures(**{slow: 40.0}), workers=2)
    assert said.startswith(f"{slow} is the bottleneck: 40.0 of the 42.0 ms a builder spends per batch")
    assert "2 builder(s) make a batch every 21.0 ms, the step takes 10.0 ms (about 5 builders would keep up)" in said
    assert said.endswith(REMEDIES[slow])


def test_builders_fast_enough_while_the_loop_waits_point_at_the_hand_over():
    said = advice(_figures(wait=0.4, step=10.0, decode=12.0), workers=4)  # 14 ms / 4 builders < 10 ms
    assert said.startswith("hand-over: the loop waits for data 40% of its time though 4 builder(s) could make")
    assert "a batch every 3.5 ms" in said and "handing batches over" in said


def test_data_that_keeps_up_no_batches_and_no_stage_figures_are_said_so():
    assert advice(_figures(wait=0.01, decode=500.0), workers=1) == "data keeps up: the loop waits for it 1% of its time"
    assert advice(_figures(batches=0), workers=1) == "no batches: none delivered yet"
    ray = {"batches": 10, "wait_fraction": 0.3, "compute_ms_per_batch": 5.0, "builders": 8}
    assert advice(ray).startswith("no stage figures: the loop waits for data 30% of its time")


def test_a_loop_whose_wait_is_gpudecodes_own_decode_is_told_so():
    said = advice({**_figures(wait=0.9, step=1.0), "wait_ms_per_batch": 12.0, "gpu_decode_ms_per_batch": 11.0})
    assert said.startswith("gpu decode is the bottleneck: GPUDecode takes 11.0 ms of the training process")


def test_the_builders_default_to_the_figures_own():
    """The thread backend's one producer (Python work holds the GIL), not num_workers."""
    said = advice({**_figures(decode=15.0), "builders": 1})
    assert said.startswith("decode is the bottleneck") and "1 builder(s) make a batch every 17.0 ms" in said


def test_a_benchmark_is_judged_at_the_step_it_would_train_at():
    f = _figures(wait=1.0, step=0.0, decode=30.0)  # a benchmark's loop: no compute, waits all the time
    assert advice(at_step(f, step_ms=100.0, loading_ms=9.0), workers=4).startswith("data keeps up: ")
    assert advice(at_step(f, step_ms=10.0, loading_ms=32.0), workers=1).startswith("decode is the bottleneck")
    # builders that could keep up while the measured loading could not: the hand-over, not a contradiction
    assert advice(at_step(f, step_ms=10.0, loading_ms=16.0), workers=4).startswith("hand-over: ")
