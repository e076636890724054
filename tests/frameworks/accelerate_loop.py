"""accelerate under torchrun (2 processes): prepare() keeps mmloader's sharding; save_state/load_state
carry the loader's position.

    torchrun --nproc_per_node 2 accelerate_loop.py DATA OUT --backend thread|process
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from common import record, stream

import mmloader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--backend", default="auto")
    a = p.parse_args()
    acc = Accelerator(cpu=True)
    loader = mmloader.loader(stream(a.data), backend=a.backend, num_workers=2)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, prepared = acc.prepare(model, optimizer, loader)
    acc.register_for_checkpointing(prepared)
    rank = acc.process_index
    info = {"prepared_type": type(prepared).__name__, "same_object": prepared is loader, "len": len(prepared)}
    for epoch in range(2):
        for step, batch in enumerate(prepared):
            record(a.out, rank, run="train", epoch=epoch, step=step, keys=list(batch["__key__"]))
            loss = model(torch.ones(len(batch["__key__"]), 1)).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 1 and step == 1:
                acc.save_state(str(Path(a.out) / "state"))
    # Restored from the state saved after step 1 of epoch 1: the rest of epoch 1.
    acc.load_state(str(Path(a.out) / "state"))
    for step, batch in enumerate(prepared):
        record(a.out, rank, run="resumed", epoch=prepared.epoch, step=step, keys=list(batch["__key__"]))
    Path(a.out, f"info-rank{rank}.json").write_text(json.dumps(info))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
