"""Dealing a training step's batches to the replica groups of a fault-tolerant quorum (torchft):
pure arithmetic over the epoch's visit order.

An epoch is committed step by step. A step starts at ``base``, the visit positions committed
before it, and is dealt to the quorum it runs in: ``participants`` replica groups of
``group_world`` ranks, each rank a batch of ``batch_size``. Rank ``group_rank`` of participant
``participant`` takes the slot ``participant * group_world + group_rank``: the positions
``base + slot * batch_size`` onwards. If the step commits, ``base`` moves past the whole step
(:func:`step_width`); if it fails, the next quorum, whatever its size, is dealt the same positions
again. So every position of the epoch lands in exactly one committed step, and every rank of a
step gets a batch of the same size: at the epoch's end, rows past its last position repeat
positions from its start, flagged not valid.

>>> [p.tolist() for p in deal(base=8, total=20, participants=2, participant=1, group_world=1, group_rank=0, batch_size=4)]
[[12, 13, 14, 15], [True, True, True, True]]
>>> step_width(2, 1, 4)
8
>>> [p.tolist() for p in deal(16, 20, 2, 1, 1, 0, 4)]  # the last step: 4 positions left for 8 rows
[[0, 1, 2, 3], [False, False, False, False]]
"""

from __future__ import annotations

import numpy as np


def step_width(participants: int, group_world: int, batch_size: int) -> int:
    """Positions one step deals: a batch for every rank of every participating group."""
    return participants * group_world * batch_size


def deal(
    base: int,
    total: int,
    participants: int,
    participant: int | None,
    group_world: int,
    group_rank: int,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(visit positions, valid) of one rank's batch in a step starting at ``base`` of ``total``.

    Args:
        base: visit positions committed before this step.
        total: the epoch's visit positions.
        participants: replica groups participating in the step's quorum.
        participant: this group's rank among them; None for a group that does not participate
            (healing): its rows are all flagged not valid.
        group_world: ranks in a replica group.
        group_rank: this rank in its group.
        batch_size: rows per rank.

    Rows past ``total`` (the epoch's last step) repeat positions from the epoch's start and are
    not valid; so are all rows of a group that does not participate.

    >>> [p.tolist() for p in deal(0, 10, 1, None, 1, 0, 3)]
    [[0, 1, 2], [False, False, False]]
    """
    if total <= 0:
        raise ValueError("an epoch without samples has nothing to deal")
    if not 0 <= group_rank < group_world:
        raise ValueError(f"group_rank={group_rank} outside a group of {group_world}")
    rows = np.arange(batch_size, dtype=np.int64)
    if participant is None:
        return (base + rows) % total, np.zeros(batch_size, dtype=bool)
    if not 0 <= participant < participants:
        raise ValueError(f"participant {participant} outside a quorum of {participants}")
    offsets = base + (participant * group_world + group_rank) * batch_size + rows
    valid = offsets < total
    return np.where(valid, offsets, offsets % total), valid
