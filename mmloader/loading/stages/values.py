"""Checks of one option's value, each naming the option and what it accepts."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def whole(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    """``value`` is an integer >= ``minimum`` (or None where allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}" + (" or None" if allow_none else ""))


def flag(name: str, value: Any) -> None:
    """``value`` is true or false (not 0, 1 or a string, which YAML and typos give)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r}: expected true or false")


def choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    """``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, allowed))}")
