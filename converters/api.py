"""Converting from Python: :func:`convert` runs what ``mmloader convert LAYOUT SRC DST`` runs,
with the layout's options as keyword arguments, and returns the summary instead of printing it.

>>> from mmloader.converters import convert                                  # doctest: +SKIP
>>> summary = convert("pairs", "raw/", "out.lmdb", workers=4, require=["jpg", "txt"])  # doctest: +SKIP
>>> summary.written                                                           # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
from typing import Any

from .items import ConversionError, UsageError
from .running import check_engine_options, convert_parsed
from .writing import Summary

#: The raw layouts, one module each.
LAYOUTS = ("pairs", "imagefolder", "manifest", "textlines", "parquet", "documents")


def convert(
    layout: str, src: str | os.PathLike | list[str | os.PathLike], dst: str | os.PathLike, /, **options: Any
) -> Summary:
    """Convert ``src`` (a raw folder or file in ``layout``) into the dataset ``dst``.

    Args:
        layout: one of :data:`LAYOUTS`.
        src: the raw folder or file (a list where the layout takes several).
        dst: ``NAME.lmdb`` for LMDB, otherwise a shard directory (or a URL).
        **options: the layout's command-line options by their Python names, as typed values:
            ``workers=4``, ``shard_size=5000``, ``shard_bytes="2GB"``, ``require=["jpg", "txt"]``,
            ``overwrite=True``, ``quiet=True`` (no progress bar). They are checked as the
            command line checks them.

    Returns:
        What was written, skipped and left out (:class:`Summary`; ``.text(dst)`` is what the
        command prints).

    Raises:
        UsageError: an unknown option or a value that cannot work, named.
        ConversionError: bad input, naming the file and what is wrong (nothing is left under
            ``dst``).
    """
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    module = importlib.import_module(f"{__package__}.{layout}")
    parser = module.parser()
    sources = [os.fspath(s) for s in src] if isinstance(src, (list, tuple)) else [os.fspath(src)]
    try:
        args = _parse(parser, [*sources, os.fspath(dst), *_argv(parser, layout, options)])
        return convert_parsed(parser, args, module.prepare)
    except ConversionError as e:
        e.args = (in_python_terms(str(e), parser), *e.args[1:])  # same error, worded for this caller
        raise


def in_python_terms(message: str, parser: argparse.ArgumentParser) -> str:
    """A message that names command-line flags, worded for a caller of :func:`convert`:
    ``--overwrite`` becomes ``overwrite=True``, ``--on-error skip`` ``on_error="skip"``,
    ``--max-images`` ``max_images``. Only a flag standing as a word is one: a file name that
    holds ``--`` is left as it is.

    >>> p = argparse.ArgumentParser(); _ = p.add_argument("--overwrite", action="store_true")
    >>> _ = p.add_argument("--max-images", type=int); _ = p.add_argument("--on-error", choices=["raise", "skip"])
    >>> in_python_terms("pass --overwrite to replace it; over --max-images 8", p)
    'pass overwrite=True to replace it; over max_images 8'
    >>> in_python_terms("--on-error skip would skip it; /data/out--overwrite.lmdb exists", p)
    'on_error="skip" would skip it; /data/out--overwrite.lmdb exists'
    """
    actions = {flag: a for a in parser._actions for flag in a.option_strings}

    def reword(m: re.Match) -> str:
        action = actions.get(m.group("flag"))
        if action is None:
            return m.group(0)
        value = m.group("value")
        if action.nargs == 0 and isinstance(action.const, bool):
            return f"{action.dest}={action.const}" + (m.group(0)[len(m.group("flag")) :] if value is not None else "")
        if value is not None and action.choices and value in action.choices:
            return f'{action.dest}="{value}"'
        return action.dest + m.group(0)[len(m.group("flag")) :]

    # a flag: at the start or after a space or an opening bracket/quote, ending at a word's end
    flag = r"(?<![^\s(\[`'\"])(?P<flag>--[A-Za-z][A-Za-z0-9-]*)(?![\w./-])(?:[ =](?P<value>[A-Za-z][\w-]*)(?![\w./-]))?"
    return re.sub(flag, reword, message)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The options, checked as the command line checks them, with errors raised, not exits."""

    def refuse(message: str) -> None:
        raise UsageError(message)

    parser.error = refuse  # type: ignore[method-assign]  # this parser serves one call
    args = parser.parse_args(argv)
    check_engine_options(parser, args)
    return args


def _argv(parser: argparse.ArgumentParser, layout: str, options: dict[str, Any]) -> list[str]:
    """``options`` as the command line spells them, so that they are parsed and checked once."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    argv: list[str] = []
    for name, value in options.items():
        action = actions.get(name)
        if action is None:
            close = difflib.get_close_matches(name, actions, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"convert({layout!r}): no option {name!r}{hint}; it takes: {', '.join(sorted(actions))}")
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:  # a switch: True turns it on, False leaves it off
            if not isinstance(value, bool):
                raise UsageError(f"convert({layout!r}): {name}= takes True or False, not {value!r}")
            argv += [flag] if value else []
        elif value is not None:
            if isinstance(value, (list, tuple)):
                text = ",".join(str(v) for v in value)
            else:
                text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
            argv += [f"{flag}={text}"]
    return argv
