"""``mmloader index``: manifest and offset indexes for tar shards written by other tools."""

from __future__ import annotations

import os

HELP = "build manifest and offset indexes for tar shards written by other tools"
EXAMPLES = [
    "mmloader index webdataset-shards/",
    "mmloader index shards/ -o shards-index/",
    "mmloader index s3://bucket/img2dataset-shards/",
    "mmloader index hf://datasets/ORG/NAME/train -o name-index/   # then open name-index/",
]


def add_arguments(s) -> None:
    """The options of ``mmloader index``."""
    s.add_argument("dir", help="a folder of .tar/.tgz/.tar.gz shards (or a URL: the index is uploaded beside them)")
    s.add_argument(
        "-o",
        "--output",
        help="where to write the index (default: DIR); for a URL, a new local folder: the index is kept there, "
        "the shards are read where they are (open the folder)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    """Index the shards and say where the index went (and what cannot be read at random)."""
    from ..storage import build_index, is_url
    from ..storage.remote.redaction import redact_url

    if is_url(args.dir):
        from ..storage.remote.index import build_index_remote

        manifest = build_index_remote(args.dir, output=args.output, progress=not args.quiet)
        if args.output and "://" not in args.output:
            where = os.path.expanduser(args.output)
            print(f"the shards stay at {manifest['shards_url']}: open {where} to read them in place")
    else:
        manifest = build_index(args.dir, output=args.output, progress=not args.quiet)
    comp = sum(1 for s in manifest["shards"] if s["compressed"])
    print(
        f"indexed {manifest['count']} samples in {len(manifest['shards'])} shards "
        f"(fields: {', '.join(manifest['fields'])}) -> {redact_url((args.output or args.dir).rstrip('/'))}/index.json"
    )
    if comp:
        print(
            f"note: {comp} compressed shard(s) can be read sequentially only; decompress them "
            "for random access, shuffling and DDP splitting"
        )
    return 0
