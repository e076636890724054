"""GPU decode check (issue: feed an H200 faster than CPU workers can). Needs a CUDA GPU.

    python benchmarks/gpu_decode.py --samples 20000 --cpu-workers 15 --gpu-workers 4

Builds 256-px JPEG + label datasets (tar shards and LMDB), then measures images/s
delivered to the GPU as normalised bf16 (B, 3, 224, 224) batches by:

* CPU decode: ``ImageReader(output="tensor")`` in ``--cpu-workers`` workers (the backend
  ``mmloader.loader`` picks), batches copied to the GPU (pinned, non-blocking), resized and
  normalised there;
* GPU decode: ``ImageReader(output="raw")`` (packed bytes) in ``--gpu-workers``
  threads, then :class:`mmloader.GPUDecode` (batched nvJPEG on a side stream).

It prints a table with both rates, their ratio and peak GPU memory, and writes it with the
goal's verdict (>= 25,000 images/s and >= 2x the CPU path) into the ``gpu`` section of
``--results`` (default: benchmarks/RESULTS.md; on the device machine point it at a copy
under ``$OUT`` so that it comes back). On a machine without the wheels
(lmdb, tqdm, pyyaml), fetch them here first, as the device README describes:
``pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
manylinux2014_x86_64 -d .whl lmdb tqdm pyyaml`` and install them there with
``pip install --no-index --no-deps --target /tmp/site .whl/*.whl``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _encode(i: int) -> bytes:
    from data import photo

    buf = io.BytesIO()
    photo(i).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def build(out: Path, n: int) -> dict[str, Path]:
    import mmloader

    paths = {"tar": out / "gpu-shards", "lmdb": out / "gpu.lmdb"}
    if all(p.exists() for p in paths.values()):
        return paths
    distinct = min(n, 4096)  # distinct images, cycled: decode cost is what matters
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        jpegs = list(ex.map(_encode, range(distinct), chunksize=64))
    for fmt, path in paths.items():
        with mmloader.writer_for(path, fmt, shard_size=1000, overwrite=True) as w:
            for i in range(n):
                w.write({"__key__": f"{i:08d}", "jpg": jpegs[i % distinct], "cls": i % 1000})
    return paths


def run(path: Path, mode: str, workers: int, batch: int, passes: int) -> tuple[float, float]:
    import torch
    from torchvision.transforms.v2 import functional as F

    import mmloader

    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1)
    decode = "tensor" if mode == "cpu" else "raw"
    ds = mmloader.zip(image=mmloader.ImageReader(path, output=decode), label=mmloader.LabelReader(path))
    stream = mmloader.Stream(ds, batch_size=batch, seed=0)
    if mode == "cpu":
        loader = mmloader.loader(stream, num_workers=workers, pin_memory=True)

        def batches():
            for b in loader:
                x = b["image"].to("cuda", non_blocking=True)
                x = F.resize(x, [224, 224], antialias=True).to(torch.bfloat16).div_(255)
                yield (x - mean) / std
    else:
        loader = mmloader.GPUDecode(
            mmloader.loader(stream, num_workers=workers, backend="thread", pin_memory=True),
            size=(224, 224),
            dtype=torch.bfloat16,
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
        )

        def batches():
            for b in loader:
                yield b["image"]

    torch.cuda.reset_peak_memory_stats()
    for x in batches():  # warm-up pass: workers, nvJPEG handles, page cache
        pass
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    for _ in range(passes):
        for x in batches():
            n += x.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0), torch.cuda.max_memory_allocated() / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--cpu-workers", type=int, default=15)
    p.add_argument("--gpu-workers", type=int, default=4)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/mmloader-gpu"))
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (the CPU fallback is covered by tests/loading/test_gpu.py)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = build(out, args.samples)
    print(
        f"{torch.cuda.get_device_name()}; {os.cpu_count()} CPUs; data ready in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    rows = []
    for fmt, path in paths.items():
        cpu, cpu_mem = run(path, "cpu", args.cpu_workers, args.batch_size, args.passes)
        gpu, gpu_mem = run(path, "gpu", args.gpu_workers, args.batch_size, args.passes)
        rows.append((fmt, cpu, gpu, cpu_mem, gpu_mem))
        print(
            f"{fmt}: CPU decode ({args.cpu_workers} workers) {cpu:,.0f} img/s, GPU decode "
            f"({args.gpu_workers} threads) {gpu:,.0f} img/s",
            flush=True,
        )
    lines = [
        "## GPU decode (`benchmarks/gpu_decode.py`)",
        "",
        f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPUs; {args.samples:,} 256-px JPEGs + labels, "
        f"normalised bf16 (B, 3, 224, 224) batches of {args.batch_size} on the GPU; {args.passes} passes "
        f"after a warm-up pass; CPU decode: `mmloader.loader` as it chooses, {args.cpu_workers} workers; "
        f"GPU decode: `GPUDecode` fed packed bytes by {args.gpu_workers} threads.",
        "",
        "| store | CPU decode img/s | GPU decode img/s | GPU / CPU | peak GPU memory (GiB) CPU / GPU path |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for fmt, cpu, gpu, cm, gm in rows:
        lines.append(f"| {fmt} | {cpu:,.0f} | {gpu:,.0f} | {gpu / cpu:.2f}x | {cm:.1f} / {gm:.1f} |")
    worst_gpu = min(r[2] for r in rows)
    worst_ratio = min(r[2] / r[1] for r in rows)
    met = worst_gpu >= 25_000 and worst_ratio >= 2.0
    lines += [
        "",
        f"Goal: >= 25,000 img/s and >= 2x CPU decode on every store: **{'met' if met else 'not met'}** "
        f"(slowest store {worst_gpu:,.0f} img/s, {worst_ratio:.2f}x).",
    ]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from data import write_section

    write_section(args.results, "gpu", "\n".join(lines))  # the other benchmarks' sections stay
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
