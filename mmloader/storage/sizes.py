"""Byte counts written by people (``--shard-bytes 2GB``, ``cache_limit="20G"``), with one meaning
everywhere: the CLI, the Python API and configs.

``K``, ``M``, ``G``, ``T`` and ``KiB`` ... ``TiB`` are powers of 1024 (as GNU coreutils read
``1G``); ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000 (SI, as disks are sold). A plain number
(``1000000``, ``1e9``) is bytes.

>>> parse_size("1G"), parse_size("1GiB"), parse_size("1GB"), parse_size("64K"), parse_size("1e9")
(1073741824, 1073741824, 1000000000, 65536, 1000000000)
"""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"(?i)\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(k|m|g|t)?(i?b)?\s*")


def parse_size(text: str | int) -> int:
    """A byte count from ``text`` (see the module docstring for the units); an int is taken as is.

    Args:
        text: e.g. ``"20G"``, ``"512MiB"``, ``"2GB"``, ``"1e9"``, ``1000000``.

    Raises:
        ValueError: not a size, or not a whole number of bytes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.fullmatch(str(text))
    if not m or (m.group(3) and not m.group(2) and m.group(3).lower() != "b"):
        raise ValueError(f"{text!r} is not a size (examples: 1G, 512MiB, 2GB, 64K, 1e9, 1000000)")
    number, unit, suffix = m.groups()
    base = 1000 if suffix and suffix.lower() == "b" else 1024
    value = float(number) * base ** " kmgt".index(unit.lower() if unit else " ")
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)
