"""``mmloader merge``: the parts of a conversion (``convert --part I/N``) into one dataset, or
datasets concatenated."""

from __future__ import annotations

HELP = (
    "join the parts of a conversion (`convert --part I/N`) into one dataset, byte-identical "
    "to converting it in one process (no re-encoding); or concatenate datasets"
)
EXAMPLES = [
    "mmloader merge out/                      # the parts in out.parts/ -> out/, then removes out.parts/",
    "mmloader merge out.parts/ out/ --verify  # re-hash every part file against its manifest first",
    "mmloader merge a.lmdb b.lmdb all.lmdb    # plain datasets: concatenated in order",
    "mmloader merge out.parts/ s3://bucket/out/  # merged locally, uploaded, manifest last",
]


def add_arguments(s) -> None:
    """The options of ``mmloader merge``."""
    s.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="a parts directory (DST.parts/, the default), part datasets, or plain datasets to concatenate in order",
    )
    s.add_argument("dst", help="the dataset to write")
    s.add_argument(
        "--format",
        choices=("lmdb", "tar"),
        help="plain datasets: output format (default: tar when every source is a shard directory)",
    )
    s.add_argument("--overwrite", action="store_true", help="replace DST if it is an existing dataset")
    s.add_argument(
        "--keep-parts",
        action="store_true",
        help="keep DST.parts/ after merging (it is removed when merged from there by default)",
    )
    s.add_argument(
        "--verify",
        action="store_true",
        help="re-hash every part file against its part manifest before merging (default: sizes are checked)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    """Merge, and say what was kept, rewritten and skipped."""
    from pathlib import Path

    from ..storage import is_url
    from ..storage.remote.redaction import redact, redact_url
    from ..storage.write.merge import find_parts, merge, merge_parts, parts_dir_for

    if not args.sources and is_url(args.dst):
        dst = redact_url(args.dst)
        raise ValueError(f"{dst}: name the local parts to merge (e.g. `mmloader merge out.parts/ {dst}`)")
    sources = args.sources or [str(parts_dir_for(args.dst))]
    if not args.sources and not Path(sources[0]).is_dir():
        raise FileNotFoundError(
            f"no parts to merge: {sources[0]} does not exist (convert with --part I/N "
            "first, or name the datasets to join)"
        )
    if find_parts(sources) is None:  # plain datasets: concatenated, shards kept as they are
        if args.keep_parts or args.verify:
            raise ValueError("--keep-parts/--verify apply to parts written by `convert --part I/N`")
        out = merge(sources, args.dst, format=args.format, overwrite=args.overwrite, progress=not args.quiet)
        print(redact(f"merged {len(sources)} datasets -> {out}"))
        return 0
    if args.format:
        raise ValueError("--format: parts are merged in the format they were converted to")
    result = merge_parts(
        sources,
        args.dst,
        overwrite=args.overwrite,
        progress=not args.quiet,
        keep_parts=args.keep_parts or bool(args.sources),
        rehash=args.verify,
    )
    shards = (
        f"; shards: {result.kept_shards} kept as they were, {result.written_shards} rewritten"
        if result.kept_shards or result.written_shards
        else ""
    )
    print(
        redact(
            f"merged {result.parts} parts -> {result.path}: {result.count} samples, {result.skipped} skipped{shards}"
        )
    )
    if result.report:
        print(f"skipped samples and reasons: {result.report}")
    return 0
