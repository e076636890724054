"""The length slot of a stream: :class:`Bucketing` or :class:`Packing`, never both.

Both group samples by length, one by sorting within windows (batches of similar length,
less padding), the other by filling rows to a token budget; a stream takes one of them as
``lengths=``, so the pair cannot be written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ...align.collate import collate
from ...planning.balance import COSTS
from ...planning.packing import PACK_WINDOW
from ..packing import Packer
from .values import whole


class Stream(Protocol):
    """What the length slot reads of the stream it is part of (its other stages, its sources)."""

    @property
    def batch_size(self) -> int | None: ...
    @property
    def shuffle(self) -> bool: ...
    @property
    def datasets(self) -> Sequence[Any]: ...
    @property
    def mix(self) -> Any: ...
    @property
    def on_change(self) -> str: ...
    @property
    def collate_fn(self) -> Any: ...
    @property
    def padding(self) -> str | None: ...
    @property
    def packer(self) -> Packer | None: ...


class LengthPolicy(Protocol):
    """What the slot's options do for a stream: check it, name themselves in its identity,
    and give its plan what they add (bucketing: the lengths to sort by; packing: the rows)."""

    def check(self, stream: Stream) -> None: ...

    def identity(self, stream: Stream) -> dict[str, Any]: ...

    def order_options(self, stream: Stream) -> dict[str, Any]: ...

    def packer(self, stream: Stream) -> Packer | None: ...


@dataclass(frozen=True)
class Bucketing:
    """Batches of samples of similar length, sorted within windows of ``window`` batches.

    ``by``: a modality name (its stored byte size is the length), or a callable
    ``index -> length`` (for a mix ``(source position, index) -> length``). A callable is
    part of the plan identity by its code, closure, defaults and ``functools.partial``
    arguments (:func:`mmloader.align.identity.callable_identity`); one that holds anything
    else, or reads globals that change between runs, needs ``identity=``: a name you change
    whenever what it computes changes.

    >>> Bucketing("caption", window=0)
    Traceback (most recent call last):
    ...
    ValueError: bucket_window=0: expected an integer >= 1
    """

    by: str | Callable[..., int]
    window: int = 64
    identity_: str | None = field(default=None, kw_only=True)  # (``identity=``: see __init__)

    def __init__(self, by: str | Callable[..., int], window: int = 64, *, identity: str | None = None):
        object.__setattr__(self, "by", by)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "identity_", identity)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not (isinstance(self.by, str) or callable(self.by)):
            raise ValueError(f"Bucketing(by={self.by!r}): expected a modality name or a callable index -> length")
        whole("bucket_window", self.window, 1)

    def check(self, stream: Stream) -> None:
        if not stream.batch_size:
            raise ValueError("Bucketing needs a batch size: Stream(..., batch_size=...)")
        if isinstance(self.by, str) and not any(self.by in getattr(ds, "readers", {}) for ds in stream.datasets):
            names = sorted({n for ds in stream.datasets for n in getattr(ds, "readers", {})})
            raise ValueError(f"Bucketing(by={self.by!r}): not a modality of the dataset ({names})")

    def identity(self, stream: Stream) -> dict[str, Any]:
        from ...align.identity import callable_identity

        if isinstance(self.by, str):  # a modality: which fields give its lengths
            fields = {
                ";".join(ds.readers[self.by].fields) for ds in stream.datasets if self.by in getattr(ds, "readers", {})
            }
            bucket: dict = {"modality": self.by, "fields": sorted(fields)}
        elif self.identity_ is not None:
            bucket = {"callable": str(self.identity_)}
        else:
            bucket = {"callable": callable_identity(self.by, "Bucketing(by=...)")}
        return {"bucket_by": bucket, "bucket_window": int(self.window), "pack": None}

    def order_options(self, stream: Stream) -> dict[str, Any]:
        return {
            "lengths": lambda sources, indices: self.lengths(stream, sources, indices),
            "bucket_window": self.window,
        }

    def packer(self, stream: Stream) -> None:
        return None

    def lengths(self, stream: Stream, sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """The length of each planned ``(source, index)``."""
        if callable(self.by):
            by = self.by
            return np.array(
                [
                    by(int(i)) if stream.mix is None else by(int(s), int(i))
                    for s, i in zip(sources.tolist(), indices.tolist())
                ]
            )
        return modality_lengths(stream.datasets, sources, indices, self.by)


def modality_lengths(datasets: Sequence[Any], sources: np.ndarray, indices: np.ndarray, modality: str) -> np.ndarray:
    """The stored length of ``modality`` for each ``(source, index)``; 0 for sources without it."""
    out = np.zeros(len(indices), dtype=np.int64)
    for s in np.unique(sources).tolist():
        ds, sel = datasets[s], sources == s
        if modality in getattr(ds, "readers", {}):
            out[sel] = ds.lengths(indices[sel].tolist(), modality)
    return out


@dataclass(frozen=True)
class Packing:
    """Rows of at most ``tokens`` tokens, each row whole samples, planned from (seed, epoch)
    before the rank split (:mod:`mmloader.loading.packing`); the stream's batch size is rows
    per batch. ``length_by``: a token modality, a callable or array of token counts, or
    :func:`mmloader.tokens` for images and documents (None: the one token modality).
    ``window``: plan positions packed together. ``balance``: ``"attention"`` or ``"tokens"``:
    the rows of each global step are dealt to the data-parallel ranks so that their costs (the
    sum of squared sample lengths, or the tokens) are even (:mod:`mmloader.planning.balance`);
    every sample is still delivered once per epoch, and resumes stay exact.

    >>> Packing(0)
    Traceback (most recent call last):
    ...
    ValueError: pack_tokens=0: expected an integer >= 1
    """

    tokens: int
    length_by: Any = None
    window: int = PACK_WINDOW
    balance: str | None = None

    def __post_init__(self) -> None:
        whole("pack_tokens", self.tokens, 1)
        whole("pack_window", self.window, 1)
        if self.balance is not None and self.balance not in COSTS:
            raise ValueError(f"Packing(balance={self.balance!r}): expected one of {', '.join(COSTS)}, or None")

    def check(self, stream: Stream) -> None:
        why = [
            (not stream.batch_size, "needs a batch size (rows per batch): Stream(..., batch_size=...)"),
            (
                stream.mix is not None and stream.mix.unit(stream.batch_size) > 1,
                "cannot keep batch_composition='source'",
            ),
            (stream.on_change == "continue", "with on_change='continue' is not supported; use 'error' or 'next_epoch'"),
            (stream.collate_fn is not collate, "lays out its own batches: Batching(collate_fn=...) cannot be given"),
            (
                self.balance is not None and stream.padding == "mask",
                "(balance=...) deals whole global steps; with padding='mask' ranks take steps of unequal rows",
            ),
        ]
        for bad, what in why:
            if bad:
                raise ValueError(f"Packing {what}")

    def identity(self, stream: Stream) -> dict[str, Any]:
        packer = stream.packer
        return {"bucket_by": None, "bucket_window": None, "pack": packer.identity() if packer else None}

    def order_options(self, stream: Stream) -> dict[str, Any]:
        return {}

    def packer(self, stream: Stream) -> Packer:
        return Packer(
            stream.datasets,
            self.tokens,
            self.length_by,
            self.window,
            mixed=stream.mix is not None,
            shuffle=stream.shuffle,
            balance=self.balance,
        )
