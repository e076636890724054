"""``mmloader.Map``: a function of built batches, as a node of the loader's graph.

Put in with ``mmloader.loader(stream, nodes=[mmloader.Map(fn)])``. ``fn`` takes a batch and
returns one (never none, never two: every rank delivers the same number of batches, and states
count them). A callable object with ``state()`` and ``reset(state)`` of its own (a running
statistic, a curriculum's counter) is checkpointed with the loader: its state travels in
``loader.state_dict()`` and comes back with ``load_state_dict``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ...errors import MMLoaderError
from .base import Node


class Map(Node[Any]):
    """Each batch of the source turned by ``fn`` (in the training process, as it is delivered).

    Args:
        fn: ``batch -> batch``; an object that also has ``state()`` and ``reset(state)`` is
            checkpointed with the loader.
        name: what states call the node (default: ``fn``'s name, a partial's function's); a
            checkpoint only resumes into the same nodes, by name and order: name lambdas and
            partials that would be taken for one another.
    """

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None):
        if not callable(fn):
            raise TypeError(f"mmloader.Map(fn): fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        inner = fn.func if isinstance(fn, functools.partial) else fn  # (a partial's function names it)
        self.name = name or getattr(inner, "__qualname__", None) or type(inner).__name__
        # stateful when the function object has both halves of the protocol
        stateful = callable(getattr(inner, "state", None)) and callable(getattr(inner, "reset", None))
        self._own: Any = inner if stateful else None

    def next(self) -> Any:
        if self.source is None:
            raise MMLoaderError(f"{self!r} reads the node before it: put it in with loader(nodes=[...])")
        out = self.fn(self.source.next())
        if out is None:
            raise MMLoaderError(f"{self!r}: the function returned None for a batch; return the (changed) batch")
        return out

    def state(self) -> dict:
        return dict(self._own.state()) if self._own is not None else {}

    def reset(self, state: dict | None = None) -> None:
        if self._own is not None:
            self._own.reset(state)

    def __repr__(self) -> str:
        return f"mmloader.Map({self.name})"
