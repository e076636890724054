"""What a converted dataset records about its input: the layout, what was found (files,
samples), a fingerprint of the input listing and the options that shaped the output. Never where
the input lay on the converting machine — a dataset is handed to others, uploaded, published —
unless ``--record-source`` asks for it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Mapping

from mmloader.storage import format_for

from .options import PATH_OPTIONS, RUN_OPTIONS


def _plain(value: Any) -> Any:
    """An option's value as JSON holds it: tuples as lists, dataclasses (``--transcode``) as
    mappings, anything else not JSON by its text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return str(value)


def recorded_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options that shape the output, by name, and the output format: every option but those
    that only change how the conversion runs (:data:`~.options.RUN_OPTIONS`: SRC, DST,
    ``--workers``, ``--part``...) and those that name local files (:data:`~.options.PATH_OPTIONS`,
    recorded as fingerprints by their layout).

    Args:
        args: the parsed command line.
    """
    skip = RUN_OPTIONS | PATH_OPTIONS | {"record_source"}
    out = {k: _plain(v) for k, v in sorted(vars(args).items()) if k not in skip and not k.startswith("_")}
    out["format"] = format_for(args.dst, args.format)
    return out


def source_paths(args: argparse.Namespace) -> str | list[str]:
    """The absolute path of SRC (a list where a layout takes several), as ``--record-source``
    records it."""
    if isinstance(args.src, (list, tuple)):
        return [str(Path(s).resolve()) for s in args.src]
    return str(Path(args.src).resolve())


def describe_input(
    metadata: Mapping[str, Any], args: argparse.Namespace, fingerprint: str, found: Mapping[str, int]
) -> dict[str, Any]:
    """``metadata`` (the layout's: ``layout``, ``classes``, ``columns``...) with what users need
    to know of the input: ``input`` (what was found, e.g. ``files`` and ``samples``, and
    ``fingerprint``, a sha256 of the input listing: the same conversion of the same input gives
    the same one, on any machine, from any folder) and ``options``
    (:func:`recorded_options`); with ``--record-source``, ``source`` too: the absolute path(s)
    of SRC.

    Args:
        metadata: the layout's own metadata.
        args: the parsed command line.
        fingerprint: the digest of the input listing (the one ``--part`` compares).
        found: counts of what the listing holds.
    """
    out = {k: v for k, v in metadata.items() if k == "layout"}
    if getattr(args, "record_source", False):  # next to the layout, as earlier versions had it
        out["source"] = source_paths(args)
    out.update({k: v for k, v in metadata.items() if k != "layout"})
    out["input"] = {**found, "fingerprint": fingerprint}
    out["options"] = recorded_options(args)
    return out
