"""The LightningModule and the preempting callback lightning_fit.py trains with.

Apart from the script so that processes which only read data (DataLoader workers spawned under
``ddp_spawn``, which import the script as ``__mp_main__``) do not import Lightning: measured
with ``-X importtime``, the ddp_spawn test imported it 15 times before, once after.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from common import record, stream

import mmloader


class Model(pl.LightningModule):
    def __init__(self, out: str, data: str | None = None, backend: str = "auto"):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out, self.data, self.backend = out, data, backend
        self.loader = None

    def train_dataloader(self):  # used when no DataModule is given
        if self.loader is None:
            self.loader = mmloader.loader(stream(self.data), backend=self.backend, num_workers=2)
        return self.loader

    def training_step(self, batch, batch_idx):
        keys = list(batch["__key__"])
        record(self.out, self.global_rank, epoch=self.current_epoch, step=self.global_step, keys=keys)
        return self.layer(torch.ones(len(keys), 1)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Preempt(pl.Callback):
    """Save a checkpoint after step N and exit at once, as a preempted job would."""

    def __init__(self, after: int, path: str):
        self.after, self.path = after, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.after:
            trainer.save_checkpoint(self.path)
            os._exit(0)
