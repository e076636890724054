"""The ``mmloader`` command: inspect, verify, index, convert, merge, preview, plan, bench.

Exit status, the same for every subcommand (argparse's conventions): 0 on success and for
``--help``; 2 for a usage error (an unknown or missing option, a bad option value, an
unknown layout); 1 for a failure (a missing or unreadable dataset or source, bad data,
``verify`` finding problems). Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from .._version import __version__
from ..errors import MMLoaderError

CONVERTERS = ("pairs", "imagefolder", "manifest", "textlines", "parquet")
#: Exit status when the reader of our output went away (``mmloader inspect X | head``): what a
#: Unix tool killed by SIGPIPE reports (128 + 13), so ``set -o pipefail`` scripts see the usual.
EXIT_BROKEN_PIPE = 141


def _inspect(args) -> int:
    from .inspect import describe
    print(describe(args.path, preview=args.preview))
    return 0


def _verify(args) -> int:
    from .inspect import open_with_metadata
    from .verify import verify
    store, _ = open_with_metadata(args.path)  # not a dataset at all: a one-line error, like every command
    report = verify(store, decode=args.decode, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 1


def _index(args) -> int:
    from ..storage import build_index, is_url
    if is_url(args.dir):
        from ..storage.remote_write import build_index_remote
        manifest = build_index_remote(args.dir, output=args.output, progress=not args.quiet)
    else:
        manifest = build_index(args.dir, output=args.output, progress=not args.quiet)
    comp = sum(1 for s in manifest["shards"] if s["compressed"])
    print(f"indexed {manifest['count']} samples in {len(manifest['shards'])} shards "
          f"(fields: {', '.join(manifest['fields'])}) -> {(args.output or args.dir).rstrip('/')}/index.json")
    if comp:
        print(f"note: {comp} compressed shard(s) can be read sequentially only; decompress them "
              "for random access, shuffling and DDP splitting")
    return 0


def _convert(layout: str, rest: list[str]) -> int:
    module = importlib.import_module(f"converters.{layout}")
    return module.main(rest)


def _merge(args) -> int:
    from pathlib import Path
    from ..storage.merge import find_parts, merge, merge_parts, parts_dir_for
    from ..storage import is_url
    if not args.sources and is_url(args.dst):
        raise ValueError(f"{args.dst}: name the local parts to merge (e.g. `mmloader merge out.parts/ {args.dst}`)")
    sources = args.sources or [str(parts_dir_for(args.dst))]
    if not args.sources and not Path(sources[0]).is_dir():
        raise FileNotFoundError(f"no parts to merge: {sources[0]} does not exist (convert with --part I/N "
                                "first, or name the datasets to join)")
    if find_parts(sources) is None:  # plain datasets: concatenated, shards kept as they are
        if args.keep_parts or args.verify:
            raise ValueError("--keep-parts/--verify apply to parts written by `convert --part I/N`")
        out = merge(sources, args.dst, format=args.format, overwrite=args.overwrite, progress=not args.quiet)
        print(f"merged {len(sources)} datasets -> {out}")
        return 0
    if args.format:
        raise ValueError("--format: parts are merged in the format they were converted to")
    result = merge_parts(sources, args.dst, overwrite=args.overwrite, progress=not args.quiet,
                         keep_parts=args.keep_parts or bool(args.sources), rehash=args.verify)
    shards = (f"; shards: {result.kept_shards} kept as they were, {result.written_shards} rewritten"
              if result.kept_shards or result.written_shards else "")
    print(f"merged {result.parts} parts -> {result.path}: {result.count} samples, {result.skipped} skipped{shards}")
    if result.report:
        print(f"skipped samples and reasons: {result.report}")
    return 0


def _preview(args) -> int:
    from .preview import contact_sheet, dataset_for_preview
    from ..loading.config import is_config_path
    if is_config_path(args.path):
        from ..loading.config import load_config, build_sources
        sources = build_sources(load_config(args.path), pil_images=True)
        indices_by = [(name, ds) for name, ds in sources.items()]
    else:
        indices_by = [("", dataset_for_preview(args.path))]
    sheets, all_lines = [], []
    per = max(1, args.n // len(indices_by))
    from PIL import Image
    for name, ds in indices_by:
        idx = list(range(min(per, len(ds))))
        sheet, lines = contact_sheet(ds, idx, columns=args.columns)
        sheets.append(sheet)
        all_lines += [f"{name}: {l}" if name else l for l in lines]
    width = max(s.width for s in sheets)
    out = Image.new("RGB", (width, sum(s.height for s in sheets)), "white")
    y = 0
    for s in sheets:
        out.paste(s, (0, y))
        y += s.height
    out.save(args.output)
    print("\n".join(all_lines))
    print(f"wrote {args.output}")
    return 0


def _plan(args) -> int:
    from .plan import describe_plan
    print(describe_plan(args.config, world=args.world, workers=args.workers))
    return 0


def _bench(args) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be {low} or more")
        return value
    parse.__name__ = "integer"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be a number more than 0")
    return value


def _sub(sub, name: str, help: str, examples: Sequence[str], **kw) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help, epilog="examples:\n" + "\n".join(
        f"  {e}" for e in examples), formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmloader", description="Multi-modal datasets for PyTorch over LMDB "
                                "and tar shards.", epilog="examples:\n  mmloader convert pairs RAW/ out.lmdb\n"
                                "  mmloader inspect out.lmdb\n  mmloader verify out.lmdb --decode\n\n"
                                "exit status: 0 ok, 1 failure (missing or bad data), 2 usage error",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"mmloader {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = _sub(sub, "inspect", "format, counts, fields, shards and a preview of a dataset",
             ["mmloader inspect out.lmdb", "mmloader inspect shards/ -n 0", "mmloader inspect s3://bucket/shards/"])
    s.add_argument("path", help="a dataset: NAME.lmdb or a shard directory, local or a URL (s3://, gs://, az://, "
                   "https://)")
    s.add_argument("-n", "--preview", type=_int_at_least(0), default=3, help="samples to preview (default 3)")
    s.set_defaults(func=_inspect)

    s = _sub(sub, "verify", "check manifest, checksums, indexes and fields; exit 1 listing each problem",
             ["mmloader verify out.lmdb", "mmloader verify shards/ --decode -q", "mmloader verify s3://bucket/shards/"])
    s.add_argument("path", help="a dataset: NAME.lmdb or a shard directory, local or a URL")
    s.add_argument("--decode", action="store_true", help="also decode every image")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_verify)

    s = _sub(sub, "index", "build manifest and offset indexes for tar shards written by other tools",
             ["mmloader index webdataset-shards/", "mmloader index shards/ -o shards-index/",
              "mmloader index s3://bucket/img2dataset-shards/"])
    s.add_argument("dir", help="a folder of .tar/.tgz/.tar.gz shards (or a URL: the index is uploaded beside them)")
    s.add_argument("-o", "--output", help="where to write the index (default: DIR)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_index)

    s = _sub(sub, "convert", "convert a raw folder or file into a dataset (see `mmloader convert LAYOUT --help`)",
             ["mmloader convert pairs RAW/ out.lmdb --workers 2 --require jpg,txt",
              "mmloader convert imagefolder train/ train-shards/ --shard-size 5000",
              "mmloader convert manifest captions.jsonl out/ --image-column file --text-column caption",
              "mmloader convert textlines corpus.txt corpus.lmdb",
              "mmloader convert parquet laion/ out/ --image-column jpg --text-column caption --engine ray",
              "mmloader convert pairs --help"])
    s.add_argument("layout", choices=CONVERTERS, help="pairs: files grouped by stem; imagefolder: ROOT/CLASS/"
                   "images; manifest: a JSONL/CSV file, one row a sample; textlines: a text file, one "
                   "sample a line; parquet: Parquet/Arrow tables (datasets exports), one row a sample")
    s.add_argument("options", nargs=argparse.REMAINDER, help="SRC DST and the layout's options")
    s.set_defaults(func=None)

    s = _sub(sub, "merge", "join the parts of a conversion (`convert --part I/N`) into one dataset, byte-identical "
             "to converting it in one process (no re-encoding); or concatenate datasets",
             ["mmloader merge out/                      # the parts in out.parts/ -> out/, then removes out.parts/",
              "mmloader merge out.parts/ out/ --verify  # re-hash every part file against its manifest first",
              "mmloader merge a.lmdb b.lmdb all.lmdb    # plain datasets: concatenated in order",
              "mmloader merge out.parts/ s3://bucket/out/  # merged locally, uploaded, manifest last"])
    s.add_argument("sources", nargs="*", metavar="SOURCE", help="a parts directory (DST.parts/, the default), "
                   "part datasets, or plain datasets to concatenate in order")
    s.add_argument("dst", help="the dataset to write")
    s.add_argument("--format", choices=("lmdb", "tar"), help="plain datasets: output format (default: tar when "
                   "every source is a shard directory)")
    s.add_argument("--overwrite", action="store_true", help="replace DST if it is an existing dataset")
    s.add_argument("--keep-parts", action="store_true", help="keep DST.parts/ after merging (it is removed "
                   "when merged from there by default)")
    s.add_argument("--verify", action="store_true", help="re-hash every part file against its part manifest "
                   "before merging (default: sizes are checked)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_merge)

    s = _sub(sub, "preview", "contact sheet of samples (image + caption/label/key)",
             ["mmloader preview out.lmdb -o grid.png -n 16", "mmloader preview samples/configs/mixed.yaml"])
    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument("-o", "--output", default="preview.png", help="the image to write (default preview.png)")
    s.add_argument("-n", type=_int_at_least(1), default=16, help="samples to show (default 16)")
    s.add_argument("--columns", type=_int_at_least(1), default=4, help="columns of the sheet (default 4)")
    s.set_defaults(func=_preview)

    s = _sub(sub, "plan", "print an experiment config's resolved epoch plan",
             ["mmloader plan samples/configs/mixed.yaml --world 8 --workers 4"])
    s.add_argument("config", help="an experiment config (YAML, or JSON with 'sources')")
    s.add_argument("--world", type=_int_at_least(1), default=1, help="ranks (default 1)")
    s.add_argument("--workers", type=_int_at_least(0), default=1, help="workers per rank (default 1)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar (fetching a dataset on object "
                   "storage)")
    s.set_defaults(func=_plan)

    s = _sub(sub, "bench", "measure throughput, first-batch latency and memory on your data",
             ["mmloader bench out.lmdb --epochs 1", "mmloader bench samples/configs/mixed.yaml --step-ms 120"])
    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument("--workers", type=_int_at_least(0), default=None, help="loader workers (default: CPUs "
                   "per local rank)")
    s.add_argument("--batch-size", type=_int_at_least(1), default=64, help="samples per batch (default 64)")
    s.add_argument("--epochs", type=_int_at_least(1), default=2, help="epochs to time (default 2)")
    s.add_argument("--step-ms", type=_positive_float, default=None, help="training step time to compare against")
    s.add_argument("--raw", action="store_true", help="raw bytes (no image decode)")
    s.add_argument("--backend", choices=("auto", "thread", "process"), default="auto",
                   help="as mmloader.loader(backend=): auto (default) picks threads for built-in decoders, "
                        "worker processes for Python transforms")
    s.set_defaults(func=_bench)
    return p


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _failure(command: str, e: BaseException) -> int:
    text = str(e) or type(e).__name__
    print(f"mmloader {command}: error: {text}", file=sys.stderr)
    return 1


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="mmloader: %(levelname)s: %(message)s")
    try:
        status = _run(argv)
        sys.stdout.flush()  # here, where a closed pipe can still be handled, not at interpreter exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _run(argv: list[str]) -> int:
    parser = build_parser()
    if argv[:1] == ["convert"]:
        convert = _subparser(parser, "convert")
        if len(argv) < 2:
            convert.error(f"which layout? one of {', '.join(CONVERTERS)} (see --help)")
        if argv[1] in ("-h", "--help"):
            convert.print_help()
            return 0
        if argv[1] not in CONVERTERS:
            convert.error(f"unknown layout {argv[1]!r}: one of {', '.join(CONVERTERS)}")
        return _convert(argv[1], argv[2:])
    args = parser.parse_args(argv)
    import lmdb
    from ..storage.remote_lmdb import progress_bars
    try:
        with progress_bars(not getattr(args, "quiet", False)):  # -q: no bar from storage work either
            return args.func(args)
    except BrokenPipeError:
        raise
    except (MMLoaderError, OSError, lmdb.Error, ValueError) as e:
        return _failure(args.command, e)


from .. import _submodules_on_access  # noqa: E402

__getattr__ = _submodules_on_access(__name__)
