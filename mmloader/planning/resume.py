"""Resume state: where a rank is in an epoch, as plain data, and what is left of the epoch.

A state records the epoch, the plan ranges of the pass and how many samples each
rank has delivered; resuming is then arithmetic (:func:`remaining_ranges`): the
same world size gets exactly the batches an uninterrupted run would have
delivered, another world size every unseen sample once.
"""

from __future__ import annotations

from ..errors import ResumeError
from .partition import remaining_ranges

STATE_VERSION = 1


def progress_state(
    *,
    seed: int,
    epoch: int,
    world: int,
    plan_len: int,
    ranges: list,
    samples_per_rank: int,
    consumed: int,
    batch_size: int | None,
    drop_last: bool,
    steps: int | None = None,
) -> dict:
    """The state after every rank delivered ``consumed`` of its ``samples_per_rank`` samples.

    ``steps``: batches (samples unbatched) each rank has delivered of this epoch in all,
    counting passes before a resume (default: those of ``consumed``): what a framework
    restored from the same checkpoint counts as the epoch's steps done.

    >>> progress_state(seed=0, epoch=2, world=1, plan_len=8, ranges=[[0, 8]], samples_per_rank=8,
    ...                consumed=4, batch_size=4, drop_last=False)["consumed"]
    4
    """
    return {
        "version": STATE_VERSION,
        "seed": int(seed),
        "epoch": int(epoch),
        "world": int(world),
        "plan_len": int(plan_len),
        "ranges": [list(map(int, r)) for r in ranges],
        "samples_per_rank": int(samples_per_rank),
        "consumed": min(int(consumed), int(samples_per_rank)),
        "batch_size": batch_size,
        "drop_last": bool(drop_last),
        "steps": int(consumed) // (batch_size or 1) if steps is None else int(steps),
    }


def resume_ranges(state: dict, *, seed: int, plan_len: int, world: int) -> list[tuple[int, int]]:
    """The plan ranges still to visit after ``state``, for a world of ``world`` ranks.

    >>> s = progress_state(seed=0, epoch=0, world=2, plan_len=10, ranges=[[0, 10]], samples_per_rank=5,
    ...                    consumed=2, batch_size=2, drop_last=False)
    >>> resume_ranges(s, seed=0, plan_len=10, world=2)
    [(2, 5), (7, 10)]
    """
    if state.get("version") != STATE_VERSION:
        raise ResumeError(f"unknown stream state version {state.get('version')!r}")
    if state["seed"] != seed:
        raise ResumeError(f"state was saved with seed {state['seed']}, this stream has seed {seed}")
    if plan_len != state["plan_len"]:
        raise ResumeError(
            f"the dataset changed since the state was saved: the epoch plan has {plan_len} "
            f"positions, the state {state['plan_len']}"
        )
    return remaining_ranges(
        state["ranges"],
        state["world"],
        state["samples_per_rank"],
        state["consumed"],
        keep_padding=world == state["world"],
    )
