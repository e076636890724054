"""Every rank's loader agrees, before each batch, whether all of them have one.

A rank whose live source ended or stalled must not leave the others waiting in their next
collective (a DDP hang): before a batch is handed to training, the ranks of the loader's
process group take the minimum of their codes, so they deliver it, end the pass, or raise,
all together.
"""

from __future__ import annotations

from typing import Any

import torch

#: Codes, ordered so that the minimum is what every rank must do.
FAILED, ENDED, READY = -1, 0, 1


def agree(code: int, group: Any, world: int) -> int:
    """The minimum of ``code`` over the ranks of ``group`` (one ``all_reduce`` of one integer;
    ``code`` itself on one rank).

    Args:
        code: :data:`READY`, :data:`ENDED` or :data:`FAILED` for this rank.
        group: the loader's process group (None: the default one).
        world: the ranks in it.
    """
    if world <= 1:
        return code
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"a live stream on {world} ranks needs torch.distributed initialised "
            "(dist.init_process_group): its ranks agree before each batch that all of them have one"
        )
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":  # NCCL reduces device tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([code], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return int(flag.item())
