"""A data-parallel x tensor-parallel run on a DeviceMesh (gloo, CPU): the tp peers of one dp rank
get the same batches, the dp ranks split the data, every sample once per epoch.

    torchrun --standalone --nproc_per_node 4 samples/train_mesh.py --data demo-out/shapes --tp 2
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import mmloader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a dataset with a txt field (e.g. demo-out/shapes)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (the rest is data-parallel)")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
    ds = mmloader.zip(caption=mmloader.TextReader(a.data))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=8, seed=0, group=mesh["dp"]))
    keys = []
    for _epoch in range(a.epochs):  # no set_epoch needed: each pass is the next epoch
        for batch in loader:
            keys.append(tuple(batch["__key__"]))  # a tp group would shard the model over these
    # Check what the mesh promises: tp peers saw the same batches, dp ranks split the data.
    gathered = [None] * world
    dist.all_gather_object(gathered, keys)
    if dist.get_rank() == 0:
        tp_same = all(gathered[r] == gathered[r - r % a.tp] for r in range(world))
        per_epoch = len(gathered[0]) // a.epochs  # batches per rank and epoch
        first_epoch = [k for r in range(0, world, a.tp) for b in gathered[r][:per_epoch] for k in b]
        print(
            f"tp peers identical: {tp_same}; epoch 0 over the dp ranks: {len(first_epoch)} samples, "
            f"{len(set(first_epoch))} distinct (dataset: {len(ds)})"
        )
        assert tp_same
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
