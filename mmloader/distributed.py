"""Where this process sits: rank, world size, local world size and usable CPUs."""
from __future__ import annotations

import os


def rank_and_world() -> tuple[int, int]:
    """``torch.distributed`` when initialised, else torchrun's ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
