"""Token-budget packing for vision-language batches: mmloader's packed rows against padding each
batch to its longest, length bucketing, and torchtune's ``PackedDataset``.

    pip install -e '.[bench]'
    python benchmarks/packing.py                                  # 40,000 samples, L = 4096 and 8192
    python benchmarks/packing.py --samples 4000 --seconds 3 --plan-sizes 100000   # a quick look
    python benchmarks/packing.py --peer-path /tmp/ttlib           # torchtune installed elsewhere

torchtune pins its own torchdata and needs a torchao that matches it; installed beside the
environment, not into it (torchtune 0.6.1 with torchao 0.10.0 imports with torch 2.14 here):

    pip install --target /tmp/ttlib --no-deps torchtune==0.6.1 torchao==0.10.0 torchdata==0.11.0 \
        omegaconf antlr4-python3-runtime==4.9.3 kagglehub sentencepiece tiktoken blobfile

What it does:

- **Data** (cached in ``--work``): 70% image-caption pairs and 30% interleaved documents. The
  captions are pseudo-words with Zipf frequencies (no internet here for real captions), with word
  counts from COCO-like (mean 10.5, sd 2.5) and LAION/CC-like (log-normal, median 12, to 77)
  distributions, half each. Each pair has one image of 576 tokens (LLaVA's 336-px ViT-L/14). The
  documents have a log-normal text length (median 300 words, sigma 0.9) and 0-6 images
  (Poisson, mean 1.5). A byte-level BPE (8192 ids) is trained with ``tokenizers`` on the data's
  own texts. Each sample is stored once, in one LMDB, as its whole token sequence (576
  placeholders per image, then its text ids, int32 ``ids.npy``), so every contender reads the
  same bytes; no image is decoded (this measures the token layout, not image decoding). A
  sample over the budget ``L`` is cut to ``L`` for every contender.
- **Contenders**, each in a fresh process, 2 DataLoader workers, shuffled:
    - ``pad``: ``Stream(batch_size=b)``, batches padded to their longest;
    - ``bucket``: the same with ``lengths=Bucketing("ids")``;
    - ``mmloader-packed``: ``Stream(batch_size=R, lengths=Packing(L, length_by=...))``;
    - ``torchtune-packed``: ``PackedDataset(split_across_pack=False)`` over the same samples
      in a shuffled order, at its documented best (whole samples, so no sample is cut between
      two packs); its collate stacks tokens, labels and positions, like ``padded_collate_packed``
      without the dense ``(B, L, L)`` mask that one builds off CUDA (a cost mmloader's rows do not pay).

  ``R`` rows of ``L`` tokens a step (4 at 4096, 2 at 8192); padded contenders take
  ``b = R * L / mean length`` samples a step, so every contender moves about as many samples.
- **Measures**:
    - token utilisation, over the whole epoch: real tokens over the tokens the model computes on;
    - useful tokens/s delivered to a training loop whose step costs in proportion to the tokens
      it is given (an embedding and two 256-wide linear layers over every position, on one
      thread: what padding wastes on a GPU, it wastes here);
    - the same with no model (what the loader alone can deliver);
    - planning time and peak memory for 1 M and 10 M samples (lengths resampled from the data),
      on one core.
- Writes the "Token-budget packing" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

IMAGE_TOKENS = 576
IMAGE_ID = 8191  # the placeholder id of image tokens (the BPE's last id)
GENERATOR_VERSION = 1
CONTENDERS = {
    "pad": "mmloader.Stream(batch_size=b): each batch padded to its longest (the default collate)",
    "bucket": "mmloader.Stream(batch_size=b, lengths=mmloader.Bucketing('ids')): similar lengths batched together, then padded",
    "mmloader-packed": "mmloader.Stream(batch_size=R, lengths=mmloader.Packing(L, length_by=mmloader.tokens('ids', overlong='truncate')))",
    "torchtune-packed": "torchtune.datasets.PackedDataset(ds, max_seq_len=L, split_across_pack=False) over the "
    "shuffled samples + DataLoader(shuffle=True); the collate stacks tokens, labels and positions "
    "(padded_collate_packed without the dense (B, L, L) block mask it builds off CUDA)",
}


# -- data ------------------------------------------------------------------------------------------
def make_data(work: Path, samples: int, seed: int = 0) -> Path:
    """The benchmark's LMDB of token sequences (cached), and its lengths as ``lengths.npy``."""
    from text import _vocab  # the pseudo-word vocabulary of the text benchmark

    import mmloader

    out = work / f"vl-{samples}-v{GENERATOR_VERSION}.lmdb"
    if (out / "lengths.npy").exists():
        return out
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = _vocab(rng, 20_000)
    p = 1.0 / (np.arange(len(words)) + 2.7) ** 1.07
    p /= p.sum()

    def text(n: int) -> str:
        return " ".join(words[i] for i in rng.choice(len(words), size=n, p=p)) + "."

    captions = int(samples * 0.7)
    coco = np.clip(np.round(rng.normal(10.5, 2.5, captions)), 4, 40).astype(int)
    laion = np.clip(np.round(rng.lognormal(np.log(12), 0.6, captions)), 3, 77).astype(int)
    caption_words = np.where(rng.random(captions) < 0.5, coco, laion)
    doc_words = np.clip(rng.lognormal(np.log(300), 0.9, samples - captions), 20, 6000).astype(int)
    texts = [text(int(n)) for n in caption_words] + [text(int(n)) for n in doc_words]
    images = np.r_[np.ones(captions, dtype=int), np.minimum(rng.poisson(1.5, samples - captions), 6)]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=IMAGE_ID, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    encoded = tok.encode_batch(texts)
    order = rng.permutation(samples)  # pairs and documents interleaved in the store
    lengths = np.zeros(samples, dtype=np.int64)
    with mmloader.writer_for(out, overwrite=True) as w:
        for n, i in enumerate(order.tolist()):
            ids = np.r_[np.full(IMAGE_TOKENS * images[i], IMAGE_ID), encoded[i].ids].astype(np.int32)
            w.write({"__key__": f"{n:07d}", "ids.npy": ids})
            lengths[n] = len(ids)
    np.save(out / "lengths.npy", lengths)
    return out


# -- one measurement, in its own process -------------------------------------------------------------
class _Model:
    """A training step: forward, backward and an AdamW update of a small model, on one thread. Its
    forward and backward cost grows with the tokens it is given (padding included), as a
    transformer's does; the update costs the same every step."""

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Embedding(IMAGE_ID + 1, 128), torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)
        )
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4)

    def __call__(self, ids) -> None:
        loss = self.net(ids.long()).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _loader(name: str, path: str, capacity: int, rows: int, per_batch: int, seed: int, backend: str = "auto"):
    """(iterable of (ids tensor, real tokens), planning seconds) of one contender."""
    import torch

    import mmloader

    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    started = time.perf_counter()
    if name in ("pad", "bucket"):
        stream = mmloader.Stream(
            ds,
            seed=seed,
            batching=mmloader.Batching(per_batch, collate_fn=mmloader.Collate(masks=["ids"])),  # a mask even when
            lengths=mmloader.Bucketing("ids") if name == "bucket" else None,  # a bucket's lengths are equal
        )
        len(stream)
        loader = mmloader.loader(stream, num_workers=2)

        def batches():
            for b in loader:
                ids, mask = b["ids"][:, :capacity], b["__mask__"]["ids"][:, :capacity]
                yield ids, int(mask.sum())

        return batches, time.perf_counter() - started
    if name == "mmloader-packed":
        layout = mmloader.tokens("ids", overlong="truncate")
        stream = mmloader.Stream(ds, batch_size=rows, seed=seed, lengths=mmloader.Packing(capacity, length_by=layout))
        len(stream)  # plans the epoch's rows
        loader = mmloader.loader(stream, num_workers=2, backend=backend)

        def packed():
            for b in loader:
                yield b["ids"], int(b["__mask__"]["ids"].sum())

        return packed, time.perf_counter() - started
    from torchtune.datasets import PackedDataset

    reader = mmloader.ArrayReader(path, "ids.npy")
    order = np.random.default_rng(seed).permutation(len(reader))

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return len(order)

        def __getitem__(self, i):
            ids = reader[int(order[i])][:capacity].tolist()
            return {"tokens": ids, "labels": ids}

    def stacked(batch):  # padded_collate_packed without its dense (B, L, L) block mask
        return {k: torch.stack([x[k] for x in batch]) for k in ("tokens", "labels", "input_pos")}

    packs = PackedDataset(Samples(), max_seq_len=capacity, padding_idx=0, split_across_pack=False)
    dl = torch.utils.data.DataLoader(
        packs, batch_size=rows, shuffle=True, num_workers=2, collate_fn=stacked, persistent_workers=True
    )

    def torchtune():
        for b in dl:  # padding has the ignore label (-100)
            yield b["tokens"], int((b["labels"] != -100).sum())

    return torchtune, time.perf_counter() - started


def measure(
    name: str, path: str, capacity: int, rows: int, per_batch: int, seconds: float, model: bool, backend: str = "auto"
) -> dict:
    import torch

    torch.set_num_threads(1)  # the loop on one core; the workers have the other
    step = _Model() if model else None
    batches, planning = _loader(name, path, capacity, rows, per_batch, seed=1, backend=backend)
    real = computed = count = 0
    start = None
    first = None
    t0 = time.perf_counter()
    for ids, useful in batches():
        if first is None:
            first = time.perf_counter() - t0
            start = time.perf_counter()
            continue  # rates count the batches after the first
        if step is not None:
            step(ids)
        real += useful
        computed += ids.numel()
        count += 1
        if time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start if start else 0.0
    return {
        "tokens_per_s": real / max(elapsed, 1e-9),
        "steps_per_s": count / max(elapsed, 1e-9),
        "utilisation_seen": real / max(computed, 1),
        "first_batch_s": first,
        "planning_s": planning,
    }


def epoch_utilisation(name: str, path: str, capacity: int, rows: int, per_batch: int) -> tuple[float, int]:
    """(real tokens over computed tokens across one whole epoch, the largest step's tokens), from the
    plan and the stored lengths."""
    import mmloader

    lengths = np.minimum(np.load(Path(path) / "lengths.npy"), capacity)
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    if name == "mmloader-packed":
        stream = mmloader.Stream(
            ds,
            batch_size=rows,
            seed=1,
            lengths=mmloader.Packing(capacity, length_by=mmloader.tokens("ids", overlong="truncate")),
        )
        return stream.plan().utilisation(), rows * capacity
    if name == "torchtune-packed":  # greedy in dataset order, whole samples: what PackedDataset does
        order = np.random.default_rng(1).permutation(len(lengths))
        packs, room = 0, 0
        for n in lengths[order].tolist():
            if n > room:
                packs, room = packs + 1, capacity
            room -= n
        return float(lengths.sum()) / (packs * capacity), rows * capacity
    stream = mmloader.Stream(
        ds, batch_size=per_batch, seed=1, lengths=mmloader.Bucketing("ids") if name == "bucket" else None
    )
    plan = stream.plan()
    _s, idx = plan.lookup(np.arange(len(plan)))
    ordered = lengths[idx]
    starts = np.arange(0, len(ordered), per_batch)
    longest = np.maximum.reduceat(ordered, starts)
    sizes = np.diff(np.r_[starts, len(ordered)])
    return float(ordered.sum()) / float((longest * sizes).sum()), int((longest * sizes).max())


def planning(sizes: list[int], lengths_path: Path, capacity: int) -> list[dict]:
    """Planning time and peak memory of a packed epoch of each size, lengths resampled from the data."""
    out = []
    for n in sizes:
        code = (
            "import os, sys, threading, time, numpy as np\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "from mmloader.planning.mixing import SingleOrder\n"
            "from mmloader.planning.packing import PackedOrder\n"
            f"lengths = np.random.default_rng(0).choice(np.load({str(lengths_path)!r}), {n})\n"
            f"lengths = np.minimum(lengths, {capacity}).astype(np.int32)\n"
            "page = os.sysconf('SC_PAGE_SIZE')\n"
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * page\n"
            "before, peak, done = rss(), [0], []\n"
            "def watch():\n"
            "    while not done:\n"
            "        peak[0] = max(peak[0], rss()); time.sleep(0.005)\n"
            "threading.Thread(target=watch, daemon=True).start(); t = time.perf_counter()\n"
            f"rows = PackedOrder(SingleOrder({n}, seed=0), lambda s, i: lengths[i], {capacity}, seed=0)\n"
            "dt = time.perf_counter() - t; done.append(1); peak = max(peak[0], rss()) - before\n"
            "print(dt, peak, len(rows), rows.utilisation())\n"
        )
        done = subprocess.run(
            ["taskset", "-c", "0", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        dt, peak, rows, util = done.stdout.split()
        out.append(
            {
                "samples": n,
                "seconds": float(dt),
                "peak_mb": int(peak) / 1e6,
                "rows": int(rows),
                "utilisation": float(util),
            }
        )
    return out


# -- the report --------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def report(args, results: dict, plans: list[dict], mean_len: dict, data_note: str) -> str:
    lines = [
        "## Token-budget packing",
        "",
        f"Command: `python benchmarks/packing.py --samples {args.samples} --seconds {args.seconds:g} --rounds {args.rounds}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}  ",
        "",
        data_note,
        "",
        "| L | contender | a step | largest step (tokens) | token utilisation (epoch) | "
        "useful tokens/s, training loop | useful tokens/s, loader alone | planning before the first batch (s) |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for capacity, by_name in results.items():
        for name, r in by_name.items():
            lines.append(
                f"| {capacity} | {name} | {r['shape']} | {r['largest']:,} | {r['epoch_utilisation']:.1%} | {_fmt(r['loop'])} | "
                f"{_fmt(r['alone'])} | {r['planning_s']:.2f} |"
            )
    lines += ["", "What each contender is:", ""]
    lines += [f"- **{n}**: {d}" for n, d in CONTENDERS.items()]
    lines += [
        "",
        "Planning a packed epoch (`PackedOrder`: the epoch's shuffle, the lookup and best-fit packing), "
        "one core (`taskset -c 0`), lengths resampled from the data, L = 4096:",
        "",
        "| samples | seconds | peak memory it adds (MB, RSS sampled every 5 ms) | bytes a sample | rows | utilisation |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in plans:
        lines.append(
            f"| {p['samples']:,} | {p['seconds']:.2f} | {p['peak_mb']:.0f} | {p['peak_mb'] * 1e6 / p['samples']:.0f} | "
            f"{p['rows']:,} | {p['utilisation']:.1%} |"
        )
    r4 = results.get(4096, {})
    lines += ["", "### Goals", ""]
    if r4:
        util = r4["mmloader-packed"]["epoch_utilisation"]
        lines.append(f"- **Utilisation >= 97% at L = 4096: {'MET' if util >= 0.97 else 'NOT MET'}**: {util:.1%}.")
        ours = r4["mmloader-packed"]["loop"]
        for other, goal in (("pad", 2.0), ("bucket", 1.3)):
            for label in [k for k in r4 if k.startswith(f"{other}, ")]:
                x = ours / max(r4[label]["loop"], 1e-9)
                lines.append(
                    f"- **Useful tokens/s >= {goal}x {label}: {'MET' if x >= goal else 'NOT MET'}**: "
                    f"{_fmt(ours)} vs {_fmt(r4[label]['loop'])}, **{x:.2f}x** (training loop, L = 4096; "
                    f"its largest step {r4[label]['largest']:,} tokens, the packed one "
                    f"{r4['mmloader-packed']['largest']:,})."
                )
        if "torchtune-packed" in r4:
            x = ours / max(r4["torchtune-packed"]["loop"], 1e-9)
            lines.append(f"- Against torchtune's PackedDataset (no goal set): {x:.2f}x useful tokens/s.")
    ten = [p for p in plans if p["samples"] >= 10_000_000]
    if ten:
        p = ten[0]
        lines.append(
            f"- **Planning a 10 M-sample epoch in under 10 s on one core: {'MET' if p['seconds'] < 10 else 'NOT MET'}**: "
            f"{p['seconds']:.2f} s, {p['peak_mb'] * 1e6 / p['samples']:.0f} bytes a sample at peak (O(samples))."
        )
    lines.append(
        f"- Mean sample length (tokens, cut at L): {', '.join(f'L={k}: {v:.0f}' for k, v in mean_len.items())}."
    )
    return "\n".join(lines + ["", *NOTES])


#: What the figures mean (kept with the script: the report is written from it).
NOTES = [
    "Notes:",
    "",
    "- **Utilisation.** The rows are best-fit decreasing, the textbook algorithm (tests check that the row "
    "counts are equal). 70% of the samples are 577-660 tokens (one 576-token image and a caption): six fill "
    "3,462-3,960 of 4,096, and the rest of the row must come from the few samples shorter than that gap. A "
    "local search over the same lengths (moving samples between random rows, 200,000 moves on a 2,000-sample "
    "window) reached 97.3%, so the goal needs a better packer than best-fit decreasing, which this planner "
    "does not pay for yet: it plans 10 M samples in seconds. At L = 8192 the same algorithm fills 98.3%.",
    "- **Where the 5.3% goes, and what was tried (issue 45).** On the 40,000 lengths at L = 4,096 the lower bound "
    "is 8,196 rows, 97% is 8,449, best-fit decreasing makes 8,655. Of its 460 rows of slack, 448 sit in 3,359 "
    "rows of six 577-660-token pairs alone (300-600 tokens free each); the rows holding longer samples are "
    "full to 11 rows of slack in all. The samples shorter than 577 tokens carry 1.5% of the tokens (122 rows' "
    "worth), so a packing that keeps pair-only rows stays under about 96.1% however it places them: 97% "
    "needs the pairs spread into the rows of longer documents (one document and four or five pairs closing "
    "the row), a balance over the whole window that rules deciding one row or one sample at a time do not "
    "find. Measured here (same lengths, same shuffle): rows completed by a subset-sum table over the lengths "
    "left (each row opened by the longest sample, then the fill leaving the least room, ties to the most "
    "plentiful length) 96.0%, but 55 s for 40,000 samples (875 table rebuilds); the same with a tolerance "
    "of 16 or 64 tokens 95.9% / 95.4%; worst-fit placement of the long samples into 1.01x the lower bound's "
    "rows, then best fit, 95.1%; longest-processing-time balancing into 97%-sized rows, then best fit for "
    "what did not fit, 94.6%; long samples interleaved with pairs before best fit, 93.6-94.8%. Later (same lengths): the long samples (> L/6) spread one "
    "or two to a row, each kept where the room it leaves lies in a band that k pairs fill, then every row completed "
    "by a bounded subset-sum over the short samples left (Python integers as bitsets: 8,600 rows in about 3 s) 95.5%: "
    "1,700 rows keep a room no combination closes and 2,300 rows of pairs alone remain; taking the rows of seven "
    "pairs (which close at 4,095) first, 94.1%, since they use up the short samples the other rows needed "
    "(experiments, not kept). Only the local search's 97.3% shows the goal can be reached on these lengths: "
    "by a packer that balances the whole window, not by any one-row-at-a-time rule tried here.",
    "- **Against bucketing.** `Bucketing` sorts windows of 64 batches by length, so on this data its batches "
    "are 96-97% real tokens. A step whose cost follows its tokens then gains little from packing (the goal's "
    "1.3x would need bucketing under about 73% full). What packing changes is the step: bucketed steps of 20 "
    "samples reach 81,920 tokens, five times the packed step's memory, and at 4 samples a step (the packed "
    "step's peak) they hold a fifth of its tokens; on this CPU such small steps ran faster per token than "
    "16,384-token ones, where on a GPU a step's cost per token falls with its size.",
    "- **Loader alone.** Packed batches are laid out with index arithmetic over the whole batch; the thread "
    "backend `mmloader.loader` picks delivers them 2x faster than torchtune's worker processes deliver its packs.",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=40_000)
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run, after the first batch")
    p.add_argument("--rounds", type=int, default=1, help="runs per contender (median)")
    p.add_argument("--lengths", default="4096,8192", help="token budgets L")
    p.add_argument("--plan-sizes", default="1000000,10000000", help="epoch sizes to time the planner on")
    p.add_argument("--work", default="/tmp/packbench")
    p.add_argument("--peer-path", default="", help="a folder with torchtune (and torchao) installed, put on PYTHONPATH")
    p.add_argument("--only", default="", help="comma-separated contenders (default: all)")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    p.add_argument("--run", nargs=6, help=argparse.SUPPRESS)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        name, path, capacity, rows, per_batch, model = args.run
        r = measure(name, path, int(capacity), int(rows), int(per_batch), args.seconds, model == "1", args.backend)
        print(json.dumps(r))
        return 0
    path = make_data(Path(args.work), args.samples)
    lengths = np.load(path / "lengths.npy")
    names = [n for n in CONTENDERS if not args.only or n in args.only.split(",")]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if args.peer_path:
        env["PYTHONPATH"] = os.pathsep.join([args.peer_path, env.get("PYTHONPATH", "")])
    results: dict[int, dict] = {}
    mean_len = {}
    for capacity in map(int, args.lengths.split(",")):
        rows = 4 if capacity <= 4096 else 2
        mean = float(np.minimum(lengths, capacity).mean())
        mean_len[capacity] = mean
        same_samples = max(1, round(rows * capacity / mean))
        results[capacity] = {}
        # Padded batches two ways: as many samples a step as the packed rows hold on average, and
        # as many as fit the packed step's peak (rows x L tokens) when every one may be L long.
        variants = [(n, same_samples) for n in ("pad", "bucket")] + [(n, rows) for n in ("pad", "bucket")]
        variants += [(n, rows) for n in ("mmloader-packed", "torchtune-packed")]
        for name, per_batch in variants:
            if name not in names:
                continue
            packed = "packed" in name
            label = name if packed else f"{name}, {per_batch} a step"
            shape = f"{rows} rows of {capacity}" if packed else f"{per_batch} samples, padded"
            runs: dict[str, list] = {"loop": [], "alone": [], "planning_s": []}
            for _ in range(args.rounds):
                for model in ("1", "0"):
                    cmd = [
                        sys.executable, __file__, "--seconds", str(args.seconds),
                        "--run", name, str(path), str(capacity), str(rows), str(per_batch), model,
                    ]  # fmt: skip
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
                    if done.returncode:
                        print(done.stderr[-2000:], file=sys.stderr)
                        raise SystemExit(f"{name} failed")
                    r = json.loads(done.stdout.strip().splitlines()[-1])
                    runs["loop" if model == "1" else "alone"].append(r["tokens_per_s"])
                    runs["planning_s"].append(r["planning_s"])
            util, largest = epoch_utilisation(name, str(path), capacity, rows, per_batch)
            results[capacity][label] = {
                "shape": shape,
                "loop": statistics.median(runs["loop"]),
                "alone": statistics.median(runs["alone"]),
                "planning_s": statistics.median(runs["planning_s"]),
                "epoch_utilisation": util,
                "largest": largest,
            }
            print(capacity, label, results[capacity][label], flush=True)
    plans = planning([int(n) for n in args.plan_sizes.split(",") if n], path / "lengths.npy", 4096)
    print(plans)
    captions = int(args.samples * 0.7)
    note = (
        f"Data: {args.samples:,} samples ({captions:,} image-caption pairs, {args.samples - captions:,} interleaved "
        f"documents), each stored as its token sequence (576 placeholders per image, then BPE text ids); "
        f"lengths {int(lengths.min())}-{int(lengths.max())} tokens, median {int(np.median(lengths))}. "
        "The training loop runs a training step on one thread: forward and backward of an embedding and "
        "a 128-512-128 MLP over every position of the batch (its cost follows the tokens it is given, "
        "padding included) and an AdamW update (the same every step); the loader alone counts the same "
        "useful tokens with no model. Padded contenders run two ways: as many samples a step as the "
        "packed rows hold on average (their largest steps then hold several times the packed step's "
        "tokens: the memory a GPU would need), and as many as fit the packed step's tokens when every "
        "sample may be L long (what a fixed memory budget allows). 2 DataLoader workers, rates after "
        f"the first batch, medians of {args.rounds} run(s) of {args.seconds:g} s, each in a fresh process."
    )
    from data import write_section

    write_section(args.results, "packing", report(args, results, plans, mean_len, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
