"""The converters' command-line options (shared by every layout) and their values."""

from __future__ import annotations

import argparse
import re
from typing import Sequence

from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)
from mmloader.storage.tar.writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE

from .items import DEFAULT_MAX_FILE_BYTES, ON_ERROR_HELP, Options

#: Options that change how a conversion runs, not what it writes: left out of the fingerprint
#: and of the options a dataset records.
RUN_OPTIONS = {
    "src",
    "dst",
    "workers",
    "quiet",
    "overwrite",
    "part",
    "engine",
    "parts",
    "ray_address",
    "retries",
    "keep_parts",
}
#: Options that name local files: a dataset records a fingerprint of what they name, never the
#: path (unless ``--record-source``).
PATH_OPTIONS = {"tokenizer", "images"}


# -- option values -----------------------------------------------------------------------------
def parse_part(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected I/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= I < N")
    return i, n


def _part_arg(text: str) -> str:
    parse_part(text)
    return text


def require_list(text: str) -> tuple[str, ...]:
    """``--require jpg,txt`` -> field names, image spellings folded (``JPEG`` -> ``jpg``)."""
    fields = tuple(dict.fromkeys(canonical_extension(f.strip()) for f in text.split(",") if f.strip()))
    if not fields:
        raise argparse.ArgumentTypeError(f"{text!r} names no field (e.g. --require jpg,txt)")
    for f in fields:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", f):
            raise argparse.ArgumentTypeError(
                f"{f!r} is not a field name (fields are file extensions such as jpg, txt, json, cls)"
            )
    return fields


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the raw folder (or file)")
    p.add_argument("dst", help="output: NAME.lmdb for LMDB, otherwise a shard directory")
    p.add_argument(
        "--format", choices=("lmdb", "tar"), help="output format (default: lmdb for a .lmdb suffix, otherwise tar)"
    )
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        default=1,
        help="parallel loading threads; the output is identical to --workers 1 (default 1)",
    )
    p.add_argument(
        "--shard-size",
        type=int_at_least(1),
        default=DEFAULT_SHARD_SIZE,
        metavar="N",
        help=f"tar: at most N samples per shard (default {DEFAULT_SHARD_SIZE:,})",
    )
    p.add_argument(
        "--shard-bytes",
        type=positive_size,
        default=DEFAULT_SHARD_BYTES,
        metavar="SIZE",
        help="tar: at most SIZE bytes per shard: 1G, 512M, 64K (powers of 1024), 1GB (of 1000), "
        "1e9 or a plain integer (default 1G)",
    )
    p.add_argument(
        "--shuffle-seed",
        type=int_at_least(0),
        default=None,
        metavar="SEED",
        help="write samples in a seeded random order (default: sorted order)",
    )
    p.add_argument(
        "--resize-max",
        type=int_at_least(1),
        default=None,
        metavar="PX",
        help="re-encode images so the longest side is at most PX (default: keep the bytes)",
    )
    p.add_argument(
        "--quality", type=int_at_least(1, 100), default=90, help="JPEG quality for --resize-max (1-100, default 90)"
    )
    p.add_argument(
        "--part",
        type=_part_arg,
        default=None,
        metavar="I/N",
        help="convert only the I-th of N "
        "deterministic slices (0 <= I < N) into DST.parts/, publishing a part manifest last; a "
        "finished part is not converted again; `mmloader merge DST` joins the parts",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local (default): this "
        "process; ray: convert --parts N parts as Ray tasks on the cluster named by --ray-address "
        "or RAY_ADDRESS (else a local Ray), retried on failure, then merge them "
        "(pip install 'mmloader[ray]')",
    )
    p.add_argument(
        "--parts",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="--engine ray: the number of parts (default: the cluster's CPUs divided by --workers)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to use "
        "(default: $RAY_ADDRESS, else a cluster started on this machine with `ray start`, else a new "
        "local Ray)",
    )
    p.add_argument(
        "--retries",
        type=int_at_least(0),
        default=3,
        metavar="K",
        help="--engine ray: times Ray re-runs a part whose worker died (default 3)",
    )
    p.add_argument("--keep-parts", action="store_true", help="--engine ray: keep DST.parts/ after the merge")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)
    p.add_argument(
        "--max-file-bytes",
        type=positive_size,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="SIZE",
        help="refuse a file larger than SIZE before reading it, as a bad sample (default 256M)",
    )
    p.add_argument(
        "--check-decode",
        action="store_true",
        help="fully decode images, videos and audio (default: "
        "header check; for media: duration, streams and codec from the header)",
    )
    p.add_argument(
        "--max-seconds",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="video/audio longer than S seconds is a bad sample (with --transcode: trimmed to S)",
    )
    p.add_argument(
        "--transcode",
        type=_transcode_spec,
        default=None,
        metavar="SPEC",
        help="re-encode media once: fps=N,size=PX (shorter side),sample_rate=HZ,crf=Q; video -> H.264 "
        "mp4 (AAC audio track), audio -> FLAC (default: keep the bytes)",
    )
    p.add_argument(
        "--require",
        type=require_list,
        default=(),
        metavar="FIELDS",
        help="comma-separated fields every sample must have, e.g. jpg,txt (a sample without one "
        "is a bad sample; a field no sample has is a usage error)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DST if it is an existing dataset")
    p.add_argument(
        "--record-source",
        action="store_true",
        help="also record the absolute path of SRC (and of files options name) in the dataset's "
        "metadata (default: the layout, file counts, a fingerprint of the input and the options, "
        "never a local path)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be a number of seconds more than 0")
    return value


def _transcode_spec(text: str):
    from mmloader.media.mediainfo import Transcode  # torch-free, and PyAV is imported only when used

    try:
        return Transcode.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def layout_parser(layout: str, doc: str | None, examples: Sequence[str]) -> argparse.ArgumentParser:
    """The argument parser of ``mmloader convert LAYOUT``, with the options every layout has."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    p = argparse.ArgumentParser(
        prog=f"mmloader convert {layout}",
        description=doc,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(p)
    return p


def options_from(args) -> Options:
    return Options(
        format=args.format,
        resize_max=args.resize_max,
        quality=args.quality,
        check_decode=args.check_decode,
        require=tuple(args.require),
        max_file_bytes=args.max_file_bytes,
        max_seconds=getattr(args, "max_seconds", None),
        transcode=getattr(args, "transcode", None),
    )
