"""mmloader inside transformers.Trainer under torchrun: a preemption resumed at the next unseen
batch, resumes onto another world size, a resume the Trainer would count as another epoch
(tests of mmloader/frameworks/hf_trainer.py)."""

from __future__ import annotations

import json

import pytest
from runs import (
    PER_RANK,
    assert_each_epoch_exactly_once,
    copy_run,
    data,  # noqa: F401 (a fixture)
    per_epoch,
    run_script,
    seen,
    seen_all,
)


@pytest.fixture(scope="module")
def hf_preempted(data, tmp_path_factory):
    """transformers.Trainer checkpoints at step 4 of epoch 0, saved on 2 ranks and on 1."""
    pytest.importorskip("transformers")
    runs = {}
    for world in (2, 1):
        out = tmp_path_factory.mktemp(f"hf-preempted-{world}")
        run_script("hf_trainer_fit.py", str(data), str(out), "--preempt-after", "4", nproc=world)
        runs[world] = out
    return runs


def test_hf_trainer_resumes_at_the_next_unseen_batch(data, hf_preempted, tmp_path):
    out = copy_run(hf_preempted[2], tmp_path / "run")  # preempted after step 4 on 2 ranks
    assert [len(r) for r in seen(out)] == [4, 4]
    state = json.loads((out / "run" / "checkpoint-4" / "mmloader-loader-rank1.json").read_text())
    assert (state["epoch"], state["steps"]) == (0, 4)
    run_script("hf_trainer_fit.py", str(data), str(out), "--resume", nproc=2)
    rows = seen(out)
    assert [len(r) for r in rows] == [2 * PER_RANK] * 2
    assert_each_epoch_exactly_once(per_epoch(rows), [0, 1])


@pytest.mark.parametrize("saved, resumed", [(2, 1), (1, 2)])
def test_hf_trainer_resumed_onto_another_world_trains_every_epoch_exactly_once(
    data, hf_preempted, tmp_path, saved, resumed
):
    out = copy_run(hf_preempted[saved], tmp_path / "run")
    assert sum(len(r) for r in seen_all(out)) == 4 * saved
    run_script("hf_trainer_fit.py", str(data), str(out), "--resume", nproc=resumed)
    assert_each_epoch_exactly_once(per_epoch(seen_all(out)), [0, 1])


def test_hf_trainer_refuses_a_resume_it_would_count_as_another_epoch(data, tmp_path):
    """The Trainer numbers epochs by global_step // steps per epoch of the new world: past the
    first epoch another world size would train the wrong epoch, so it is refused, by name; a
    state taken at an epoch's end resumes (the Trainer finishes that epoch with an empty pass)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from common import stream

    import mmloader
    from mmloader.errors import ResumeError
    from mmloader.frameworks.hf_trainer import _make_room_for_the_resumed_epoch

    def state_after(world: int, passes: int, limit: int | None) -> dict:
        s = stream(data)
        s.set_world(0, world)
        loader = mmloader.loader(s, num_workers=0)
        for _ in range(passes):
            list(loader)
        if limit:
            for _, _batch in zip(range(limit), loader):
                pass
        return loader.state_dict()

    def resumed(world: int, state: dict):
        s = stream(data)
        s.set_world(0, world)
        loader = mmloader.loader(s, num_workers=0)
        loader.load_state_dict(state)
        return loader

    args = SimpleNamespace(max_steps=-1, gradient_accumulation_steps=1, num_train_epochs=2)
    saved = state_after(1, 1, 4)  # epoch 1, step 4 of 12: global step 16
    with pytest.raises(ResumeError, match="resumes at global step 16 as epoch 2"):
        _make_room_for_the_resumed_epoch(resumed(2, saved), args, SimpleNamespace(global_step=16, max_steps=12))
    at_end = state_after(2, 1, None)  # epoch 0's last step on 2 ranks: global step 6
    budget = SimpleNamespace(global_step=PER_RANK, max_steps=4 * PER_RANK)
    _make_room_for_the_resumed_epoch(resumed(1, at_end), args, budget)
    assert budget.max_steps == 4 * PER_RANK
