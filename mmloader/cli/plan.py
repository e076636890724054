"""``mmloader plan``: an experiment config's resolved epoch plan, as text."""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np


def describe_plan(
    config: str | os.PathLike | Mapping, world: int = 1, workers: int = 1, preview: int = 2, epochs: int | None = None
) -> str:
    """The resolved plan of a config as text (what ``mmloader plan`` prints).

    Args:
        config: an experiment config (a file or a dict).
        world: ranks.
        workers: DataLoader workers per rank.
        preview: samples shown per source.
        epochs: epochs the schedule's totals cover (default: until its last point).

    >>> print(describe_plan("samples/configs/mixed.yaml", world=2))    # doctest: +SKIP
    """
    from ..loading.config import from_config  # (torch)
    from ..storage.remote.redaction import redact

    stream = from_config(config)
    stream.set_world(0, world)
    rows = stream.plan(0)
    packed = stream.packer is not None
    plan = rows.plan if packed else rows  # the samples (packed: the rows hold them)
    g = stream.geometry()
    bs = stream.batch_size
    mix = stream.mix
    if mix is not None:
        names, datasets, table = mix.names, mix.datasets, mix.summary(bs)
        head = (
            f"epoch plan: {len(plan)} samples from {len(datasets)} source(s), mode {mix.mode}, "
            f"batch composition {mix.composition}"
        )
    else:
        names, datasets = ["source"], stream.datasets
        table = [
            {
                "name": names[0],
                "size": len(datasets[0]),
                "per_epoch": len(plan),
                "proportion": 1.0,
                "repeats": len(plan) / max(len(datasets[0]), 1),
            }
        ]
        head = f"epoch plan: {len(plan)} samples from 1 source (no mix)"
    lines = [head, f"  {'source':<16} {'size':>9} {'per epoch':>10} {'share':>7} {'repeats':>8}  modalities"]
    for row, ds in zip(table, datasets):
        lines.append(
            f"  {row['name']:<16} {row['size']:>9} {row['per_epoch']:>10} {row['proportion']:>7.1%} "
            f"{row['repeats']:>8.2f}  {', '.join(ds.modalities)}"
        )
    for name, ds in zip(names, datasets):
        steps = getattr(ds, "report", {}).get("select")
        if steps:
            total = steps["samples"]
            kept = ", ".join(f"{step} -> {n}" for step, n in steps.items() if step != "samples")
            filters = [st["where"] for st in ds.selection["steps"] if st.get("where")]
            lines.append(
                f"  selection of {name}: {len(ds)} of {total} samples pass ({kept})"
                + (f"; filter {' and then '.join(map(repr, filters))}" if filters else "")
            )
    if mix is not None and mix.schedule is not None:
        lines += _schedule_lines(mix, bs, epochs)
    if packed:
        lines += _packing_lines(rows, int(bs or 1))
    unit = "rows" if packed else "samples"
    lines.append(
        f"world {world} x {workers} workers: {g['samples_per_rank']} {unit} per rank"
        + (f" = {g['batches_per_rank']} batches of {bs}{' rows' if packed else ''}" if bs else "")
        + f"; padding {g['padding']} {unit}; every rank equal"
    )
    if preview:
        lines.append("preview:")
        for name, ds in zip(names, datasets):
            for i in range(min(preview, len(ds))):
                try:
                    s = ds[i]
                    desc = ", ".join(f"{k}={_short(v)}" for k, v in s.items() if k != "__key__")
                    lines.append(f"  {name}[{s['__key__']}]: {desc}")
                except Exception as e:
                    lines.append(f"  {name}[{i}]: unreadable: {redact(str(e))}")
    return "\n".join(lines)


def _packing_lines(rows: Any, batch_size: int) -> list[str]:
    """How full the packed rows of epoch 0 are, against padding each batch to its longest."""
    lengths = rows.lengths
    per_row = np.diff(rows.offsets)
    n = len(lengths)
    batches = -(-n // batch_size)
    longest = np.maximum.reduceat(lengths, np.arange(0, n, batch_size)) if n else np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.r_[np.arange(0, n, batch_size), n])
    padded = float(lengths.sum()) / max(float((longest * sizes).sum()), 1.0)
    return [
        f"packing: {n} samples into {len(rows)} rows of {rows.capacity} tokens, "
        f"{per_row.min() if len(per_row) else 0}-{per_row.max() if len(per_row) else 0} samples a row "
        f"(mean {per_row.mean() if len(per_row) else 0:.1f})",
        f"  token utilisation {rows.utilisation():.1%} (real tokens / rows x {rows.capacity}); "
        f"{batches} batches of {batch_size} samples padded to their longest would be {padded:.1%} full",
    ]


SHOWN_EPOCHS = 40  # rows of a schedule's table; a longer one shows its start and its end


def _schedule_lines(mix: Any, batch_size: int | None, epochs: int | None) -> list[str]:
    """Per-source samples of each epoch under the mix's schedule, and the totals over the
    epochs it covers (``epochs``, default: up to the epoch holding its last point)."""
    from ..planning.schedule import phase_quotas

    schedule, unit = mix.schedule, mix.unit(batch_size)
    last = float(schedule.at[-1]) if schedule.by == "epoch" else float(schedule.at[-1]) / mix.epoch_size
    covered = epochs if epochs is not None else int(last) + 1
    lines = [
        f"schedule: weights by {schedule.by}, {schedule.interpolate}; samples per source and epoch:",
        "  " + f"{'epoch':<7}" + "".join(f"{n:>12}" for n in mix.names),
    ]
    totals = np.zeros(len(mix.names), dtype=np.int64)
    for e in range(covered):
        quotas = phase_quotas(schedule, e, mix.epoch_size, unit).sum(axis=0)
        totals += quotas
        if covered <= SHOWN_EPOCHS or e < SHOWN_EPOCHS // 2 or e >= covered - SHOWN_EPOCHS // 4:
            lines.append("  " + f"{e:<7}" + "".join(f"{int(q):>12}" for q in quotas))
        elif e == SHOWN_EPOCHS // 2:
            lines.append(f"  ...    ({covered - SHOWN_EPOCHS // 2 - SHOWN_EPOCHS // 4} epochs not shown)")
    lines.append("  " + f"{'total':<7}" + "".join(f"{int(t):>12}" for t in totals) + f"   (epochs 0-{covered - 1})")
    if covered > last:
        given = mix.given_schedule.weights[-1].tolist()  # (the user's: a token schedule plans by samples)
        lines.append(f"  (epochs from {covered} keep the last point's weights: {given})")
    else:
        lines.append(f"  (the schedule goes on to epoch {last:g}: --epochs covers more)")
    return lines


def _short(v: Any) -> str:
    if hasattr(v, "shape"):
        return f"{type(v).__name__}{tuple(v.shape)}"
    text = repr(v)
    return text if len(text) < 50 else text[:47] + "..."


# -- the subcommand ------------------------------------------------------------------------------
HELP = "print an experiment config's resolved epoch plan"
EXAMPLES = [
    "mmloader plan samples/configs/mixed.yaml --world 8 --workers 4",
    "mmloader plan samples/configs/mixed.yaml --world 8 --step 1200 --rank 3",
    "mmloader plan samples/configs/mixed.yaml --world 8 --find 000123",
]


def add_arguments(s) -> None:
    """The options of ``mmloader plan``."""
    from .args import int_at_least

    s.add_argument("config", help="an experiment config (YAML, or JSON with 'sources')")
    s.add_argument("--world", type=int_at_least(1), default=1, help="ranks (default 1)")
    s.add_argument("--workers", type=int_at_least(0), default=1, help="workers per rank (default 1)")
    s.add_argument(
        "--epochs",
        type=int_at_least(1),
        default=None,
        help="epochs a mix schedule's totals cover (default: all it sets)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar (fetching a dataset on object storage)")
    s.add_argument(
        "--step", type=int_at_least(0), help="print the keys (and sources) of this step instead: the data ledger"
    )
    s.add_argument("--rank", type=int_at_least(0), help="with --step: this rank only (default: every rank)")
    s.add_argument("--epoch", type=int_at_least(0), default=0, help="with --step or --find: the epoch (default 0)")
    s.add_argument("--find", metavar="KEY", help="print the (rank, step) of each batch of the epoch holding KEY")
    s.add_argument(
        "--quality",
        action="store_true",
        help="print how the epoch's plan mixes: source shares per window, shard spread and runs, a verdict",
    )
    s.add_argument("--window", type=int_at_least(1), default=16, help="with --quality: batches per window (default 16)")


def run(args) -> int:
    """Print the plan, or what the ledger says of a step or a key."""
    if args.step is None and args.find is None and not args.quality:
        print(describe_plan(args.config, world=args.world, workers=args.workers, epochs=args.epochs))
        return 0
    from ..loading.config import from_config  # (torch)

    stream = from_config(args.config)
    stream.set_world(0, args.world)
    if args.find is not None:
        print(describe_find(stream, args.find, args.epoch, args.world))
    if args.step is not None:
        print(describe_step(stream, args.step, args.rank, args.epoch))
    if args.quality:
        print(describe_quality(stream.quality(args.epoch, args.window), args.window))
        if stream.packer is not None and stream.mix is not None:
            print(describe_token_shares(stream, args.epoch))
    return 0


def describe_find(stream: Any, key: str, epoch: int, world: int) -> str:
    """Where a key comes in an epoch (``mmloader plan --find``): per source when several hold it."""
    from ..loading.ledger import sources_holding

    holders = sources_holding(stream, key)
    if not holders:
        return f"{key}: no source of this stream holds it"
    lines = []
    for source in holders:
        found = stream.steps_of(key, epoch=epoch, source=source)
        ranks = sorted({r for r, _s in found})
        where = "; ".join(f"rank {r} at step {', '.join(str(s) for q, s in found if q == r)}" for r in ranks)
        of = f" (source {source!r})" if len(holders) > 1 else ""
        lines.append(f"{key}{of}, epoch {epoch} on {world} rank(s): {where or 'not in this epoch'}")
    return "\n".join(lines)


def describe_token_shares(stream: Any, epoch: int) -> str:
    """A packed mix's realised shares of tokens, beside what its weights ask (``--quality``)."""
    shares = stream.token_shares(epoch)
    line = "  token shares: " + ", ".join(f"{n} {100 * v:.1f}%" for n, v in shares.items())
    mix = stream.mix
    if mix.schedule is None:
        total = sum(mix.weights) or 1.0
        asked = ", ".join(f"{n} {100 * w / total:.1f}%" for n, w in zip(mix.names, mix.weights))
        line += f" (weights, in {mix.weights_by}: {asked})"
    return line


def describe_quality(q: Any, window_batches: int) -> str:
    """The mixing measures of a plan as text (``mmloader plan --quality``)."""
    return "\n".join(
        [
            f"plan quality ({window_batches} batches = {q.window} samples a window):",
            f"  source share drift: max {100 * q.drift_max:.1f} points, p99 {100 * q.drift_p99:.1f} (from the weights)",
            f"  shard spread: {q.spread:.2f} of uniform (1: a shard's samples spread over the epoch; 0: one clump)",
            f"  shard runs: consecutive samples share a shard {q.runs:.2f}x as often as by chance",
            f"  {q.verdict()}",
        ]
    )


def describe_step(stream: Any, step: int, rank: int | None = None, epoch: int = 0) -> str:
    """The keys (and, for a mix, sources) of ``step`` of ``epoch``, per rank, as text."""
    ranks = [rank] if rank is not None else range(stream.where()[1])
    lines = [f"epoch {epoch}, step {step}:"]
    for r in ranks:
        keys = stream.keys_at(step, rank=r, epoch=epoch)
        shown = [" + ".join(k) if isinstance(k, list) else k for k in keys]  # a packed row: its samples
        line = f"  rank {r}: {' '.join(shown)}"
        if stream.mix is not None:  # samples per source (a packed row's samples each counted)
            counts: dict[str, int] = {}
            for row in stream.sources_at(step, rank=r, epoch=epoch):
                for name in row if isinstance(row, list) else [row]:
                    counts[name] = counts.get(name, 0) + 1
            line += "  (" + ", ".join(f"{n}: {c}" for n, c in counts.items()) + ")"
        lines.append(line)
    return "\n".join(lines)
