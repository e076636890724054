"""Every rank's loader agrees, before each batch, whether all of them have one.

A rank whose live source ended or stalled must not leave the others waiting in their next
collective (a DDP hang): before a batch is handed to training, the ranks take the minimum of
their codes, so they deliver it, end the pass, or raise, all together. The reduction runs on
a process group of its own (gloo, made once per loader group), so it can never pair with a
collective of the training step on a rank that left its loop at another step.
"""

from __future__ import annotations

from typing import Any

import torch

#: Codes, ordered so that the minimum is what every rank must do.
FAILED, ENDED, READY = -1, 0, 1

_GROUPS: dict[Any, Any] = {}  # the loader's group (None: the world) -> the agreement's own group


def agreement_group(group: Any) -> Any:
    """A gloo group of the same ranks as ``group`` (None: the default world), made once, at a
    live stream's first pass: by every rank of the world for the world, by the group's own
    ranks for a group (a mesh's ``dp`` dimension: each data-parallel group makes its own)."""
    import torch.distributed as dist

    if group not in _GROUPS:
        if group is None:
            _GROUPS[group] = dist.new_group(backend="gloo")
        else:
            ranks = dist.get_process_group_ranks(group)
            _GROUPS[group] = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
    return _GROUPS[group]


def agree(code: int, group: Any, world: int, rank: int = 0) -> tuple[int, int]:
    """``(code, rank)``: the minimum code over the ranks of ``group`` and the first rank that
    gave it (one ``all_reduce`` of one integer; ``(code, rank)`` itself on one rank).

    Args:
        code: :data:`READY`, :data:`ENDED` or :data:`FAILED` for this rank.
        group: the agreement's process group (see :func:`agreement_group`).
        world: the ranks in it.
        rank: this rank's place in it.
    """
    if world <= 1:
        return code, rank
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"a live stream on {world} ranks needs torch.distributed initialised "
            "(dist.init_process_group): its ranks agree before each batch that all of them have one"
        )
    flag = torch.tensor([code * world + rank], dtype=torch.int64)  # the minimum also says who
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    value = int(flag.item())
    return value // world, value % world
