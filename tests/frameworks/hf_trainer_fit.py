"""transformers.Trainer under torchrun (2 processes) with mmloader.frameworks.hf_trainer.use_loader.

torchrun --nproc_per_node 2 hf_trainer_fit.py DATA OUT [--preempt-after N] [--resume]
"""

from __future__ import annotations

import argparse
import os

import torch
from common import record, stream
from transformers import Trainer, TrainerCallback, TrainingArguments

import mmloader
from mmloader.frameworks.hf_trainer import use_loader


class Tiny(torch.nn.Module):
    def __init__(self, out: str):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out = out
        self.loader = None

    def forward(self, caption, __key__, **_):
        rank = int(os.environ.get("RANK", 0))
        record(self.out, rank, epoch=self.loader.epoch, keys=list(__key__))
        return {"loss": self.layer(torch.ones(len(__key__), 1)).pow(2).mean()}


class Preempt(TrainerCallback):
    """Exit right after the checkpoint of step N is written, as a preempted job would."""

    def __init__(self, after: int):
        self.after = after

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.after:
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--preempt-after", type=int)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    args = TrainingArguments(
        output_dir=os.path.join(a.out, "run"),
        num_train_epochs=2,
        per_device_train_batch_size=8,
        save_strategy="steps",
        save_steps=4,
        logging_steps=100,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    model = Tiny(a.out)
    trainer = Trainer(model=model, args=args)
    model.loader = mmloader.loader(stream(a.data), num_workers=2)
    use_loader(trainer, model.loader)
    if a.preempt_after:
        trainer.add_callback(Preempt(a.preempt_after))
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    # Leave together: a rank whose peer already closed its gloo sockets can abort at exit.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
