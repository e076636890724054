"""What every converter shares: options, parallel ordered loading, error policy, report, summary."""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from PIL import Image
from tqdm import tqdm

import mmloader
from mmloader.errors import MMLoaderError

from mmloader.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage import format_for


class ConversionError(Exception):
    """The conversion cannot go on (bad paths, bad options, --on-error fail); nothing is left behind."""


class ItemError(Exception):
    """One raw sample cannot be converted; ``path`` names the offending file."""

    def __init__(self, reason: str, path: str | os.PathLike = ""):
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason, self.path = reason, str(path)


class Skipped(ItemError):
    """Left out by a policy the user chose (e.g. blank lines): reported, never a failure."""


@dataclass
class Item:
    """One sample to convert: its key and, per field, a file path or an inline value."""
    key: str
    files: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    error: str | None = None  # a problem found while listing the raw folder


@dataclass
class Options:
    format: str | None = None
    shard_size: int | None = None
    shard_bytes: int | None = None
    resize_max: int | None = None
    quality: int = 90
    check_decode: bool = False
    require: tuple[str, ...] = ()
    max_pixels: int = 150_000_000


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the raw folder (or file)")
    p.add_argument("dst", help="output: NAME.lmdb for LMDB, otherwise a shard directory")
    p.add_argument("--format", choices=("lmdb", "tar"), help="output format (default from DST's suffix)")
    p.add_argument("--workers", type=int, default=1, help="parallel loading/encoding processes; "
                   "the output is identical to --workers 1")
    p.add_argument("--shard-size", type=int, default=10_000, help="tar: max samples per shard")
    p.add_argument("--shard-bytes", type=float, default=1e9, help="tar: max bytes per shard")
    p.add_argument("--shuffle-seed", type=int, default=None,
                   help="write samples in a seeded random order (default: sorted order)")
    p.add_argument("--resize-max", type=int, default=None, metavar="PX",
                   help="re-encode images so the longest side is at most PX (default: keep bytes)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for --resize-max")
    p.add_argument("--part", default=None, metavar="I/N", help="convert only the I-th of N slices")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="skip (default: report in DST.skipped.tsv) or fail at the first bad sample")
    p.add_argument("--check-decode", action="store_true", help="fully decode images (default: header check)")
    p.add_argument("--require", default="", help="comma-separated fields every sample must have")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def layout_parser(layout: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``mmloader convert LAYOUT``, with the options every layout has."""
    p = argparse.ArgumentParser(prog=f"mmloader convert {layout}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    return p


def parse_part(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConversionError(f"--part {text!r}: expected I/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConversionError(f"--part {text!r}: need 0 <= I < N")
    return i, n


def options_from(args) -> Options:
    return Options(format=args.format, shard_size=args.shard_size, shard_bytes=int(args.shard_bytes),
                   resize_max=args.resize_max, quality=args.quality, check_decode=args.check_decode,
                   require=tuple(f for f in args.require.split(",") if f))


def check_paths(src: str, dst: str, overwrite: bool) -> None:
    """Fail early, with a clear word, on a missing SRC, an existing DST or an unwritable place."""
    if not os.path.exists(src):
        raise ConversionError(f"source {src} does not exist")
    if os.path.exists(dst) and not overwrite:
        raise ConversionError(f"{dst} already exists; pass --overwrite to replace it")
    parent = Path(dst).absolute().parent
    try:  # a real write probe: permission bits alone say nothing for root or read-only mounts
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ConversionError(f"cannot write to {parent}: {e.strerror or e}") from None


def select(items: list, shuffle_seed: int | None, part: tuple[int, int] | None) -> list:
    """Seeded order, then the I-th contiguous slice of N: merging parts 0..N-1 gives the whole."""
    if shuffle_seed is not None:
        perm = np.random.default_rng(shuffle_seed).permutation(len(items))
        items = [items[i] for i in perm]
    if part is not None:
        i, n = part
        items = items[i * len(items) // n:(i + 1) * len(items) // n]
    return items


# -- loading one item (runs in worker processes) ------------------------------
def _image_bytes(data: bytes, path: str, opts: Options) -> tuple[bytes, str | None]:
    """Validate (and optionally re-encode) an image; returns (bytes, new extension or None)."""
    from mmloader.imageinfo import check_pixels, probe
    try:
        info = probe(data)
        check_pixels(info, opts.max_pixels)
    except MMLoaderError as e:
        raise ItemError(f"bad image: {e}", path) from None
    if not (opts.check_decode or opts.resize_max):
        return data, None
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if opts.resize_max and max(im.size) > opts.resize_max:
                im.thumbnail((opts.resize_max, opts.resize_max), Image.BICUBIC)
                out = io.BytesIO()
                if im.format == "PNG" or im.mode in ("RGBA", "LA", "P"):
                    im.save(out, "PNG", optimize=False)
                    return out.getvalue(), "png"
                im.convert("RGB").save(out, "JPEG", quality=opts.quality)
                return out.getvalue(), "jpg"
    except Exception as e:
        raise ItemError(f"image does not decode: {e}", path) from None
    return data, None


def check_field(field_name: str, data: bytes, path: str) -> None:
    ext = field_name.rsplit(".", 1)[-1].lower()
    if ext == "txt":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ItemError(f"text is not UTF-8 ({e.reason} at byte {e.start})", path) from None
    elif ext == "cls":
        try:
            int(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise ItemError(f"label {data[:20]!r} is not an integer", path) from None
    elif ext == "json":
        try:
            json.loads(data)
        except ValueError as e:
            raise ItemError(f"not valid JSON: {e}", path) from None


def load_item(item: Item, opts: Options) -> dict[str, Any]:
    """Read, validate and (optionally) re-encode one sample. Raises :class:`ItemError`."""
    from mmloader.storage.keys import validate_key
    if item.error:
        raise ItemError(item.error, item.where or item.key)
    try:
        validate_key(item.key)
    except MMLoaderError as e:
        raise ItemError(f"illegal key: {e}", item.where or item.key) from None
    missing = [f for f in opts.require if f not in item.files and f not in item.values]
    if missing:
        raise ItemError(f"missing required field(s) {', '.join(missing)}", item.where or item.key)
    sample: dict[str, Any] = {"__key__": item.key}
    for fname, path in item.files.items():
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ItemError(f"unreadable: {e.strerror}", path) from None
        if not data:
            raise ItemError("empty file", path)
        if fname.lower() in IMAGE_EXTENSIONS:
            data, new_ext = _image_bytes(data, path, opts)
            if new_ext and new_ext != fname:
                fname = new_ext
        else:
            check_field(fname, data, path)
        sample[fname] = data
    for fname, value in item.values.items():
        sample[fname] = value
    return sample


def _load_safe(args: tuple[Item, Options]) -> tuple[Item, dict | None, ItemError | None]:
    item, opts = args
    try:
        return item, load_item(item, opts), None
    except ItemError as e:
        return item, None, e


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up


def ordered_map(fn: Callable, jobs: Iterable, workers: int, chunksize: int = 64,
                processes: bool = False) -> Iterator:
    """``map`` over ``workers`` threads (or processes), results in input order (so the output
    never depends on the worker count).

    Threads by default: file reads, zlib, Pillow's decoders and encoders release the GIL, and a
    thread hands its 20 KB sample to the writer without pickling it through a pipe (measured
    here: processes made a pass-through conversion slower than one worker). At most
    ``workers * 64`` results wait in memory.
    """
    if workers <= 1:
        yield from map(fn, jobs)
        return
    if processes:
        ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
        with ctx.Pool(workers, initializer=_init_worker) as pool:
            yield from pool.imap(fn, jobs, chunksize=chunksize)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    from itertools import islice
    jobs = iter(jobs)
    run_chunk = lambda chunk: [fn(job) for job in chunk]  # one task per chunk: fewer GIL hand-offs
    with ThreadPoolExecutor(workers, thread_name_prefix="convert") as ex:
        window: deque = deque()
        while chunk := list(islice(jobs, chunksize)):
            window.append(ex.submit(run_chunk, chunk))
            if len(window) >= workers * 4:
                yield from window.popleft().result()
        while window:
            yield from window.popleft().result()


@dataclass
class Summary:
    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    report: str | None = None

    def text(self, dst: str) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        rate = self.written / self.seconds if self.seconds else 0
        lines = [f"wrote {self.written} samples ({self.bytes / 1e6:.1f} MB) to {dst} in {self.seconds:.1f} s "
                 f"({rate:.0f} samples/s, {self.bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s)",
                 f"skipped {skipped}" + (f" ({why})" if why else "")]
        if self.report:
            lines.append(f"skipped samples and reasons: {self.report}")
        return "\n".join(lines)


def _reason_class(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0]


def write_samples(samples: Iterable[tuple[Item, dict | None, ItemError | None]], dst: str, args,
                  metadata: dict | None = None, total: int | None = None) -> Summary:
    """Write loaded samples; apply ``--on-error``; progress bar; atomic output; skip report."""
    summary = Summary()
    start = time.perf_counter()
    fmt = format_for(dst, args.format)
    shard_opts = {"shard_size": args.shard_size, "shard_bytes": int(args.shard_bytes)} if fmt == "tar" else {}
    writer = mmloader.writer_for(dst, fmt, overwrite=args.overwrite, metadata=metadata, **shard_opts)
    report_path = Path(str(Path(dst).absolute()) + ".skipped.tsv")
    skipped_rows: list[str] = []
    bar = tqdm(total=total, desc=f"converting -> {Path(dst).name}", unit="sample", disable=args.quiet,
               smoothing=0.1)
    seen_keys: set[str] = set()
    try:
        for item, sample, error in samples:
            if error is None and item.key in seen_keys:
                error = ItemError(f"duplicate key {item.key!r}", item.where or item.key)
            if error is not None:
                if args.on_error == "fail" and not isinstance(error, Skipped):
                    raise ConversionError(f"{error} (--on-error fail: nothing written)")
                cls = _reason_class(error.reason)
                summary.skipped[cls] = summary.skipped.get(cls, 0) + 1
                skipped_rows.append(f"{item.key}\t{error.path}\t{error.reason}")
                bar.update(1)
                continue
            seen_keys.add(item.key)
            try:
                writer.write(sample)
            except MMLoaderError as e:  # e.g. a key the format cannot hold
                if args.on_error == "fail":
                    raise ConversionError(f"{item.where or item.key}: {e} (--on-error fail: nothing written)")
                summary.skipped["rejected by writer"] = summary.skipped.get("rejected by writer", 0) + 1
                skipped_rows.append(f"{item.key}\t{item.where}\t{e}")
                bar.update(1)
                continue
            summary.written += 1
            summary.bytes += sum(len(v) if isinstance(v, (bytes, str)) else 8 for k, v in sample.items()
                                 if not k.startswith("__"))
            bar.update(1)
            if summary.written % 256 == 0:
                bar.set_postfix_str(f"{summary.bytes / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
        writer.close()
    except BaseException:
        writer.abort()
        bar.close()
        raise
    bar.close()
    if report_path.exists():
        report_path.unlink()
    if skipped_rows:
        report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
        summary.report = str(report_path)
    summary.seconds = time.perf_counter() - start
    return summary


def run(build_items: Callable[[argparse.Namespace], tuple[list[Item], dict]], parser: argparse.ArgumentParser,
        argv: Sequence[str] | None) -> int:
    """Parse, enumerate items, load them in order (in parallel), write, summarise."""
    args = parser.parse_args(argv)

    def convert() -> Summary:
        check_paths(args.src, args.dst, args.overwrite)
        items, metadata = build_items(args)
        items = select(items, args.shuffle_seed, parse_part(args.part))
        opts = options_from(args)
        loaded = ordered_map(_load_safe, ((it, opts) for it in items), args.workers)
        return write_samples(loaded, args.dst, args, metadata, total=len(items))
    return report_errors(convert, args.dst)


def report_errors(convert: Callable[[], Summary], dst: str) -> int:
    """Run a conversion; print its summary, or a one-line error and a non-zero exit code."""
    try:
        summary = convert()
    except KeyboardInterrupt:
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    except (ConversionError, MMLoaderError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(summary.text(dst))
    return 0
