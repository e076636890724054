"""``mmloader bench``: throughput, time to first batch and memory of a loader, on your data.

Memory is read from ``/proc/<pid>/smaps_rollup`` of this process and its children
(the DataLoader workers): PSS counts shared pages (page cache, shared libraries)
once across the tree, USS is what each process holds privately. It is sampled
once a second (and at the start and end): reading smaps walks the page tables
under the mmap lock, and sampling every 50 ms measurably slowed the page faults
of an mmap-reading loader (25k vs 60k samples/s here).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterable


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return []
    out = []
    for k in kids:
        out += [k, *_children(k)]
    return out


def smaps_rollup(pid: int) -> dict[str, int]:
    """PSS, USS (private clean + dirty) and anonymous memory of one process, in bytes (zeros if
    it is gone or /proc is unavailable)."""
    out = {"pss": 0, "uss": 0, "anonymous": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["pss"] = int(line.split()[1]) * 1024
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    out["uss"] += int(line.split()[1]) * 1024
                elif line.startswith("Anonymous:"):
                    out["anonymous"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def process_memory(pid: int) -> tuple[int, int]:
    """(PSS, USS) of one process in bytes."""
    m = smaps_rollup(pid)
    return m["pss"], m["uss"]


class MemorySampler:
    """Samples the memory of a process tree in a background thread; keeps the peaks.

    >>> with MemorySampler() as mem: run()          # doctest: +SKIP
    >>> mem.peak_pss, mem.peak_worker_uss            # doctest: +SKIP
    """

    def __init__(self, pid: int | None = None, interval: float = 1.0):
        self.pid, self.interval = pid or os.getpid(), interval
        self.peak_pss = self.peak_main_uss = self.peak_worker_uss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        pss_total = 0
        for i, p in enumerate([self.pid, *_children(self.pid)]):
            pss, uss = process_memory(p)
            pss_total += pss
            if i == 0:
                self.peak_main_uss = max(self.peak_main_uss, uss)
            else:
                self.peak_worker_uss = max(self.peak_worker_uss, uss)
        self.peak_pss = max(self.peak_pss, pss_total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def batch_size_of(batch: Any) -> tuple[int, int]:
    """(samples, bytes) in a batch: keys (or the first column) count samples; tensors, bytes and
    str count bytes."""
    import torch

    if isinstance(batch, dict):
        n = len(batch["__key__"]) if "__key__" in batch else 1
        return n, sum(batch_size_of(v)[1] for k, v in batch.items() if k != "__key__")
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (torch.Tensor, list, tuple)):
        first = batch[0]  # a (images, captions, ...) tuple of columns
        n = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else len(first)
        return n, sum(batch_size_of(v)[1] for v in batch)
    if isinstance(batch, torch.Tensor):
        return 1, batch.element_size() * batch.nelement()
    if isinstance(batch, (bytes, bytearray, str)):
        return 1, len(batch)
    if isinstance(batch, (list, tuple)):
        return len(batch), sum(batch_size_of(v)[1] for v in batch)
    return 1, 0


def measure(loader: Iterable, epochs: int = 1, set_epoch: bool = True) -> dict:
    """Iterate ``loader`` for ``epochs``; returns samples/s, MB/s, first-batch latency,
    per-epoch seconds and peak memory."""
    epochs_s, samples, nbytes = [], 0, 0
    first = None
    with MemorySampler() as mem:
        start = time.perf_counter()
        for e in range(epochs):
            if set_epoch and hasattr(loader, "set_epoch"):
                loader.set_epoch(e)
            t0 = time.perf_counter()
            for batch in loader:
                if first is None:
                    first = time.perf_counter() - t0
                n, b = batch_size_of(batch)
                samples += n
                nbytes += b
            epochs_s.append(time.perf_counter() - t0)
        total = time.perf_counter() - start
    return {
        "samples": samples,
        "seconds": total,
        "samples_per_s": samples / total if total else 0.0,
        "mb_per_s": nbytes / 1e6 / total if total else 0.0,
        "first_batch_s": first or 0.0,
        "epoch_s": epochs_s,
        "peak_pss_mb": mem.peak_pss / 2**20,
        "peak_main_uss_mb": mem.peak_main_uss / 2**20,
        "peak_worker_uss_mb": mem.peak_worker_uss / 2**20,
    }


def dataset_for_bench(path: str, raw: bool = False):
    """Every field of a dataset that all samples have, with the natural reader; the image fields
    as one ``image`` modality (alternatives, e.g. ``jpg;png``), raw bytes with ``raw``."""
    import mmloader

    from ..media.imageinfo import IMAGE_EXTENSIONS

    store = mmloader.open(path)
    counts = store.metadata.get("field_counts", {})
    readers = {}
    if any(f.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS for f in counts):
        readers["image"] = mmloader.ImageReader(store, output="raw" if raw else "tensor")
    for f, n in counts.items():
        if f.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS or n != len(store):
            continue
        try:
            readers[f.replace(".", "_")] = mmloader.reader_for(store, f)
        except mmloader.MMLoaderError:
            continue  # e.g. pickled fields: never read
    return mmloader.zip(**readers)


def main(args) -> int:
    """The CLI: ``mmloader bench PATH|CONFIG [--workers W --batch-size B --epochs E --step-ms T]``."""
    import mmloader

    from ..loading.config import is_config_path
    from ..loading.dataloader import default_num_workers
    from ..loading.diagnosis import advice, at_step
    from ..readers.timing import STAGES
    from ..storage.remote.redaction import redact_url

    path = str(args.path)
    if is_config_path(path):
        stream = mmloader.from_config(path, batch_size=args.batch_size)
    else:
        stream = mmloader.Stream(dataset_for_bench(path, raw=args.raw), batch_size=args.batch_size)
    workers = args.workers if args.workers is not None else default_num_workers()
    backend = getattr(args, "backend", None) or "auto"
    if backend == "auto":
        from ..loading.dataloader import choose_backend

        backend = choose_backend(stream)[0]
    loader = mmloader.loader(stream, num_workers=workers, backend=backend)
    r = measure(loader, epochs=args.epochs)
    print(
        f"{redact_url(path)}: {r['samples']} samples in {r['seconds']:.2f} s over {args.epochs} epoch(s), "
        f"{backend} backend, {workers} workers, batch {args.batch_size}"
    )
    print(f"  throughput      {r['samples_per_s']:,.0f} samples/s, {r['mb_per_s']:,.1f} MB/s delivered")
    print(f"  first batch     {r['first_batch_s'] * 1000:.0f} ms")
    print(f"  epochs          {', '.join(f'{s:.2f} s' for s in r['epoch_s'])}")
    print(
        f"  memory          peak PSS of the loader's process tree {r['peak_pss_mb']:.0f} MB; "
        f"peak USS main {r['peak_main_uss_mb']:.0f} MB, per worker {r['peak_worker_uss_mb']:.0f} MB"
    )
    figures = loader.stats() if hasattr(loader, "stats") else {}
    stages = [f"{s} {figures[f'{s}_ms_per_batch']:.1f}" for s in STAGES if f"{s}_ms_per_batch" in figures]
    if stages:
        print(f"  stages          {', '.join(stages)} ms per batch, per builder")
    if args.step_ms:
        per_batch_ms = 1000 * r["seconds"] / max(1, r["samples"] / args.batch_size)
        ratio = args.step_ms / per_batch_ms
        verdict = (
            "not data-bound"
            if ratio >= 1.5
            else "DATA-BOUND: loading is not 1.5x faster than the step (more workers, the thread backend, "
            "--resize-max at conversion, or GPU decode)"
        )
        print(
            f"  step check      loading takes {per_batch_ms:.1f} ms per batch vs a {args.step_ms:.0f} ms step: "
            f"{ratio:.1f}x faster -> {verdict}"
        )
        if figures:  # what a loop of that step would wait for, and why
            print(f"  advice          {advice(at_step(figures, args.step_ms, per_batch_ms))}")
    return 0


# -- the subcommand ------------------------------------------------------------------------------
HELP = "measure throughput, first-batch latency and memory on your data"
EXAMPLES = ["mmloader bench out.lmdb --epochs 1", "mmloader bench samples/configs/mixed.yaml --step-ms 120"]


def add_arguments(s) -> None:
    """The options of ``mmloader bench``."""
    from .args import int_at_least, positive_float

    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument(
        "--workers", type=int_at_least(0), default=None, help="loader workers (default: CPUs per local rank)"
    )
    s.add_argument("--batch-size", type=int_at_least(1), default=64, help="samples per batch (default 64)")
    s.add_argument("--epochs", type=int_at_least(1), default=2, help="epochs to time (default 2)")
    s.add_argument("--step-ms", type=positive_float, default=None, help="training step time to compare against")
    s.add_argument("--raw", action="store_true", help="raw bytes (no image decode)")
    s.add_argument(
        "--backend",
        choices=("auto", "thread", "process"),
        default="auto",
        help="as mmloader.loader(backend=): auto (default) picks threads for built-in decoders, "
        "worker processes for Python transforms",
    )


def run(args) -> int:
    """Measure and print the figures."""
    return main(args)
