"""``mmloader.Map``: a function of built batches, as a node of the loader's graph.

Put in with ``mmloader.loader(stream, nodes=[mmloader.Map(fn)])``. ``fn`` takes a batch and
returns one (never none, never two: every rank delivers the same number of batches, and states
count them). A callable object with ``state()`` and ``reset(state)`` of its own (a running
statistic, a curriculum's counter) is checkpointed with the loader: its state travels in
``loader.state_dict()`` and comes back with ``load_state_dict``.
"""

from __future__ import annotations

from typing import Any, Callable

from .base import Node


class Map(Node[Any]):
    """Each batch of the source turned by ``fn`` (in the training process, as it is delivered).

    Args:
        fn: ``batch -> batch``; an object that also has ``state()`` and ``reset(state)`` is
            checkpointed with the loader.
        name: what states call the node (default: ``fn``'s name); a checkpoint only resumes
            into the same nodes, by name and order.
    """

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None):
        if not callable(fn):
            raise TypeError(f"mmloader.Map(fn): fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__

    def next(self) -> Any:
        assert self.source is not None, "a Map reads the node before it: put it in with loader(nodes=[...])"
        return self.fn(self.source.next())

    def state(self) -> dict:
        own = getattr(self.fn, "state", None)
        return dict(own()) if callable(own) else {}

    def reset(self, state: dict | None = None) -> None:
        own = getattr(self.fn, "reset", None)
        if callable(own):
            own(state)

    def __repr__(self) -> str:
        return f"mmloader.Map({self.name})"
