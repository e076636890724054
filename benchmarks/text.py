"""Text at scale: batches of token ids from a huge one-sample-per-line text file, mmloader vs the
seed approach (a byte-range ``IterableDataset``), HF ``datasets`` (streaming and memory-mapped) and
LitData's ``TokensLoader``.

    pip install -e '.[bench]'
    python benchmarks/text.py                  # 1 GB corpus, 3 rounds, + the 1 GB vs 4 GB memory check
    python benchmarks/text.py --size-gb 0.05 --rounds 1 --memory-size-gb 0 --seconds 5   # a quick look

On 2 cores: about 18 minutes of preparation the first time (most of it tokenizing the file once for HF
and once for mmloader's ids), then about 20 minutes of measuring; ~10 GB under ``--work`` while it runs (6 GB stay cached).

What it does:
- generates a text file of ``--size-gb`` (one sample per line: pseudo-words drawn from a 50,000-word
  vocabulary with a Zipf distribution, 3 to 400 words a line, log-normal, median 30), cached in
  ``--work`` (default /tmp/textbench) so reruns reuse it;
- trains a byte-level BPE (``--vocab`` 8192) with the ``tokenizers`` library on the file's first
  100,000 lines: every contender uses this one tokenizer (``tokenizer.json``);
- prepares what each contender reads (timed, cached): mmloader's line index, a textlines LMDB
  (``mmloader convert textlines``) and one with each line's token ids (``--tokenizer``), HF
  ``datasets`` tokenized once with ``.map(batched=True)`` and saved to disk, LitData token chunks
  (``litdata.optimize`` with ``TokensLoader``);
- measures each contender in a fresh process, contenders alternating within each round: batches of
  ``--batch-size`` token-id sequences padded to the batch's longest (+ attention mask), ``--workers``
  worker processes, for ``--seconds`` after the first batch; samples/s, real tokens/s (padding not
  counted), padding fraction, time to the first batch (from building the dataset, page cache warm),
  and peak memory per worker (USS, PSS, anonymous; ``/proc/<pid>/smaps_rollup`` every 0.5 s);
  length bucketing on and off where the contender has it. Medians over ``--rounds``. A reference row
  times the tokenizer alone (``tokenizer-alone``: no loader, lines already in memory);
- the same measurement for mmloader (with worker processes) on a ``--memory-size-gb`` (4 GB) file, generated for this check
  only and deleted afterwards (``--keep-large`` keeps it);
- writes the "Text at scale" section of benchmarks/RESULTS.md (the other sections are kept).

Every measuring process runs with ``TOKENIZERS_PARALLELISM=false``: the worker processes are the
parallelism (2 workers on 2 cores), as for every contender; the measuring loop itself runs torch on
one thread (its token count would otherwise spin OpenMP threads on the workers' cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

SECTION = "## Text at scale"
GENERATOR_VERSION = 1
TRAIN_LINES = 100_000
BUCKET_WINDOW = 64  # batches per bucketing window, for every contender that buckets
LITDATA_BLOCK = 512  # tokens per LitData TokensLoader sample
PAD, BOS, EOS = "[PAD]", "[BOS]", "[EOS]"  # [PAD] is id 0: every contender pads with 0

# name: (what it is, bucketing modes, order of samples)
CONTENDERS = {
    "seed-byte-range": (
        "generator IterableDataset: per-worker line-aligned byte ranges, "
        "tokenizer.encode_batch per batch, pads in the worker",
        ("off", "on"),
        "sequential per worker",
    ),
    "hf-streaming": (
        "datasets.load_dataset('text', streaming=True).map(tokenize, batched=True) + DataCollatorWithPadding",
        ("off",),
        "sequential",
    ),
    "hf-mmap": (
        "load_dataset('text') .map(tokenize, batched=True) once, saved; load_from_disk + "
        "DataCollatorWithPadding (bucketing: transformers' LengthGroupedSampler)",
        ("off", "on"),
        "shuffled",
    ),
    "litdata-tokens": (
        "litdata.optimize to token chunks once; StreamingDataset(TokensLoader(block_size=%d)) + "
        "StreamingDataLoader" % LITDATA_BLOCK,
        ("packed",),
        "shuffled chunks",
    ),
    "mmloader-textlines": (
        "mmloader.TextLinesReader(path, tokenizer='tokenizer.json') -> Stream -> mmloader.loader "
        "(default backend: threads; one encode_batch a batch, without the GIL)",
        ("off", "on"),
        "shuffled",
    ),
    "mmloader-lmdb": (
        "mmloader.TextReader(textlines LMDB, tokenizer='tokenizer.json') -> Stream -> mmloader.loader "
        "(default backend: threads)",
        ("off", "on"),
        "shuffled",
    ),
    "mmloader-lmdb-ids": (
        "`mmloader convert textlines --tokenizer` stores each line's ids once (int32 .npy); "
        "mmloader.ArrayReader(path, 'ids.npy') -> Stream -> mmloader.loader (default backend: "
        "threads)",
        ("off", "on"),
        "shuffled",
    ),
    "mmloader-textlines-transform": (
        "extra, for comparison: the tokenizer as a per-sample Python transform "
        "(TextLinesReader(path, transform=tokenizer)), which `mmloader.loader` runs in "
        "worker processes",
        ("on",),
        "shuffled",
    ),
    "tokenizer-alone": (
        "a reference, not a loader: Tokenizer.encode per line in N processes on lines already in "
        "memory (no loader, no padding)",
        ("-",),
        "-",
    ),
}
PRETOKENIZED = {"hf-mmap", "litdata-tokens", "mmloader-lmdb-ids"}
EXTRA = {"mmloader-textlines-transform"}  # measured for the report, left out of the goal's comparison


# -- the corpus ---------------------------------------------------------------------------------
def _vocab(rng, n: int = 50_000) -> list[str]:
    """Pseudo-words from syllables, shortest first (so frequent ranks are short, as in English)."""
    import numpy as np

    onsets = "b c d f g h j k l m n p r s t v w z br cr dr fr gr pr st tr ch sh th wh pl cl bl sl sp".split()
    nuclei = "a e i o u ai ea ou ie oo".split()
    codas = ["", "", "", "n", "r", "s", "t", "l", "nd", "st", "ng", "rk", "ck"]
    syllables = [o + v + c for o in onsets for v in nuclei for c in codas]
    words: set[str] = set()
    while len(words) < n:
        counts = rng.integers(1, 5, n)
        ids = rng.integers(0, len(syllables), (n, 4))
        words.update("".join(syllables[j] for j in row[:k]) for row, k in zip(ids.tolist(), counts.tolist()))
    words_sorted = sorted(words)[:n]
    key = np.array([len(w) for w in words_sorted]) + rng.normal(0, 2.0, len(words_sorted))
    return [words_sorted[i] for i in np.argsort(key, kind="stable")]


def generate_corpus(path: Path, size: int, seed: int = 0) -> None:
    """Write ``size`` bytes (rounded up to a whole chunk of lines) of one-sample-per-line text."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = _vocab(rng)
    v = len(words)
    seps = [b" ", b", ", b". ", b".\n"]  # after a word; the last word of a line ends with ".\n"
    entries = [w.encode() + s for s in seps for w in words]
    table_bytes = np.frombuffer(b"".join(entries), np.uint8)
    lens = np.array([len(e) for e in entries], np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    p = 1.0 / (np.arange(v) + 2.7) ** 1.07  # Zipf-Mandelbrot word frequencies
    cdf = np.cumsum(p) / p.sum()
    quantiles = np.minimum(np.searchsorted(cdf, (np.arange(1 << 22) + 0.5) / (1 << 22)), v - 1)
    tmp = path.with_name(path.name + ".partial")
    written = 0
    with open(tmp, "wb") as f:
        while written < size:
            words_per_line = np.clip(np.rint(rng.lognormal(np.log(30), 1.0, 20_000)), 3, 400).astype(np.int64)
            n = int(words_per_line.sum())
            word = quantiles[rng.integers(0, 1 << 22, n)]
            u = rng.random(n)
            sep = (u > 0.88).astype(np.int64) + (u > 0.95)
            sep[np.cumsum(words_per_line) - 1] = 3
            entry = sep * v + word
            entry_len = lens[entry]
            out_start = np.cumsum(entry_len) - entry_len
            gather = np.repeat(starts[entry] - out_start, entry_len) + np.arange(int(entry_len.sum()))
            chunk = table_bytes[gather].tobytes()
            f.write(chunk)
            written += len(chunk)
    os.replace(tmp, path)


def corpus(work: Path, size_gb: float) -> Path:
    """The cached corpus of ``size_gb`` GB (generated when absent or made by another generator)."""
    tag = f"{size_gb:g}g"
    path = work / f"corpus-{tag}.txt"
    done = path.with_name(path.name + ".done")
    want = {"bytes": int(size_gb * 1e9), "seed": 0, "generator": GENERATOR_VERSION}
    if path.exists() and done.exists() and json.loads(done.read_text()).get("spec") == want:
        return path
    print(f"generating {path} ({size_gb:g} GB) ...", flush=True)
    t0 = time.perf_counter()
    generate_corpus(path, want["bytes"])
    done.write_text(json.dumps({"spec": want, "seconds": time.perf_counter() - t0}))
    print(f"  {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
    return n


# -- the tokenizer --------------------------------------------------------------------------------
def train_tokenizer(text: Path, out: Path, vocab: int) -> None:
    import itertools

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD, BOS, EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    with open(text, encoding="utf-8") as f:
        tok.train_from_iterator((line.rstrip("\n") for line in itertools.islice(f, TRAIN_LINES)), trainer)
    assert tok.token_to_id(PAD) == 0
    tok.save(str(out))


_TOKENIZERS: dict[str, object] = {}


def load_tokenizer(path: str):
    """One ``tokenizers.Tokenizer`` per process and file."""
    tok = _TOKENIZERS.get(path)
    if tok is None:
        from tokenizers import Tokenizer

        tok = _TOKENIZERS[path] = Tokenizer.from_file(path)
    return tok


def fast_tokenizer(path: str):
    """The same tokenizer as a transformers ``PreTrainedTokenizerFast`` (what HF's collators take)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "using the __call__ method is faster than ... pad": we do
    return PreTrainedTokenizerFast(tokenizer_object=load_tokenizer(path), pad_token=PAD)


class TokenIds:
    """The transform a user hands mmloader: ``str -> 1-D int64 tensor of token ids``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str):
        import torch

        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.long)


def _hf_tokenize(batch: dict, tokenizer_path: str) -> dict:
    ids = [e.ids for e in load_tokenizer(tokenizer_path).encode_batch(batch["text"])]
    return {"input_ids": ids, "length": [len(x) for x in ids]}


# -- preparation ------------------------------------------------------------------------------------
def prepare(args, work: Path, text: Path) -> dict:
    """Everything each contender reads, built once and cached; returns paths and preparation times."""
    tag = text.stem.split("-", 1)[1]
    record_file = work / f"prepared-{tag}.json"
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    paths = {"text": str(text), "tag": tag}

    def step(name: str, path: Path, build) -> None:
        paths[name] = str(path)
        if name in record and path.exists():
            return
        print(f"preparing {name}: {path} ...", flush=True)
        t0 = time.perf_counter()
        build(path)
        record[name] = time.perf_counter() - t0
        record_file.write_text(json.dumps(record, indent=1))
        print(f"  {record[name]:.0f} s", flush=True)

    step("tokenizer", work / f"tokenizer-bpe{args.vocab}-{tag}.json", lambda p: train_tokenizer(text, p, args.vocab))
    step("lines", work / f"corpus-{tag}.txt.lines.npy", lambda p: index_lines(text))
    step(
        "lmdb",
        work / f"corpus-{tag}.lmdb",
        lambda p: subprocess.run(
            [
                _mmloader_cli(),
                "convert",
                "textlines",
                str(text),
                str(p),
                "--workers",
                str(args.workers),
                "--overwrite",
                "-q",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        ),
    )
    step("hf", work / f"hf-tokenized-{tag}", lambda p: hf_prepare(text, p, paths["tokenizer"], work, args.workers))
    step(
        "litdata",
        work / f"litdata-tokens-{tag}",
        lambda p: subprocess.run(
            [sys.executable, __file__, "--litdata-optimize", paths["hf"], str(p), "--workers", str(args.workers)],
            check=True,
            env=_env(),
        ),
    )
    step(
        "lmdb_ids",
        work / f"ids-{tag}.lmdb",
        lambda p: subprocess.run(
            [
                _mmloader_cli(),
                "convert",
                "textlines",
                str(text),
                str(p),
                "--tokenizer",
                paths["tokenizer"],
                "--workers",
                str(args.workers),
                "--overwrite",
                "-q",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        ),
    )
    paths["lines_count"] = record.get("lines_count") or count_lines(text)
    record["lines_count"] = paths["lines_count"]
    record_file.write_text(json.dumps(record, indent=1))
    paths["prepared_s"] = {k: v for k, v in record.items() if k != "lines_count"}
    return paths


def _mmloader_cli() -> str:
    venv = ROOT / ".venv/bin/mmloader"
    return str(venv) if venv.exists() else "mmloader"


def _env() -> dict:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def index_lines(text: Path) -> None:
    from mmloader.storage.text.store import TextLinesStore

    len(TextLinesStore(text, progress=False))  # builds the sidecar beside the file


def hf_prepare(text: Path, out: Path, tokenizer_path: str, work: Path, workers: int) -> None:
    """HF's documented recipe: ``load_dataset("text")`` then ``.map(tokenize, batched=True)``,
    kept with ``save_to_disk`` (reloading by fingerprint would re-tokenize: tokenizer objects
    do not hash deterministically)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import datasets

    datasets.disable_progress_bars()
    cache = work / "hf-cache"
    ds = datasets.load_dataset("text", data_files=str(text), split="train", cache_dir=str(cache))
    features = datasets.Features(
        {"input_ids": datasets.Sequence(datasets.Value("int32")), "length": datasets.Value("int32")}
    )
    ds = ds.map(
        _hf_tokenize,
        batched=True,
        num_proc=workers,
        remove_columns=["text"],
        features=features,
        fn_kwargs={"tokenizer_path": tokenizer_path},
    )
    shutil.rmtree(out, ignore_errors=True)
    ds.save_to_disk(str(out))
    del ds
    shutil.rmtree(cache, ignore_errors=True)  # the intermediate arrow copies: not read by any contender


_HF_ROWS = None


def _litdata_rows(span):
    """LitData's recipe (``optimize(fn=tokenize, item_loader=TokensLoader())``, one token tensor per
    document), fed the ids HF already computed rather than tokenizing the file a third time."""
    global _HF_ROWS
    import datasets
    import torch

    if _HF_ROWS is None:
        _HF_ROWS = datasets.load_from_disk(span[0])
    for a in range(span[1], span[2], 8192):
        for ids in _HF_ROWS[a : min(a + 8192, span[2])]["input_ids"]:
            yield torch.tensor(ids, dtype=torch.long)


def litdata_optimize(hf_path: str, out: str, workers: int) -> None:
    import datasets
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    n = len(datasets.load_from_disk(hf_path))
    step = max(1, -(-n // 64))
    spans = [(hf_path, a, min(a + step, n)) for a in range(0, n, step)]
    shutil.rmtree(out, ignore_errors=True)
    litdata.optimize(
        fn=_litdata_rows,
        inputs=spans,
        output_dir=out,
        chunk_size=LITDATA_BLOCK * 8192,
        item_loader=TokensLoader(),
        num_workers=workers,
        verbose=False,
    )


# -- contenders (each built inside a fresh measuring process) -------------------------------------
class ByteRangeText:
    """The seed approach, as its authors would write it: each worker takes a line-aligned byte
    range of the file (a line belongs to the range where it starts), reads it line by line,
    tokenizes a batch at a time and pads to the batch's longest line. With ``bucket_window``
    it reads that many batches of lines, sorts them by token count, and yields the batches in
    a shuffled order (the usual bucket iterator)."""

    def __init__(self, path: str, tokenizer, batch_size: int, bucket_window: int = 0, seed: int = 0):
        self.path, self.tokenizer, self.batch_size = path, tokenizer, batch_size
        self.bucket_window, self.seed = bucket_window, seed

    def lines(self, start: int, end: int):
        with open(self.path, "rb") as f:
            pos = start
            if start > 0:
                f.seek(start - 1)
                pos = start - 1 + len(f.readline())  # that line started in the previous range
            while pos < end:
                line = f.readline()
                if not line:
                    return
                pos += len(line)
                yield line.rstrip(b"\n").decode("utf-8")

    def pad(self, ids: list[list[int]]):
        import torch

        longest = max(len(x) for x in ids)
        out = torch.zeros((len(ids), longest), dtype=torch.long)
        mask = torch.zeros((len(ids), longest), dtype=torch.long)
        for i, x in enumerate(ids):
            out[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[i, : len(x)] = 1
        return {"input_ids": out, "attention_mask": mask}

    def batches(self, lines):
        import itertools
        import random

        rng = random.Random(self.seed)
        per_read = self.batch_size * max(1, self.bucket_window)
        while chunk := list(itertools.islice(lines, per_read)):
            ids = [
                e.ids
                for a in range(0, len(chunk), self.batch_size)
                for e in self.tokenizer.encode_batch(chunk[a : a + self.batch_size])
            ]
            if self.bucket_window:
                ids.sort(key=len)
            groups = [ids[a : a + self.batch_size] for a in range(0, len(ids), self.batch_size)]
            if self.bucket_window:
                rng.shuffle(groups)
            for group in groups:
                yield self.pad(group)


def _seed_dataset(path, tokenizer, batch_size, bucket_window):
    import torch.utils.data

    class ByteRangeDataset(ByteRangeText, torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            size = os.path.getsize(self.path)
            self.seed = worker  # each worker shuffles its buckets differently
            return self.batches(self.lines(size * worker // workers, size * (worker + 1) // workers))

    return ByteRangeDataset(path, tokenizer, batch_size, bucket_window)


EXTRA_RESULTS: dict[str, float] = {}  # side measurements a contender's build makes (not timed with it)


def build(name: str, bucket: str, paths: dict, workers: int, batch: int):
    """(loader, batch -> (ids, mask or None)) for one contender."""
    import torch
    from torch.utils.data import DataLoader

    tok_path = paths["tokenizer"]
    hf_view = lambda b: (b["input_ids"], b["attention_mask"])
    if name == "seed-byte-range":
        ds = _seed_dataset(paths["text"], load_tokenizer(tok_path), batch, BUCKET_WINDOW if bucket == "on" else 0)
        return DataLoader(ds, batch_size=None, num_workers=workers), hf_view
    if name == "hf-streaming":
        import datasets
        from transformers import DataCollatorWithPadding

        fast = fast_tokenizer(tok_path)
        ds = datasets.load_dataset("text", data_files=paths["text"], split="train", streaming=True)
        ds = ds.map(lambda b: fast(b["text"], return_attention_mask=False), batched=True, remove_columns=["text"])
        return DataLoader(
            ds, batch_size=batch, num_workers=workers, collate_fn=DataCollatorWithPadding(fast, return_tensors="pt")
        ), hf_view
    if name == "hf-mmap":
        import datasets
        from transformers import DataCollatorWithPadding
        from transformers.trainer_pt_utils import LengthGroupedSampler

        fast = fast_tokenizer(tok_path)
        ds = datasets.load_from_disk(paths["hf"])
        collate = DataCollatorWithPadding(fast, return_tensors="pt")
        if bucket == "on":  # what Trainer(group_by_length=True) does, with the lengths stored by map
            # A list: Trainer passes ds["length"], which datasets 4 returns as a lazy Column whose
            # every lookup costs ~0.25 ms (minutes before the first batch on this file).
            column, probes = ds["length"], min(len(ds), 400)
            t0 = time.perf_counter()
            for i in range(probes):
                column[i]
            EXTRA_RESULTS["untimed_s"] = time.perf_counter() - t0
            EXTRA_RESULTS["column_lookup_s"] = EXTRA_RESULTS["untimed_s"] / probes
            sampler = LengthGroupedSampler(batch, lengths=ds["length"][:], generator=torch.Generator().manual_seed(0))
            return DataLoader(
                ds.remove_columns(["length"]),
                batch_size=batch,
                sampler=sampler,
                collate_fn=collate,
                num_workers=workers,
            ), hf_view
        return DataLoader(
            ds.remove_columns(["length"]),
            batch_size=batch,
            shuffle=True,
            collate_fn=collate,
            num_workers=workers,
            generator=torch.Generator().manual_seed(0),
        ), hf_view
    if name == "litdata-tokens":
        import litdata
        from litdata.streaming.item_loader import TokensLoader

        ds = litdata.StreamingDataset(
            paths["litdata"], item_loader=TokensLoader(block_size=LITDATA_BLOCK), shuffle=True, drop_last=True, seed=0
        )
        return litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers), (lambda b: (b, None))
    if name == "mmloader-lmdb-ids":
        import mmloader

        stream = mmloader.Stream(
            mmloader.zip(text=mmloader.ArrayReader(paths["lmdb_ids"], "ids.npy")),
            seed=0,
            batching=mmloader.Batching(batch, collate_fn=mmloader.Collate(masks=["text"])),
            lengths=mmloader.Bucketing("text", window=BUCKET_WINDOW) if bucket == "on" else None,
        )
        return mmloader.loader(stream, num_workers=workers), (lambda b: (b["text"], b["__mask__"]["text"]))
    if name.startswith("mmloader"):
        import mmloader

        if name == "mmloader-textlines-transform":
            reader = mmloader.TextLinesReader(
                paths["text"], transform=TokenIds(load_tokenizer(tok_path)), progress=False
            )
        elif name == "mmloader-textlines":
            reader = mmloader.TextLinesReader(paths["text"], tokenizer=tok_path, progress=False)
        else:
            reader = mmloader.TextReader(paths["lmdb"], tokenizer=tok_path)
        stream = mmloader.Stream(
            mmloader.zip(text=reader),
            seed=0,
            batching=mmloader.Batching(batch, collate_fn=mmloader.Collate(masks=["text"])),
            lengths=mmloader.Bucketing("text", window=BUCKET_WINDOW) if bucket == "on" else None,
        )
        return mmloader.loader(stream, num_workers=workers), (lambda b: (b["text"], b["__mask__"]["text"]))
    raise ValueError(name)


def import_libraries(name: str) -> None:
    import importlib

    mods = {
        "hf-streaming": ["datasets", "transformers", "transformers.trainer_pt_utils"],
        "hf-mmap": ["datasets", "transformers", "transformers.trainer_pt_utils"],
        "litdata-tokens": ["litdata", "litdata.streaming.item_loader"],
        "mmloader-textlines": [
            "mmloader",
            "mmloader.readers",
            "mmloader.loading.stream",
            "mmloader.loading.dataloader",
        ],
        "mmloader-lmdb": ["mmloader", "mmloader.readers", "mmloader.loading.stream", "mmloader.loading.dataloader"],
        "mmloader-lmdb-ids": ["mmloader", "mmloader.readers", "mmloader.loading.stream", "mmloader.loading.dataloader"],
        "mmloader-textlines-transform": [
            "mmloader",
            "mmloader.readers",
            "mmloader.loading.stream",
            "mmloader.loading.dataloader",
        ],
    }
    for mod in ["torch", "torch.utils.data", "tokenizers", *mods.get(name, [])]:
        importlib.import_module(mod)


def _files_of(name: str, paths: dict) -> list[str]:
    return {
        "seed-byte-range": [paths["text"]],
        "hf-streaming": [paths["text"]],
        "hf-mmap": [paths["hf"]],
        "litdata-tokens": [paths["litdata"]],
        "mmloader-textlines": [paths["text"], paths["lines"]],
        "mmloader-lmdb": [paths["lmdb"]],
        "mmloader-lmdb-ids": [paths["lmdb_ids"]],
        "mmloader-textlines-transform": [paths["text"], paths["lines"]],
        "tokenizer-alone": [paths["text"]],
    }[name]


# -- measuring ------------------------------------------------------------------------------------
class TreeMemory:
    """Peaks of this process's and its children's memory (smaps_rollup), sampled every ``interval``."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.peaks = (
            interval,
            {"worker_uss": 0, "worker_pss": 0, "worker_anon": 0, "main_uss": 0, "tree_pss": 0},
        )
        self.workers_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        from mmloader.cli.bench import _children, smaps_rollup

        me = os.getpid()
        main = smaps_rollup(me)
        tree = main["pss"]
        p = self.peaks
        p["main_uss"] = max(p["main_uss"], main["uss"])
        for c in _children(me):
            m = smaps_rollup(c)
            if not m["pss"]:
                continue
            self.workers_seen.add(c)
            tree += m["pss"]
            p["worker_uss"] = max(p["worker_uss"], m["uss"])
            p["worker_pss"] = max(p["worker_pss"], m["pss"])
            p["worker_anon"] = max(p["worker_anon"], m["anonymous"])
        p["tree_pss"] = max(p["tree_pss"], tree)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "TreeMemory":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()
        self.peaks["worker_index_pss"] = max([mapped_pss(c, INDEX_SUFFIXES) for c in self.workers_seen] or [0])


INDEX_SUFFIXES = (".lines.npy",)  # mmloader's mmapped line index


def mapped_pss(pid: int, suffixes: tuple[str, ...]) -> int:
    """PSS (bytes) of the mappings of files whose names end with ``suffixes`` in process ``pid``."""
    total, current = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if parts and "-" in parts[0] and not parts[0].endswith(":"):
                    current = len(parts) >= 6 and parts[5].endswith(suffixes)
                elif current and parts[0] == "Pss:":
                    total += int(parts[1]) * 1024
    except OSError:
        pass
    return total


def warm(files: list[str]) -> None:
    from data import warm as warm_path

    for f in files:
        warm_path(f)


def run_one(name: str, bucket: str, paths: dict, workers: int, batch: int, seconds: float) -> dict:
    if name == "tokenizer-alone":
        return tokenizer_alone(paths, workers, seconds)
    import_libraries(name)  # before the clock: a training script has imported them long before
    import torch

    # The loop below counts tokens with mask.sum(): on torch's default intra-op threads the
    # OpenMP team spins after every sum and took ~5 ms of CPU a batch from the workers here.
    torch.set_num_threads(1)
    warm(_files_of(name, paths))
    t0 = time.perf_counter()
    loader, view = build(name, bucket, paths, workers, batch)
    t0 += EXTRA_RESULTS.pop("untimed_s", 0.0)  # a side measurement, not the contender's work
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    del first
    mem = TreeMemory().start()  # from here: reading smaps takes the mmap lock the first batch faults under
    samples = tokens = positions = batches = 0
    longest = 0
    t1 = time.perf_counter()
    for b in it:
        ids, mask = view(b)
        batches += 1
        samples += ids.shape[0]
        positions += ids.numel()
        tokens += int(mask.sum()) if mask is not None else ids.numel()
        longest = max(longest, ids.shape[1])
        if time.perf_counter() - t1 >= seconds:
            break
    elapsed = time.perf_counter() - t1
    mem.stop()
    del it
    return {
        "samples": samples,
        "tokens": tokens,
        "positions": positions,
        "batches": batches,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "tokens_per_s": tokens / elapsed,
        "padding": 1 - tokens / positions if positions else 0.0,
        "first_batch_s": first_s,
        "longest": longest,
        "workers_seen": len(mem.workers_seen),
        **EXTRA_RESULTS,
        **{f"peak_{k}_mb": v / 2**20 for k, v in mem.peaks.items()},
    }


def _tokenizer_alone_worker(path: str, tok_path: str, start: int, end: int, seconds: float, queue) -> None:
    tok = load_tokenizer(tok_path)
    lines = list(ByteRangeText(path, None, 64).lines(start, min(end, start + (64 << 20))))
    n = tokens = 0
    t0 = time.perf_counter()
    for line in lines:
        tokens += len(tok.encode(line).ids)
        n += 1
        if n % 256 == 0 and time.perf_counter() - t0 >= seconds:
            break
    queue.put((n, tokens, time.perf_counter() - t0))


def tokenizer_alone(paths: dict, workers: int, seconds: float) -> dict:
    """Lines and tokens per second of the tokenizer alone, in ``workers`` processes at once."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    size = os.path.getsize(paths["text"])
    procs = [
        ctx.Process(
            target=_tokenizer_alone_worker,
            args=(paths["text"], paths["tokenizer"], size * w // workers, size * (w + 1) // workers, seconds, queue),
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    n = sum(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    wall = max(r[2] for r in results)
    return {
        "samples": n,
        "tokens": tokens,
        "positions": tokens,
        "seconds": wall,
        "samples_per_s": n / wall,
        "tokens_per_s": tokens / wall,
        "padding": 0.0,
        "first_batch_s": 0.0,
        "workers_seen": workers,
    }


# -- the driver -------------------------------------------------------------------------------------
def measure_in_fresh_process(name, bucket, paths, args) -> dict | str:
    cmd = [
        sys.executable,
        __file__,
        "--run",
        name,
        bucket,
        "--paths",
        json.dumps(paths),
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
        "--seconds",
        str(args.seconds),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=_env())
    except subprocess.TimeoutExpired:
        return f"no result within {args.timeout} s (hung)"
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return ((proc.stderr.strip().splitlines() or ["?"])[-1])[:300]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=1.0, help="size of the corpus (GB, 1e9 bytes; default 1)")
    p.add_argument(
        "--memory-size-gb",
        type=float,
        default=4.0,
        help="the larger file of the memory check (default 4; 0 skips the check)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--seconds", type=float, default=15.0, help="how long each measurement reads after its first batch (default 15)"
    )
    p.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary size (default 8192)")
    p.add_argument("--work", default="/tmp/textbench", help="where the data goes (default /tmp/textbench)")
    p.add_argument("--only", default="", help="comma-separated contenders (default: all): " + ", ".join(CONTENDERS))
    p.add_argument("--keep-large", action="store_true", help="keep the memory check's large file")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="its text section is replaced")
    p.add_argument("--timeout", type=int, default=600, help="seconds before a measurement counts as hung")
    p.add_argument("--run", nargs=2, metavar=("CONTENDER", "BUCKET"), help=argparse.SUPPRESS)
    p.add_argument("--paths", help=argparse.SUPPRESS)
    p.add_argument("--litdata-optimize", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.litdata_optimize:
        litdata_optimize(*args.litdata_optimize, args.workers)
        return 0
    if args.run:  # child: one measurement, JSON on stdout's last line
        print(
            json.dumps(
                run_one(args.run[0], args.run[1], json.loads(args.paths), args.workers, args.batch_size, args.seconds)
            )
        )
        return 0

    os.environ.update(_env())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    text = corpus(work, args.size_gb)
    paths = prepare(args, work, text)
    names = [n for n in CONTENDERS if not args.only or n in args.only.split(",")]
    cases = [(n, b) for n in names for b in CONTENDERS[n][1]]
    results: dict[tuple[str, str], list[dict]] = {}
    failures: dict[tuple[str, str], str] = {}
    for r in range(args.rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)] if cases else []  # alternate who goes first
        for case in order:
            if case in failures:
                continue
            res = measure_in_fresh_process(*case, paths, args)
            if isinstance(res, str):
                failures[case] = res
                print(f"round {r}: {case[0]} bucket={case[1]}: FAILED {res}", flush=True)
                continue
            results.setdefault(case, []).append(res)
            print(
                f"round {r}: {case[0]:<20} bucket={case[1]:<6} {res['samples_per_s']:>8,.0f} samples/s "
                f"{res['tokens_per_s'] / 1e6:6.3f} M tokens/s  padding {100 * res['padding']:4.1f}%  first "
                f"{res['first_batch_s'] * 1000:6.0f} ms  worker USS {res.get('peak_worker_uss_mb', 0):5.0f} MB",
                flush=True,
            )
    memory = memory_check(args, work, paths) if args.memory_size_gb > 0 else None
    raw = work / f"results-{paths['tag']}-{time.strftime('%Y%m%d-%H%M')}.json"
    raw.write_text(
        json.dumps(
            {
                "args": vars(args),
                "paths": paths,
                "memory": memory,
                "results": [[*case, runs] for case, runs in results.items()],
                "failures": [[*case, why] for case, why in failures.items()],
            },
            indent=1,
        )
    )
    print(f"raw results: {raw}", flush=True)
    section = render(args, paths, results, failures, memory, started, load_start, os.getloadavg())
    from data import write_section

    write_section(args.results, "text", section)  # between its markers; the other sections are kept
    print(section)
    return 0


def memory_check(args, work: Path, paths: dict) -> dict:
    """mmloader (TextLinesReader, bucketing on, worker processes: the transform variant, so there are
    workers to measure) on the corpus and on a ``--memory-size-gb`` file."""
    large = corpus(work, args.memory_size_gb)
    big = {**paths, "text": str(large), "lines": str(large) + ".lines.npy"}
    t0 = time.perf_counter()
    index_lines(large)
    print(f"indexed {large.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    big["lines_count"] = count_lines(large)
    big["tag"] = large.stem.split("-", 1)[1]
    runs = {paths["tag"]: [], big["tag"]: []}
    for r in range(args.rounds):
        for which in (paths, big) if r % 2 == 0 else (big, paths):
            res = measure_in_fresh_process("mmloader-textlines-transform", "on", which, args)
            if isinstance(res, str):
                print(f"memory check {which['tag']}: FAILED {res}", flush=True)
                continue
            runs[which["tag"]].append(res)
            print(
                f"memory check {which['tag']}: worker USS {res['peak_worker_uss_mb']:.1f} MB, PSS "
                f"{res['peak_worker_pss_mb']:.1f} MB, anonymous {res['peak_worker_anon_mb']:.1f} MB, "
                f"{res['samples_per_s']:,.0f} samples/s",
                flush=True,
            )
    out = {
        "files": {paths["tag"]: (paths["text"], paths["lines_count"]), big["tag"]: (str(large), big["lines_count"])},
        "sizes": {paths["tag"]: Path(paths["text"]).stat().st_size, big["tag"]: large.stat().st_size},
        "runs": runs,
    }
    if not args.keep_large:
        for f in (large, Path(big["lines"]), large.with_name(large.name + ".done")):
            f.unlink(missing_ok=True)
    return out


# -- the RESULTS.md section ------------------------------------------------------------------------
def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in runs)


def _versions() -> str:
    out = []
    for mod in ("torch", "tokenizers", "datasets", "transformers", "litdata"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    import mmloader

    pkg = Path(mmloader.__file__).resolve().parent
    exported = pkg.parent / "COMMIT"  # a `git archive` export run with PYTHONPATH (see the report)
    if pkg == ROOT / "mmloader":
        try:
            commit = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(ROOT), "status", "--porcelain", "mmloader"], capture_output=True, text=True
            ).stdout.strip()
            out.append(f"mmloader {commit}" + (" + uncommitted changes under mmloader/" if dirty else ""))
        except OSError:
            out.append("mmloader (this checkout)")
    elif exported.exists():
        out.append(f"mmloader {exported.read_text().strip()} (a clean export of that commit)")
    else:
        out.append(f"mmloader from {pkg}")
    return ", ".join(out)


def render(args, paths, results, failures, memory, started, load_start, load_end) -> str:
    gb = Path(paths["text"]).stat().st_size / 1e9
    prep = paths["prepared_s"]
    cmd = (
        f"python benchmarks/text.py --size-gb {args.size_gb:g} --rounds {args.rounds} --workers {args.workers} "
        f"--batch-size {args.batch_size} --seconds {args.seconds:g} --memory-size-gb {args.memory_size_gb:g}"
    )
    lines = [
        SECTION,
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; {started}; "
        f"load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end "
        f"(the machine is shared: {'figures taken under load' if max(load_start[0], load_end[0]) > 1.5 else 'quiet'})  ",
        f"Versions: {_versions()}",
        "",
        f"Data: a generated {gb:.2f} GB text file, {paths['lines_count']:,} lines (one sample a line, pseudo-words "
        f"with Zipf frequencies, 3-400 words a line); a byte-level BPE of {args.vocab} tokens trained on its first "
        f"{TRAIN_LINES:,} lines with `tokenizers`, the same tokenizer for every contender. Batches of "
        f"{args.batch_size} token-id sequences padded to the batch's longest (+ attention mask), {args.workers} "
        f"worker processes, each measurement in a fresh process reading for {args.seconds:g} s after its first "
        f"batch, contenders alternating within each round, medians of {args.rounds} rounds; page cache warm. "
        f"Rates count the batches after the first; tokens/s counts real tokens (no padding); the first batch is "
        f"timed from building the dataset. Bucketing windows are {BUCKET_WINDOW} batches wherever the window is "
        f"ours (seed approach, mmloader); HF's LengthGroupedSampler uses its own (50 batches). "
        f"Memory: peaks of /proc/PID/smaps_rollup every 0.5 s after the first batch; worker figures are the "
        f"largest worker's.",
        "",
        "| contender | bucketing | order | samples/s | tokens/s (min-max) | padding | first batch (ms) | peak worker USS (MB) "
        "| peak worker PSS (MB) | peak tree PSS (MB) | worker processes | preparation |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    prep_of = {
        "hf-mmap": ("hf", "tokenized with .map(batched=True, num_proc=%d), saved" % args.workers),
        "litdata-tokens": ("litdata", "litdata.optimize of the HF token ids (no tokenizing)"),
        "mmloader-textlines": ("lines", "line index"),
        "mmloader-lmdb": ("lmdb", "mmloader convert textlines"),
        "mmloader-textlines-transform": ("lines", "line index"),
        "mmloader-lmdb-ids": ("lmdb_ids", "mmloader convert textlines --tokenizer: text and ids"),
    }
    for name, (_what, buckets, order) in CONTENDERS.items():
        for b in buckets:
            runs = results.get((name, b))
            if (name, b) in failures and not runs:
                lines.append(f"| {name} | {b} | {order} | failed: {failures[(name, b)]} | | | | | | | | |")
                continue
            if not runs:
                continue
            pk, pdesc = prep_of.get(name, (None, ""))
            prep_txt = f"{prep[pk]:,.0f} s ({pdesc})" if pk in prep else "none"
            sps = _med(runs, "samples_per_s")
            unit = f" ({LITDATA_BLOCK}-token blocks)" if name == "litdata-tokens" else ""
            if name == "tokenizer-alone":
                mem = "- | - | -"
            elif not _med(runs, "workers_seen"):
                mem = f"- | - | {_med(runs, 'peak_tree_pss_mb'):,.0f}"
            else:
                mem = (
                    f"{_med(runs, 'peak_worker_uss_mb'):,.0f} | {_med(runs, 'peak_worker_pss_mb'):,.0f} | "
                    f"{_med(runs, 'peak_tree_pss_mb'):,.0f}"
                )
            first = f"{_med(runs, 'first_batch_s') * 1000:,.0f}" if name != "tokenizer-alone" else "-"
            spread = (
                f" ({min(r['tokens_per_s'] for r in runs):,.0f}-{max(r['tokens_per_s'] for r in runs):,.0f})"
                if len(runs) > 1
                else ""
            )
            lines.append(
                f"| {name} | {b} | {order} | {sps:,.0f}{unit} | {_med(runs, 'tokens_per_s'):,.0f}{spread} | "
                f"{100 * _med(runs, 'padding'):.1f}% | {first} | {mem} | "
                f"{statistics.median(r.get('workers_seen', 0) for r in runs):.0f} | {prep_txt} |"
            )
    lines.append("")
    lines += ["What each contender is:", ""]
    for name, (what, _b, _o) in CONTENDERS.items():
        lines.append(f"- **{name}**: {what}")
    lines += [
        "",
        "Notes:",
        "",
        "- hf-mmap, litdata-tokens and mmloader-lmdb-ids read ids tokenized once beforehand (the "
        "preparation column): they do no tokenizing while loading, the others tokenize every epoch.",
        "- hf-streaming: a single text file is a single shard, so `datasets` stops all workers but one "
        '("Too many dataloader workers"); the worker processes column shows it.',
        hf_column_note(results, paths),
        "- litdata-tokens packs the token stream into fixed blocks: no padding, no per-line samples, "
        "so bucketing does not apply and its samples/s counts blocks.",
        "- The thread backend (every mmloader row but the transform one: no Python per sample, so "
        "`mmloader.loader` picks threads) has no worker processes: its memory is in the tree PSS. The training "
        "process's own USS is "
        "not shown: it counts library pages that no other process on the machine maps at that moment, and "
        "on this shared machine it moved between 18 and 290 MB across runs of one loader.",
        "",
    ]
    lines += goals(args, results, memory)
    return "\n".join(lines) + "\n"


def hf_column_note(results, paths) -> str:
    runs = [r for r in results.get(("hf-mmap", "on"), []) if "column_lookup_s" in r]
    cost = (
        (
            f" (measured here: {_med(runs, 'column_lookup_s') * 1e3:.2f} ms a lookup, so about "
            f"{_med(runs, 'column_lookup_s') * paths['lines_count'] / 60:.0f} min for this file's "
            f"{paths['lines_count']:,} lengths before the first batch)"
        )
        if runs
        else ""
    )
    return (
        "- hf-mmap with bucketing: `Trainer(group_by_length=True)` hands LengthGroupedSampler "
        '`dataset["length"]`, which datasets 4 returns as a lazy Column, looked up one index at a time'
        f'{cost}; we pass it a list (`dataset["length"][:]`).'
    )


def goals(args, results, memory) -> list[str]:
    tps = {case: _med(runs, "tokens_per_s") for case, runs in results.items()}
    ours = {c: v for c, v in tps.items() if c[0].startswith("mmloader") and c[0] not in EXTRA and c[1] == "on"}
    others = {c: v for c, v in tps.items() if not c[0].startswith("mmloader") and c[0] != "tokenizer-alone"}
    peers = {c: v for c, v in others.items() if c[1] == "on"}  # the goal: tokens/s *with bucketing*
    best = lambda d: max(d.items(), key=lambda x: x[1]) if d else None
    out = ["### Goals", ""]
    if ours and peers:
        best_ours, best_peer = best(ours), best(peers)
        ratio = best_ours[1] / best_peer[1]
        out.append(
            f"- **Tokens/s with bucketing, mmloader >= 1.5x the best of the others: "
            f"{'MET' if ratio >= 1.5 else 'NOT MET'}** — best mmloader ({best_ours[0][0]}, bucketing on) "
            f"{best_ours[1]:,.0f} tokens/s; best other with bucketing ({best_peer[0][0]}) "
            f"{best_peer[1]:,.0f}: **{ratio:.2f}x**."
        )
        pairs = [
            ("Tokenizing while loading", lambda c: c[0] not in PRETOKENIZED),
            ("Tokenized once beforehand", lambda c: c[0] in PRETOKENIZED),
        ]
        for label, keep in pairs:
            mine = best({c: v for c, v in ours.items() if keep(c)})
            theirs = best({c: v for c, v in peers.items() if keep(c)})
            if mine and theirs:
                out.append(
                    f"  {label}, like for like: {mine[0][0]} {mine[1]:,.0f} vs {theirs[0][0]} "
                    f"{theirs[1]:,.0f} tokens/s: **{mine[1] / theirs[1]:.2f}x**"
                    f" ({'met' if mine[1] / theirs[1] >= 1.5 else 'not met'})."
                )
        unbucketed = best({c: v for c, v in others.items() if c[0] not in PRETOKENIZED})
        mine = best({c: v for c, v in ours.items() if c[0] not in PRETOKENIZED})
        if unbucketed and mine:
            out.append(
                f"  Even against the fastest contender that tokenizes while loading without bucketing "
                f"({unbucketed[0][0]}, bucketing {unbucketed[0][1]}, {unbucketed[1]:,.0f} tokens/s, "
                f"with its padding): {mine[1] / unbucketed[1]:.2f}x."
            )
        packed = tps.get(("litdata-tokens", "packed"))
        if packed:
            out.append(
                f"  Outside the goal: litdata-tokens reads fixed {LITDATA_BLOCK}-token blocks of the "
                f"concatenated ids ({packed:,.0f} tokens/s): no per-line samples, no padding, so no "
                f"bucketing; best mmloader is {best_ours[1] / packed:.2f}x of it. mmloader has no "
                f"packed-block reader."
            )
        limit = tps.get(("tokenizer-alone", "-"))
        if limit:
            out.append(
                f"  The tokenizer alone (a reference: {args.workers} processes, lines in memory, no loader, "
                f"encode per line): {limit:,.0f} tokens/s."
            )
    else:
        out.append("- Tokens/s goal: not evaluated (contenders missing).")
    if memory:
        tags = list(memory["runs"])
        a, b = (memory["runs"][t] for t in tags)
        if a and b:
            rows = [
                "",
                "| file | lines | samples/s | first batch (ms) | peak worker USS (MB) | peak worker PSS (MB) "
                "| of which the line index (MB) | peak worker anonymous (MB) | peak tree PSS (MB) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for t, runs in ((tags[0], a), (tags[1], b)):
                path, count = memory["files"][t]
                rows.append(
                    f"| {Path(path).name} ({memory['sizes'][t] / 1e9:.2f} GB) "
                    f"| {count:,} | {_med(runs, 'samples_per_s'):,.0f} | {_med(runs, 'first_batch_s') * 1000:,.0f} | "
                    f"{_med(runs, 'peak_worker_uss_mb'):.1f} | {_med(runs, 'peak_worker_pss_mb'):.1f} | "
                    f"{_med(runs, 'peak_worker_index_pss_mb'):.1f} | "
                    f"{_med(runs, 'peak_worker_anon_mb'):.1f} | {_med(runs, 'peak_tree_pss_mb'):.0f} |"
                )

            def growth(key: str) -> tuple[float, float]:
                d = _med(b, key) - _med(a, key)
                return d, d / max(_med(a, key), 1e-9)

            (d_uss, r_uss), (d_pss, r_pss) = growth("peak_worker_uss_mb"), growth("peak_worker_pss_mb")
            d_idx = growth("peak_worker_index_pss_mb")[0]
            flat_uss, flat_pss = d_uss <= 10 or r_uss <= 0.10, d_pss <= 10 or r_pss <= 0.10
            verdict = (
                "MET" if flat_uss and flat_pss else "NOT MET (PSS; private memory is flat)" if flat_uss else "NOT MET"
            )
            out.append(
                f"- **Worker memory flat in file size ({tags[0]} vs {tags[1]}): {verdict}** — mmloader-textlines-transform (worker processes), "
                f"bucketing on, {len(a)}+{len(b)} fresh-process runs alternating, each reading for "
                f"{args.seconds:g} s: peak worker USS {d_uss:+.1f} MB ({100 * r_uss:+.1f}%), PSS {d_pss:+.1f} MB "
                f"({100 * r_pss:+.1f}%), of which the mmapped line index {d_idx:+.1f} MB (criterion: growth under "
                f"10 MB or 10% per worker, as benchmarks/memory.py)."
            )
            idx_mb = {t: 8 * memory["files"][t][1] / 2**20 for t in tags}
            out.append(
                f"  The line index (`<file>.lines.npy`, 8 bytes a line: {idx_mb[tags[0]]:.0f} MB and "
                f"{idx_mb[tags[1]]:.0f} MB here) is read with pread, never through its map (mapped part of a "
                f"worker's PSS: {_med(a, 'peak_worker_index_pss_mb'):.1f} and "
                f"{_med(b, 'peak_worker_index_pss_mb'):.1f} MB after {args.seconds:g} s): a fault maps a whole "
                "page-cache folio (up to ~1 MB on this kernel), so lookups through the map made each worker "
                "map ever more of a big index (+27 MB PSS after 12 s on the 4 GB file, before)."
            )
            out += rows
    else:
        out.append("- Memory flatness: not measured in this run (`--memory-size-gb 0`).")
    out.append("")
    return out


if __name__ == "__main__":
    sys.exit(main())
