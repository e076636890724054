"""The contract every node keeps: ``next()``, ``reset(state=None)``, ``state()``, ``close()``.

A node hands out items one ``next()`` at a time (``StopIteration`` at the end of a pass), says
where it is as plain data (``state()``, JSON-able: it travels in checkpoints) and goes back there
(``reset(state)``; ``reset()`` is the start). A node that reads another one names it ``source``.

>>> class Count(Node):                          # numbers 0, 1, 2 ... up to ``stop``
...     def __init__(self, stop): self.stop, self.i = stop, 0
...     def next(self):
...         if self.i == self.stop: raise StopIteration
...         self.i += 1; return self.i - 1
...     def reset(self, state=None): self.i = (state or {}).get("i", 0)
...     def state(self): return {"i": self.i}
>>> node = Count(5); [node.next(), node.next()], node.state()
([0, 1], {'i': 2})
>>> again = Count(5); again.reset(node.state()); list(again)
[2, 3, 4]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")


class Node(ABC, Generic[T]):
    """One stage of a pipeline: items one at a time, a state to resume from, resources to close."""

    #: The node this one reads from (None: a source, it reads storage or a plan itself).
    source: Node[Any] | None = None

    @abstractmethod
    def next(self) -> T:
        """The next item; ``StopIteration`` when the pass has no more."""

    def reset(self, state: dict | None = None) -> None:  # noqa: B027 (a stateless node keeps nothing)
        """Go back to the start (``None``) or to where ``state`` (a :meth:`state`) says."""

    def state(self) -> dict:
        """Where this node is, as plain data (JSON-able); ``{}``: it keeps nothing between items."""
        return {}

    def close(self) -> None:
        """Release what the node holds (threads, processes, files); its source's too."""
        if self.source is not None:
            self.source.close()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return self.next()
