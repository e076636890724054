"""Running a converter: parse its command line, pick the engine (this process, one part, or N
parts on Ray), report the summary or a one-line error. Above :mod:`.parts` and
:mod:`.ray_engine`, which both run under it and never import it."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import lmdb

from mmloader.errors import MMLoaderError
from mmloader.storage.remote.redaction import redact

from .items import ConversionError, Item, UsageError
from .parts import convert_part, item_source
from .sources import check_paths
from .writing import Summary


def run(
    build_items: Callable[[argparse.Namespace, list[str]], tuple[list[Item], dict]],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    looked_for: str,
) -> int:
    """Parse, enumerate items, load them in order (in parallel), write, summarise.

    ``build_items(args, notes)`` lists the samples (appending to ``notes`` what it left out);
    ``looked_for`` says what it looks for, for the error when it finds nothing.
    """
    return execute(parser, argv, item_source(build_items, looked_for))


def check_engine_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine == "ray":
        if args.part is not None:
            parser.error("--part I/N converts one part in this process; with --engine ray use --parts N")
    else:
        for opt, value in (("--parts", args.parts), ("--ray-address", args.ray_address)):
            if value is not None:
                parser.error(f"{opt} applies to --engine ray (use --part I/N to convert one part here)")
        if args.keep_parts:
            parser.error("--keep-parts applies to --engine ray (--part I/N always keeps its part for merge)")


def layout_of(parser: argparse.ArgumentParser) -> str:
    return parser.prog.split()[-1]


def execute(parser: argparse.ArgumentParser, argv: Sequence[str] | None, prepare: Callable) -> int:
    """The whole life of ``mmloader convert LAYOUT``: parse, check, convert (all, one part, or N
    parts on Ray), print the summary or a one-line error; returns the exit status.

    ``prepare(args, notes)`` lists the input and returns ``(digest, convert)``: a digest of the
    input listing (for the part fingerprint) and ``convert(part, dst) -> Summary`` writing part
    ``(i, n)`` (or everything, for None) to ``dst``.
    """
    args = parser.parse_args(argv)
    check_engine_options(parser, args)
    return report_errors(lambda: convert_parsed(parser, args, prepare), args.dst, parser.prog)


def convert_parsed(parser: argparse.ArgumentParser, args: argparse.Namespace, prepare: Callable) -> Summary:
    """Convert as ``args`` (checked options) say: everything, one part, or N parts on Ray."""
    layout = layout_of(parser)
    if args.engine == "ray":
        from .ray_engine import convert_on_ray

        return convert_on_ray(layout, args)
    if args.part is not None:
        return convert_part(layout, args, prepare)
    notes = check_paths(args.src, args.dst, args.overwrite)
    _digest, write = prepare(args, notes)
    return write(None, args.dst)


def report_errors(convert: Callable[[], Summary], dst: str, prog: str = "mmloader convert") -> int:
    """Run a conversion; print its summary, or a one-line error and exit status 1 (2 for an
    option that cannot work), with no credential of a URL or of the environment."""
    try:
        summary = convert()
    except KeyboardInterrupt:
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # the caller's business (mmloader's CLI exits quietly)
    except UsageError as e:
        print(f"{prog}: error: {redact(str(e))}", file=sys.stderr)
        return 2
    except (ConversionError, MMLoaderError, OSError, lmdb.Error, ValueError) as e:
        # ValueError: a DST that cannot work (a URL with a query, or with credentials), as the
        # other commands report it: one line, no traceback
        print(f"{prog}: error: {redact(str(e))}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. a client library's own error: one line too, named by its type
        first = (str(e).strip() or type(e).__name__).splitlines()[0]
        print(f"{prog}: error: {redact(f'{type(e).__name__}: {first}')}", file=sys.stderr)
        return 1
    print(redact(summary.text(dst)))  # DST may be a URL
    return 0
