"""``mmloader.Filter``: rows of built batches a predicate rejects, masked out, never dropped.

Unlike :func:`mmloader.select` (which leaves samples out of the plan before any is read, from
their stored fields), a filter decides on what was built: a decoded image's size, a caption's
tokens. It never drops a row or a batch: every rank delivers the same number of batches of the
same size, and the ledger stays what was delivered. A rejected row has ``__valid__`` False (as
``padding="mask"`` marks padding): weigh the loss by it.
"""

from __future__ import annotations

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
        self.name = name or getattr(predicate, "__qualname__", None) or type(predicate).__name__
        self.masked = 0

    def next(self) -> Any:
        assert self.source is not None, "a Filter reads the node before it: put it in with loader(nodes=[...])"
        batch = self.source.next()
        if not isinstance(batch, dict):
            raise MMLoaderError(
                f"mmloader.Filter({self.name}) masks rows of dict batches (their __valid__); got a "
                f"{type(batch).__name__}: filter inside your collate_fn instead"
            )
        keys = batch.get("__key__")
        if not isinstance(keys, (list, tuple)):  # an unbatched sample
            keep, counts = bool(self.predicate(batch)), bool(batch.get("__valid__", True))
            self.masked += counts and not keep
            batch["__valid__"] = counts and keep
            return batch
        given = self.predicate(batch)
        if isinstance(given, torch.Tensor):
            keep_rows = given.detach().to("cpu", torch.bool).reshape(-1)
        else:
            keep_rows = torch.from_numpy(np.asarray(given, dtype=bool).reshape(-1))
        if len(keep_rows) != len(keys):
            raise MMLoaderError(
                f"mmloader.Filter({self.name}): the predicate gave {len(keep_rows)} values for a batch of "
                f"{len(keys)} rows (first key {keys[0]!r}); it must give one bool per row"
            )
        was = batch.get("__valid__")
        rows = torch.ones(len(keys), dtype=torch.bool) if was is None else torch.as_tensor(was, dtype=torch.bool)
        self.masked += int((rows & ~keep_rows).sum())
        batch["__valid__"] = rows & keep_rows
        return batch

    def __repr__(self) -> str:
        return f"mmloader.Filter({self.name})"
