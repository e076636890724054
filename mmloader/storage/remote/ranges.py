"""Byte ranges: merging nearby ranges into one request, and checking an answer's length."""

from __future__ import annotations

from typing import Iterable

from .errors import LongBody, ObjectChangedError, ShortBody


def coalesce(ranges: Iterable[tuple[int, int]], gap: int) -> list[tuple[int, int, list[int]]]:
    """Merge ``(start, end)`` ranges whose gap is at most ``gap`` bytes into larger ones:
    ``[(start, end, [indices of the ranges inside]), ...]`` in file order.

    >>> coalesce([(0, 10), (12, 20), (100, 110), (15, 18)], gap=4)
    [(0, 20, [0, 1, 3]), (100, 110, [2])]
    """
    items = sorted(((a, b, i) for i, (a, b) in enumerate(ranges)), key=lambda t: t[0])
    out: list[tuple[int, int, list[int]]] = []
    for a, b, i in items:
        if out and a - out[-1][1] <= gap:
            s, e, members = out[-1]
            out[-1] = (s, max(e, b), members + [i])
        else:
            out.append((a, b, [i]))
    return out


def _check_length(data, want: int, url: str, start: int, object_size: int | None = None) -> None:
    if len(data) == want:
        return
    if object_size is not None and start + want > object_size:
        raise ObjectChangedError(
            f"{url}: the object holds {object_size} bytes, but the dataset's index needs bytes "
            f"up to {start + want}: it was truncated or replaced since it was indexed"
        )
    if len(data) > want:
        raise LongBody(
            f"{url}: the server sent {len(data)} bytes for a range of {want} at offset {start}: it does "
            "not answer ranged reads correctly"
        )
    raise ShortBody(f"{url}: got {len(data)} of {want} bytes at offset {start}")
