"""A tiny CLIP-style image-text model trained with DDP on data streamed by mmloader.

    torchrun --standalone --nproc_per_node 2 samples/train_clip_ddp.py --data demo-out/shapes.lmdb

Images come from one modality reader, captions from another (optionally another
store: ``--captions``), zipped by key, streamed with equal batches per rank.
Checkpoints hold the loader's state: ``--stop-after N`` simulates a preemption
after N steps and ``--resume`` continues mid-epoch at the next unseen batch.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import mmloader

WORDS = ("a on background small large circle square triangle red green blue yellow purple white black orange").split()


class Tokenizer:
    """Whitespace tokens -> ids (runs in the DataLoader workers; lengths vary, collate pads)."""

    def __init__(self):
        self.vocab = {w: i + 1 for i, w in enumerate(WORDS)}  # 0 = padding / unknown

    def __call__(self, text: str) -> torch.Tensor:
        return torch.tensor([self.vocab.get(w, 0) for w in text.lower().split()], dtype=torch.long)


class TinyCLIP(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 2, 1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, dim),
        )
        self.words = nn.Embedding(len(WORDS) + 1, dim, padding_idx=0)
        self.pos = nn.Embedding(16, dim)
        self.text = nn.Sequential(nn.ReLU(), nn.Linear(dim, dim))
        self.scale = nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, images, tokens, mask):
        img = F.normalize(self.image(images), dim=-1)
        pos = self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        emb = (self.words(tokens) + pos) * mask.unsqueeze(-1)
        txt = F.normalize(self.text(emb.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)), dim=-1)
        return self.scale.exp() * img @ txt.t()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="LMDB dataset or shard directory with jpg (+ txt)")
    p.add_argument("--captions", help="another store holding the txt field (default: --data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="where to save/resume training state")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stop-after", type=int, default=None, help="stop after N steps (simulate preemption)")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    torch.manual_seed(args.seed)

    dataset = mmloader.zip(
        image=mmloader.ImageReader(args.data, "jpg", transform=lambda t: t.float().div_(255)),
        caption=mmloader.TextReader(args.captions or args.data, "txt", transform=Tokenizer()),
    )
    stream = mmloader.Stream(
        dataset,
        seed=args.seed,
        batching=mmloader.Batching(args.batch_size, collate_fn=mmloader.Collate(masks=["caption"])),
    )
    loader = mmloader.loader(stream, num_workers=args.workers)
    model = TinyCLIP().to(device)
    ddp = DDP(model) if distributed else model
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start_epoch, step = 0, 0
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        # weights_only=True: the checkpoint is ours, but never unpickle more than tensors.
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        loader.load_state_dict(ckpt["loader"])
        start_epoch, step = loader.epoch, ckpt["step"]  # the epoch the checkpoint stopped in
        if rank == 0:
            print(
                f"resumed at epoch {start_epoch}, step {step}: {ckpt['loader']['consumed']} samples of "
                f"this epoch already seen per rank; continuing with the next unseen batch",
                flush=True,
            )
    if rank == 0:
        print(
            f"{len(dataset)} samples, world {dist.get_world_size() if distributed else 1}, "
            f"{len(loader)} batches of {args.batch_size} per rank per epoch, "
            f"{loader.num_workers} workers per rank",
            flush=True,
        )

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resume pending for this epoch
        losses, correct, seen = [], 0, 0
        t0 = time.perf_counter()
        for batch in loader:
            images = batch["image"].to(device, non_blocking=True)
            tokens = batch["caption"].to(device)
            mask = batch["__mask__"]["caption"].to(device).float()
            logits = ddp(images, tokens, mask)
            target = torch.arange(len(images), device=device)
            loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            losses.append(loss.item())
            correct += (logits.argmax(1) == target).sum().item()
            seen += len(images)
            step += 1
            if args.checkpoint and rank == 0 and step % 10 == 0:
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optim": optim.state_dict(),
                        "loader": loader.state_dict(),
                        "step": step,
                    },
                    args.checkpoint,
                )
            if args.stop_after and step >= args.stop_after:
                if rank == 0:
                    print(f"stopping after step {step} (simulated preemption; rerun with --resume)", flush=True)
                if distributed:
                    dist.barrier()
                    dist.destroy_process_group()
                return
        dt = time.perf_counter() - t0
        if rank == 0 and losses:
            print(
                f"epoch {epoch}: loss {sum(losses) / len(losses):.3f} (first batch {losses[0]:.3f}, "
                f"last {losses[-1]:.3f}), in-batch retrieval acc {correct / seen:.2f}, "
                f"{seen / dt:.0f} samples/s per rank",
                flush=True,
            )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
