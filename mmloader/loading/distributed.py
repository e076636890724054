"""Where this process sits: rank, world size, local world size and usable CPUs."""

from __future__ import annotations

import os
from typing import Any


def data_parallel_group(group: Any) -> Any:
    """The ``torch.distributed`` process group that ``group`` names: a ProcessGroup as is, or the
    group of a 1-D ``DeviceMesh`` (e.g. ``mesh["dp"]``). None stays None (the default world).

    Args:
        group: a ProcessGroup, a 1-D DeviceMesh, or None.

    Raises:
        ValueError: a mesh of more than one dimension (which dimension splits the data is
            the caller's choice: pass ``mesh["dp"]``).
    """
    if group is None:
        return None
    ndim = getattr(group, "ndim", None)
    if ndim is not None and hasattr(group, "get_group"):  # a DeviceMesh
        if ndim != 1:
            names = getattr(group, "mesh_dim_names", None)
            raise ValueError(
                f"group= takes a 1-D DeviceMesh (its data-parallel dimension, e.g. mesh['dp']); "
                f"got a {ndim}-D mesh with dimensions {names}"
            )
        return group.get_group()
    return group


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """(rank, world) of this process in ``group`` (a ProcessGroup; None: the default world).

    Without a group: ``torch.distributed`` when initialised, else torchrun's
    ``RANK``/``WORLD_SIZE``, else (0, 1).
    """
    import torch.distributed as dist

    if group is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "Stream(group=...) needs torch.distributed initialised first "
                "(dist.init_process_group or init_device_mesh)"
            )
        return dist.get_rank(group), dist.get_world_size(group)
    try:
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
