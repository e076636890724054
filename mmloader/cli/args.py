"""Argument types for the ``mmloader`` command and the converters: one set, so an option means the
same thing, and fails with the same words, everywhere (torch-free)."""

from __future__ import annotations

import argparse
from typing import Callable

from ..storage.sizes import parse_size


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer option from ``low`` (to ``high``, when given).

    Args:
        low: the smallest value allowed.
        high: the largest value allowed (None: no limit).
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            allowed = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value}: must be {allowed}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid integer value"
    return parse


def positive_float(text: str) -> float:
    """A finite number more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be a number more than 0")
    return value


def positive_size(text: str) -> int:
    """A byte count more than 0, in :func:`mmloader.storage.sizes.parse_size`'s units."""
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 bytes")
    return value
