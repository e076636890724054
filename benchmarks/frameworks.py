"""How long a Lightning step waits for data: mmloader's loader in a real Trainer (2 CPU DDP ranks).

Writes N photographic 256-px JPEGs + captions to LMDB, trains a small conv net on 224-px decoded
images with ``Trainer(strategy="ddp", devices=2)`` and ``DataWaitCallback``, and prints each
rank's wait and compute per batch, the fraction of the loop spent waiting and samples/s, for the
default loader (``backend="auto"``). A step that waits more than a sliver is data-bound.

    python benchmarks/frameworks.py --samples 2000 --epochs 2 --workers 1 --width 32
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _dataset(root: Path, n: int) -> Path:
    import io

    from data import caption, photo

    import mmloader

    path = root / "photos.lmdb"
    if not path.exists():
        with mmloader.LMDBWriter(path) as w:
            for i in range(n):
                buf = io.BytesIO()
                photo(i).save(buf, "JPEG", quality=90)
                w.write({"__key__": f"{i:06d}", "jpg": buf.getvalue(), "txt": caption(i)})
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1, help="loader workers per rank")
    p.add_argument("--width", type=int, default=32, help="conv channels: the model's cost per batch")
    p.add_argument("--root", help="where the dataset goes (default: a temporary folder)")
    a = p.parse_args()
    import lightning.pytorch as pl
    import torch

    import mmloader
    from mmloader.frameworks.lightning import DataModule, DataWaitCallback

    root = Path(a.root or tempfile.mkdtemp(prefix="mmloader-fw-"))
    path = _dataset(root, a.samples)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Conv2d(3, a.width, 5, stride=4),
                torch.nn.ReLU(),
                torch.nn.Conv2d(a.width, a.width, 3, stride=2),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(a.width, 1),
            )

        def training_step(self, batch, batch_idx):
            return self.net(batch["image"].float().div(255)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def stream():
        ds = mmloader.zip(
            image=mmloader.ImageReader(str(path), size=(224, 224)), caption=mmloader.TextReader(str(path))
        )
        return mmloader.Stream(ds, batch_size=a.batch_size, seed=0)

    wait = DataWaitCallback(every_n_steps=10**9)  # only the whole-run figures below
    data = DataModule(stream, num_workers=a.workers)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=a.epochs,
        logger=False,
        callbacks=[wait],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), data)
    figures = data.train_dataloader().stats()
    line = {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}
    print(f"rank {trainer.global_rank}: {json.dumps(line)}", flush=True)


if __name__ == "__main__":
    main()
