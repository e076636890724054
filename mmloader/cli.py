"""The ``mmloader`` command: inspect, verify, index, convert, merge, preview, plan, bench."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from ._version import __version__
from .errors import MMLoaderError

CONVERTERS = ("pairs", "imagefolder", "manifest", "textlines")


def _inspect(args) -> int:
    from .describe import describe
    print(describe(args.path, preview=args.preview))
    return 0


def _verify(args) -> int:
    from .verify import verify
    report = verify(args.path, decode=args.decode, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 1


def _index(args) -> int:
    from .storage import build_index
    manifest = build_index(args.dir, output=args.output, progress=not args.quiet)
    comp = sum(1 for s in manifest["shards"] if s["compressed"])
    print(f"indexed {manifest['count']} samples in {len(manifest['shards'])} shards "
          f"(fields: {', '.join(manifest['fields'])}) -> {args.output or args.dir}/index.json")
    if comp:
        print(f"note: {comp} compressed shard(s) can be read sequentially only; decompress them "
              "for random access, shuffling and DDP splitting")
    return 0


def _convert(args, rest: list[str]) -> int:
    module = importlib.import_module(f"converters.{args.layout}")
    return module.main(rest)


def _merge(args) -> int:
    from .storage.merge import merge
    out = merge(args.parts, args.dst, format=args.format, overwrite=args.overwrite,
                progress=not args.quiet)
    print(f"merged {len(args.parts)} parts -> {out}")
    return 0


def _preview(args) -> int:
    from .preview import contact_sheet, dataset_for_preview
    from .config import is_config_path
    if is_config_path(args.path):
        from .config import load_config, build_sources
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
    from .planview import describe_plan
    print(describe_plan(args.config, world=args.world, workers=args.workers))
    return 0


def _bench(args) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmloader", description="Multi-modal datasets for PyTorch over LMDB "
                                "and tar shards.")
    p.add_argument("--version", action="version", version=f"mmloader {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="format, counts, fields, shards and a preview of a dataset")
    s.add_argument("path")
    s.add_argument("-n", "--preview", type=int, default=3, help="samples to preview (default 3)")
    s.set_defaults(func=_inspect)

    s = sub.add_parser("verify", help="check manifest, checksums, indexes and fields; exit 1 on problems")
    s.add_argument("path")
    s.add_argument("--decode", action="store_true", help="also decode every image")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_verify)

    s = sub.add_parser("index", help="build manifest and offset indexes for tar shards written by other tools")
    s.add_argument("dir")
    s.add_argument("-o", "--output", help="where to write the index (default: DIR)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=_index)

    s = sub.add_parser("convert", help="convert a raw folder (see `mmloader convert LAYOUT --help`)",
                       add_help=False)
    s.add_argument("layout", choices=CONVERTERS)
    s.set_defaults(func=None)

    s = sub.add_parser("merge", help="combine converted parts into one dataset (no re-encoding)")
    s.add_argument("parts", nargs="+")
    s.add_argument("dst")
    s.add_argument("--format", choices=("lmdb", "tar"))
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=_merge)

    s = sub.add_parser("preview", help="contact sheet of samples (image + caption/label/key)")
    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument("-o", "--output", default="preview.png")
    s.add_argument("-n", type=int, default=16)
    s.add_argument("--columns", type=int, default=4)
    s.set_defaults(func=_preview)

    s = sub.add_parser("plan", help="print an experiment config's resolved epoch plan")
    s.add_argument("config")
    s.add_argument("--world", type=int, default=1)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=_plan)

    s = sub.add_parser("bench", help="measure throughput, first-batch latency and memory on your data")
    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument("--workers", type=int, default=None)
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--step-ms", type=float, default=None, help="training step time to compare against")
    s.add_argument("--raw", action="store_true", help="raw bytes (no image decode)")
    s.add_argument("--backend", choices=("thread", "process"), default="thread")
    s.set_defaults(func=_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="mmloader: %(levelname)s: %(message)s")
    parser = build_parser()
    if argv[:1] == ["convert"]:
        if len(argv) < 2 or argv[1] not in CONVERTERS:
            parser.error(f"convert needs a layout: one of {', '.join(CONVERTERS)}")
        return _convert(argparse.Namespace(layout=argv[1]), argv[2:])
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (MMLoaderError, FileNotFoundError, FileExistsError, PermissionError) as e:
        print(f"mmloader {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
