"""``mmloader convert LAYOUT SRC DST ...``: hands the rest of the command line to the converter
(``converters/``, which the library itself never imports)."""

from __future__ import annotations

import argparse
import importlib

CONVERTERS = ("pairs", "imagefolder", "manifest", "textlines", "parquet", "documents")
HELP = "convert a raw folder or file into a dataset (see `mmloader convert LAYOUT --help`)"
EXAMPLES = [
    "mmloader convert pairs RAW/ out.lmdb --workers 2 --require jpg,txt",
    "mmloader convert imagefolder train/ train-shards/ --shard-size 5000",
    "mmloader convert manifest captions.jsonl out/ --image-column file --text-column caption",
    "mmloader convert textlines corpus.txt corpus.lmdb",
    "mmloader convert parquet laion/ out/ --image-column jpg --text-column caption --engine ray",
    "mmloader convert documents obelics/ docs/ --layout obelics",
    "mmloader convert pairs --help",
]


def add_arguments(s) -> None:
    """The layout and the converter's own arguments (parsed by the converter)."""
    s.add_argument(
        "layout",
        choices=CONVERTERS,
        help="pairs: files grouped by stem; imagefolder: ROOT/CLASS/"
        "images; manifest: a JSONL/CSV file, one row a sample; textlines: a text file, one "
        "sample a line; parquet: Parquet/Arrow tables (datasets exports), one row a sample; "
        "documents: interleaved image-text documents (OBELICS Parquet, MMC4 JSONL, WebDataset shards)",
    )
    s.add_argument("options", nargs=argparse.REMAINDER, help="SRC DST and the layout's options")


def dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """``argv`` after ``convert``: the layout, then what its converter parses itself."""
    if not argv:
        parser.error(f"which layout? one of {', '.join(CONVERTERS)} (see --help)")
    if argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] not in CONVERTERS:
        parser.error(f"unknown layout {argv[0]!r}: one of {', '.join(CONVERTERS)}")
    return importlib.import_module(f"mmloader.converters.{argv[0]}").main(argv[1:])


run = None  # convert is dispatched before argparse sees the converter's options
