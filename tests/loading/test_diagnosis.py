"""What holds a loop up (mmloader/loading/diagnosis.py), from stats figures: the stage to work
on when the builders cannot keep up, the hand-over when they could, nothing when data keeps up."""

from __future__ import annotations

import pytest

from mmloader.loading.diagnosis import REMEDIES, advice


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
    assert said.startswith(
        "the loop waits for data 40% of its time though 4 builder(s) could make a batch every 3.5 ms"
    )
    assert "handing batches over" in said


def test_data_that_keeps_up_no_batches_and_no_stage_figures_are_said_so():
    assert advice(_figures(wait=0.01, decode=500.0), workers=1) == "data keeps up: the loop waits for it 1% of its time"
    assert advice(_figures(batches=0), workers=1) == "no batches delivered yet"
    ray = {"batches": 10, "wait_fraction": 0.3, "compute_ms_per_batch": 5.0}
    assert "do not report their stages" in advice(ray, workers=8)


def test_a_benchmark_gives_the_step_it_would_train_at():
    f = _figures(wait=1.0, step=0.0, decode=30.0)  # a benchmark's loop: no compute, waits all the time
    assert advice(f, workers=4, step_ms=100.0).startswith("data keeps up: 4 builder(s) make a batch every 8.0 ms")
    assert advice(f, workers=1, step_ms=10.0).startswith("decode is the bottleneck")
