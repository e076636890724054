"""A stage from what a stream was given: its object, or the shortcuts of the common case."""

from __future__ import annotations

from typing import Any, TypeVar

from .batching import Batching
from .order import Order

T = TypeVar("T")

#: Options that became a stage's, with what to write instead (an old call is told, not guessed at).
MOVED = {
    "block_size": "order=mmloader.Order(block_size=...)",
    "window_blocks": "order=mmloader.Order(window_blocks=...)",
    "collate_fn": "batching=mmloader.Batching(batch_size, collate_fn=...)",
    "padding": "batching=mmloader.Batching(batch_size, padding=...)",
    "on_error": "errors='skip' (or mmloader.Errors(...))",
    "max_consecutive_errors": "errors=mmloader.Errors('skip', max_consecutive=...)",
    "bucket_by": "lengths=mmloader.Bucketing(by, window=...)",
    "bucket_window": "lengths=mmloader.Bucketing(by, window=...)",
    "pack_tokens": "lengths=mmloader.Packing(tokens, length_by=...)",
    "length_by": "lengths=mmloader.Packing(tokens, length_by=...)",
    "pack_window": "lengths=mmloader.Packing(tokens, window=...)",
}


def stage(given: T | None, kind: type[T], name: str, shortcuts: dict[str, tuple[str, Any]]) -> T:
    """``given``, or a ``kind`` made of the shortcuts given (``{option: (field, value)}``, None:
    the stage's default); both is an error, since one of them would be silently ignored."""
    set_ = {option: field_value for option, field_value in shortcuts.items() if field_value[1] is not None}
    if given is None:
        return kind(**dict(set_.values()))
    if not isinstance(given, kind):
        raise TypeError(f"{name}={given!r}: expected mmloader.{kind.__name__}(...)")
    if set_:
        words = ", ".join(f"{k}=" for k in set_)
        raise TypeError(f"{words} and {name}= both given: give {words} inside mmloader.{kind.__name__}(...)")
    return given


def shortcut_stages(
    order: Order | None,
    batching: Batching | None,
    batch_size: int | None,
    shuffle: bool | None,
    seed: int | None,
    drop_last: bool | None,
) -> tuple[Order, Batching]:
    """A stream's :class:`Order` and :class:`Batching`, from their objects or the shortcuts."""
    return (
        stage(order, Order, "order", {"shuffle": ("shuffle", shuffle), "seed": ("seed", seed)}),
        stage(
            batching, Batching, "batching", {"batch_size": ("size", batch_size), "drop_last": ("drop_last", drop_last)}
        ),
    )


def unknown_options(owner: str, unknown: dict[str, Any]) -> str:
    """The error for options ``owner`` does not take, saying where a moved one went."""
    moved = [f"{k}: {MOVED[k]}" for k in sorted(unknown) if k in MOVED]
    other = sorted(k for k in unknown if k not in MOVED)
    parts = []
    if other:
        parts.append(f"{owner}() got unexpected keyword argument(s) {', '.join(other)}")
    if moved:
        parts.append(f"{owner}() takes these as stage options now: " + "; ".join(moved))
    return ". ".join(parts)
