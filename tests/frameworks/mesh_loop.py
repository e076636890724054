"""A 2x2 (dp x tp) DeviceMesh on gloo under torchrun (4 processes): Stream(group=mesh["dp"]).

torchrun --nproc_per_node 4 mesh_loop.py DATA OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.distributed as dist
from common import record, stream
from torch.distributed.device_mesh import init_device_mesh

import mmloader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    a = p.parse_args()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    info = {"dp": mesh["dp"].get_local_rank(), "tp": mesh["tp"].get_local_rank()}
    try:
        stream(a.data, group=mesh)
    except ValueError as e:
        info["two_d_error"] = str(e)
    for backend, group in (("thread", mesh["dp"]), ("process", mesh["dp"].get_group())):
        loader = mmloader.loader(stream(a.data, group=group), backend=backend, num_workers=2)
        for epoch in range(2):  # no set_epoch: each pass is the next epoch
            for batch in loader:
                record(a.out, rank, backend=backend, epoch=loader.epoch, keys=list(batch["__key__"]))
    Path(a.out, f"info-rank{rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
