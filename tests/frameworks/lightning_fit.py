"""Lightning Trainer (2 CPU DDP processes) over mmloader.frameworks.lightning.DataModule.

    python lightning_fit.py DATA OUT [--strategy ddp|ddp_spawn] [--preempt-after N]
                                     [--resume CKPT] [--limit-train-batches N] [--datamodule]

Without --datamodule the LightningModule's train_dataloader() returns mmloader.loader(...),
as a user would write it with no integration at all.
"""

from __future__ import annotations

import argparse
import functools
import json
import warnings
from pathlib import Path

from common import stream


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--backend", default="auto")
    p.add_argument("--preempt-after", type=int)
    p.add_argument("--resume")
    p.add_argument("--limit-train-batches", type=int)
    p.add_argument("--datamodule", action="store_true")
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    a = p.parse_args()
    # Lightning is imported here, not at the top: see lightning_parts.py
    import lightning.pytorch as pl
    from lightning_parts import Model, Preempt

    from mmloader.frameworks.lightning import DataModule, DataWaitCallback

    wait = DataWaitCallback(every_n_steps=2)
    callbacks = [wait] + ([Preempt(a.preempt_after, str(Path(a.out) / "preempt.ckpt"))] if a.preempt_after else [])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=a.devices,
        strategy=a.strategy if a.devices > 1 else "auto",
        max_epochs=a.max_epochs,
        limit_train_batches=a.limit_train_batches,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:  # mmloader's warnings, for the tests to read
        warnings.simplefilter("always")
        if a.datamodule:
            dm = DataModule(functools.partial(stream, a.data), backend=a.backend, num_workers=2)
            trainer.fit(Model(a.out), dm, ckpt_path=a.resume)
            loader = dm.train_dataloader()
        else:
            model = Model(a.out, a.data, a.backend)
            trainer.fit(model, ckpt_path=a.resume)
            loader = model.loader
    ours = [str(w.message) for w in caught if "mmloader" in w.filename]
    Path(a.out, f"warnings-rank{trainer.global_rank}.json").write_text(json.dumps(ours))
    stats = loader.stats()
    Path(a.out, f"stats-rank{trainer.global_rank}.json").write_text(json.dumps({**stats, "logged": wait.last}))


if __name__ == "__main__":
    main()
