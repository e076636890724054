"""The ``mmloader`` command: inspect, verify, index, convert, merge, preview, plan, bench.

Exit status, the same for every subcommand (argparse's conventions): 0 on success and for
``--help``; 2 for a usage error (an unknown or missing option, a bad option value, an
unknown layout); 1 for a failure (a missing or unreadable dataset or source, bad data,
``verify`` finding problems). Errors are one line on stderr, never a traceback, and show no
credential (:func:`~mmloader.storage.remote.redaction.redact`); an error of an unexpected kind
is named by its type (``MMLOADER_TRACEBACK=1`` prints its traceback too, redacted likewise).
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

#: The subcommands, in --help order: each a module of this package with HELP, EXAMPLES,
#: add_arguments(parser) and run(args) (importing it loads no torch: --help stays fast).
COMMANDS = ("inspect", "verify", "index", "convert", "merge", "preview", "plan", "bench")
#: Exit status when the reader of our output went away (``mmloader inspect X | head``): what a
#: Unix tool killed by SIGPIPE reports (128 + 13), so ``set -o pipefail`` scripts see the usual.
EXIT_BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    """The ``mmloader`` parser, one subparser per module of :data:`COMMANDS`."""
    p = argparse.ArgumentParser(
        prog="mmloader",
        description="Multi-modal datasets for PyTorch over LMDB and tar shards.",
        epilog="examples:\n  mmloader convert pairs RAW/ out.lmdb\n"
        "  mmloader inspect out.lmdb\n  mmloader verify out.lmdb --decode\n\n"
        "exit status: 0 ok, 1 failure (missing or bad data), 2 usage error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"mmloader {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = importlib.import_module(f".{name}", __name__)
        s = sub.add_parser(
            name,
            help=command.HELP,
            description=command.HELP,
            epilog="examples:\n" + "\n".join(f"  {e}" for e in command.EXAMPLES),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(s)
        s.set_defaults(func=command.run)
    return p


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _failure(command: str, e: BaseException, expected: bool = True) -> int:
    """Exit status 1 after a line on stderr saying what failed, redacted. An error of a kind the
    commands expect (a missing dataset, bad data, an option that cannot work) is its message; any
    other is its type and the first line of its message."""
    from ..storage.remote.redaction import redact

    text = str(e).strip() or type(e).__name__
    if not expected:
        text = f"{type(e).__name__}: {text.splitlines()[0]}"
    prefix = f"mmloader {command}: " if command else "mmloader: "
    if os.environ.get("MMLOADER_TRACEBACK"):
        import traceback

        print(redact("".join(traceback.format_exception(e))), file=sys.stderr, end="")
    print(f"{prefix}error: {redact(text)}", file=sys.stderr)
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
    except KeyboardInterrupt:  # (a conversion publishes atomically: before it is written, nothing is)
        print("interrupted: nothing written" if argv[:1] == ["convert"] else "interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # whatever failed (a client library's own error too): one line, redacted
        command = argv[0] if argv and not argv[0].startswith("-") else ""
        return _failure(command, e, expected=isinstance(e, (MMLoaderError, OSError, ValueError)))


def _run(argv: list[str]) -> int:
    parser = build_parser()
    if argv[:1] == ["convert"]:  # the converter parses its own options
        from .convert import dispatch

        return dispatch(_subparser(parser, "convert"), argv[1:])
    args = parser.parse_args(argv)
    import lmdb

    from ..storage.remote.lmdb import progress_bars

    try:
        with progress_bars(not getattr(args, "quiet", False)):  # -q: no bar from storage work either
            return args.func(args)
    except BrokenPipeError:
        raise
    except (MMLoaderError, OSError, lmdb.Error, ValueError) as e:
        return _failure(args.command, e)
    except Exception as e:  # e.g. a client library's own error: named by its type, one line
        return _failure(args.command, e, expected=False)


from .. import _submodules_on_access  # noqa: E402

__getattr__ = _submodules_on_access(__name__)
