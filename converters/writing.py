"""Writing the samples, the skip report and the summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tqdm import tqdm

import mmloader
from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.errors import MMLoaderError
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage import format_for, is_url
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)

from .items import ConversionError, Item, ItemError, Skipped, UsageError


# -- writing, report, summary ------------------------------------------------------------------
@dataclass
class Summary:
    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    report: str | None = None
    notes: list[str] = field(default_factory=list)
    part: tuple[int, int] | None = None  # --part I/N: which part this was
    dataset: str | None = None  # where this process wrote (the part's dataset under --part)
    already: str | None = None  # --part: the manifest of a part converted before (nothing done now)

    def text(self, dst: str) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        rate = self.written / self.seconds if self.seconds else 0
        if self.already:
            return "\n".join(
                [
                    f"part {self.part[0]}/{self.part[1]} of {dst} is already converted ({self.already}: "
                    f"{self.written} samples, {skipped} skipped): nothing to do"
                ]
                + [f"note: {n}" for n in self.notes]
            )
        where = f"part {self.part[0]}/{self.part[1]} of {dst} ({self.dataset})" if self.part else dst
        lines = [
            f"wrote {self.written} samples ({self.bytes / 1e6:.1f} MB) to {where} in {self.seconds:.1f} s "
            f"({rate:.0f} samples/s, {self.bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s)",
            f"skipped {skipped}" + (f" ({why})" if why else ""),
        ]
        if self.report:
            lines.append(f"skipped samples and reasons: {self.report}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _reason_class(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0]


def report_path_for(dst: str) -> Path:
    if is_url(dst):  # the report stays local, in the working directory
        return Path.cwd() / (dst.rstrip("/").rsplit("/", 1)[-1] + ".skipped.tsv")
    return Path(str(Path(dst).absolute()) + ".skipped.tsv")


def _tsv(text: str) -> str:
    """One TSV cell: tabs, newlines and backslashes escaped (file names may hold any of them)."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _raise_policy(error: str, dst: str) -> ConversionError:
    return ConversionError(
        f"{error} -- stopped at the first bad sample, nothing written "
        f"(--on-error skip would skip it and list it in {report_path_for(dst).name})"
    )


def write_samples(
    samples: Iterable[tuple[Item, dict | None, ItemError | None]],
    dst: str,
    args,
    metadata: dict | None = None,
    total: int | None = None,
    notes: Sequence[str] = (),
    unique_keys: bool = False,
) -> Summary:
    """Write loaded samples; apply ``--on-error``; progress bar; atomic output; skip report.

    ``dst`` is where this process writes: ``args.dst``, or its part's dataset under ``--part``
    (then the output format is ``args.dst``'s, a published part without a manifest is replaced,
    and a part may end up empty: only the merge fails when no sample at all was converted).
    ``unique_keys``: the keys are unique by construction (row numbers): no set of seen keys is
    kept (it would grow with the input)."""
    summary = Summary(notes=list(notes))
    noted = len(notes)  # notes the samples' source adds while they are read are said too
    start = time.perf_counter()
    part = getattr(args, "_part_dataset", None) == dst
    fmt = format_for(args.dst, args.format)
    shard_opts = {"shard_size": args.shard_size, "shard_bytes": args.shard_bytes} if fmt == "tar" else {}
    upload_opts = {"progress": not args.quiet} if is_url(dst) else {}  # the "uploading to URL" bar
    writer = mmloader.writer_for(
        dst, fmt, overwrite=args.overwrite or part, metadata=metadata, **shard_opts, **upload_opts
    )
    report_path = report_path_for(dst)
    skipped_rows: list[str] = []
    bar = tqdm(total=total, desc=f"converting -> {Path(dst).name}", unit="sample", disable=args.quiet, smoothing=0.1)
    seen_keys: set[str] = set()

    def skip(key: str, where: str, reason: str) -> None:
        cls = _reason_class(reason)
        summary.skipped[cls] = summary.skipped.get(cls, 0) + 1
        skipped_rows.append(f"{_tsv(key)}\t{_tsv(where)}\t{_tsv(reason)}")
        bar.update(1)

    try:
        for item, sample, error in samples:
            if error is None and not unique_keys and item.key in seen_keys:
                error = ItemError(f"duplicate key {item.key!r}", item.where or item.key)
            if error is not None:
                if args.on_error == "raise" and not isinstance(error, Skipped):
                    raise _raise_policy(str(error), dst)
                skip(item.key, error.path, error.reason)
                continue
            if not unique_keys:
                seen_keys.add(item.key)
            try:
                writer.write(sample)
            except MMLoaderError as e:  # e.g. a key the format cannot hold
                if args.on_error == "raise":
                    raise _raise_policy(f"{item.where or item.key}: {e}", dst) from None
                skip(item.key, item.where, f"rejected by writer: {e}")
                continue
            summary.written += 1
            summary.bytes += sum(
                len(v) if isinstance(v, (bytes, str)) else 8 for k, v in sample.items() if not k.startswith("__")
            )
            bar.update(1)
            if summary.written % 256 == 0:
                bar.set_postfix_str(f"{summary.bytes / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
        if summary.written == 0 and skipped_rows and not part:
            report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
            raise ConversionError(
                f"no sample could be converted: all {len(skipped_rows)} were skipped "
                f"(reasons in {report_path}); nothing written"
            )
        writer.close()
    except BaseException:
        writer.abort()
        bar.close()
        raise
    bar.close()
    summary.notes += list(notes)[noted:]
    summary.dataset = str(dst)
    if report_path.exists():
        report_path.unlink()
    if skipped_rows:
        report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
        summary.report = str(report_path)
    summary.seconds = time.perf_counter() - start
    return summary


def check_required_fields(require: Sequence[str], items: Sequence[Item], layout_fields: Iterable[str] = ()) -> None:
    """``--require F`` for a field that no sample has is a mistake in the option, not bad data."""
    if not require:
        return
    found = set(layout_fields)
    for it in items:
        found.update(it.files)
        found.update(it.values)
    if "" in found:  # images whose field only their header will tell
        found.discard("")
        found.update(IMAGE_EXTENSIONS)
    unknown = [f for f in require if f not in found]
    if unknown:
        raise UsageError(
            f"--require {','.join(unknown)}: no sample has {'this field' if len(unknown) == 1 else 'these fields'} "
            f"(fields found: {', '.join(sorted(found)) or 'none'})"
        )
