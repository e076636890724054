"""``mmloader.Filter``: rows of built batches a predicate rejects, masked out, never dropped.

Unlike :func:`mmloader.select` (which leaves samples out of the plan before any is read, from
their stored fields), a filter decides on what was built: a decoded image's size, a caption's
tokens. It never drops a row or a batch: every rank delivers the same number of batches of the
same size, and the ledger stays what was delivered. A rejected row has ``__valid__`` False (as
``padding="mask"`` marks padding): weigh the loss by it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from ...errors import MMLoaderError
from .base import Node


class Filter(Node[Any]):
    """Rows where ``predicate(batch)`` is False get ``batch["__valid__"]`` False.

    Args:
        predicate: ``batch -> one bool per row`` (a list, a numpy array or a tensor; one bool
            for an unbatched sample). Rows already not valid (padding) stay not valid.
        name: what states call the node (default: the predicate's name).

    :attr:`masked` counts the rows it masked on this rank (not checkpointed: frameworks save
    one rank's state for all).
    """

    def __init__(self, predicate: Callable[[Any], Any], name: str | None = None):
        if not callable(predicate):
            raise TypeError(f"mmloader.Filter(predicate): predicate must be callable, got {type(predicate).__name__}")
        self.predicate = predicate
        inner = predicate.func if isinstance(predicate, functools.partial) else predicate
        self.name = name or getattr(inner, "__qualname__", None) or type(inner).__name__
        self.masked = 0

    def next(self) -> Any:
        if self.source is None:
            raise MMLoaderError(f"{self!r} reads the node before it: put it in with loader(nodes=[...])")
        batch = self.source.next()
        if not isinstance(batch, dict) or "__key__" not in batch:
            what = type(batch).__name__ if not isinstance(batch, dict) else "dict without __key__"
            raise MMLoaderError(
                f"{self!r} masks rows of dict batches, counted by their __key__; got a {what}: keep __key__ "
                "(put the Filter before a Map that drops it), or filter inside your collate_fn"
            )
        keys = batch["__key__"]
        batched = isinstance(keys, (list, tuple))
        given = self.predicate(batch)
        keep = self._flags(given, len(keys) if batched else None, keys)
        was = batch.get("__valid__")
        rows = torch.ones(keep.shape, dtype=torch.bool) if was is None else torch.as_tensor(was, dtype=torch.bool)
        kept = rows.cpu() & keep
        self.masked += int((rows.cpu() & ~keep).sum())
        # where the batch's flags live: the earlier ones', else the predicate's (a batch moved to CUDA)
        device = (
            was.device if isinstance(was, torch.Tensor) else given.device if isinstance(given, torch.Tensor) else None
        )
        batch["__valid__"] = bool(kept) if not batched else kept.to(device) if device is not None else kept
        return batch

    def _flags(self, given: Any, rows: int | None, keys: Any) -> torch.Tensor:
        """The predicate's answer as bools, one per row (a 0-d one unbatched), or an error naming it."""
        if isinstance(given, torch.Tensor):
            flags = given.detach().cpu()
        else:
            try:
                flags = torch.as_tensor(np.asarray(given))
            except (TypeError, ValueError, RuntimeError):
                flags = None
        ok = flags is not None and (
            flags.dtype == torch.bool or (not flags.is_floating_point() and not flags.is_complex())
        )
        if ok and flags is not None and flags.dtype != torch.bool:
            ok = bool(((flags == 0) | (flags == 1)).all())
        shape = () if rows is None else (rows,)
        if not ok or flags is None or tuple(flags.shape) != shape:
            first = keys if rows is None else keys[0] if len(keys) else None
            want = (
                "one bool (an unbatched sample)"
                if rows is None
                else f"one bool per row: a 1-D list or tensor of {rows}"
            )
            said = " ".join(repr(given).split())[:80]
            raise MMLoaderError(
                f"{self!r}: the predicate gave {said} for a batch of first key {first!r}; it must give {want} "
                "(bools, or integers 0 and 1)"
            )
        return flags.to(torch.bool)

    def __repr__(self) -> str:
        return f"mmloader.Filter({self.name})"
