"""The nodes a user puts between the loader and the training loop, run and checkpointed.

``mmloader.loader(stream, nodes=[a, b])`` makes the graph ``batches -> a -> b``: the backend's
batches of the pass under way are its source, and each node reads the one before it. Every node
hands on one batch for each it reads: ranks deliver equal numbers of batches, and the loader's
state, which counts batches, stays true. A node that takes two, or ends the pass early, is
stopped with an error naming it (left alone, one rank would wait for the others for good).

States: ``loader.state_dict()["nodes"]`` holds each node's name and :meth:`~.base.Node.state`;
``load_state_dict`` resets each node to its own. A checkpoint resumes only into the same nodes
(by name, in order); one saved before any node was put in starts them afresh, with a warning.
Frameworks save one rank's checkpoint for all: a node's state should be the same on every rank
(a count of steps, a schedule), not a statistic of the rank's own rows.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator, Sequence

from ...errors import MMLoaderError, ResumeError
from .base import Node


class _Delivered(Node[Any]):
    """The graph's source: the backend's batches of the pass under way, counted as read."""

    def __init__(self) -> None:
        self.batches: Iterator[Any] = iter(())
        self.read, self.ended = 0, False

    def next(self) -> Any:
        try:
            batch = next(self.batches)
        except StopIteration:
            self.ended = True
            raise
        self.read += 1
        return batch


def name_of(node: Node[Any]) -> str:
    return str(getattr(node, "name", None) or type(node).__name__)


class Chain:
    """The user's nodes over a loader's batches (see the module docstring)."""

    def __init__(self, nodes: Sequence[Node[Any]]):
        nodes = list(nodes)
        for i, node in enumerate(nodes):
            if not isinstance(node, Node):
                raise TypeError(
                    f"loader(nodes=[...]): item {i} is a {type(node).__name__}, not an mmloader.Node; wrap a "
                    "function of batches as mmloader.Map(fn)"
                )
        if len({id(n) for n in nodes}) != len(nodes):
            raise ValueError("loader(nodes=[...]): a node appears twice; make one object for each place")
        self.nodes = nodes
        self.source = _Delivered()
        upstream: Node[Any] = self.source
        for node in nodes:
            node.source = upstream
            upstream = node
        self.head = upstream
        self.before: list[dict] | None = None  # the node states before the batch delivered last

    def names(self) -> list[str]:
        return [name_of(n) for n in self.nodes]

    def states(self) -> list[dict]:
        """Each node's name and state, as a checkpoint holds them."""
        return [{"node": name_of(n), "state": n.state()} for n in self.nodes]

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The pass's batches through the nodes, each checked to hand on one batch per batch."""
        self.source.batches, self.source.ended = batches, False
        del batches  # held by the source only, and dropped with the pass (its workers stop at once)
        try:
            while True:
                before, read = self.states(), self.source.read
                try:
                    batch = self.head.next()
                except StopIteration:
                    if not self.source.ended:
                        raise MMLoaderError(
                            f"node {self._culprit()} ended the pass while the loader still had batches: every "
                            "rank must deliver the same number (one would wait for the others for good); a node "
                            "hands on one batch for each it reads (mask rows with mmloader.Filter instead of "
                            "dropping)"
                        ) from None
                    return
                if self.source.read != read + 1:
                    raise MMLoaderError(
                        f"node {self._culprit()} read {self.source.read - read} batches to hand on one: nodes "
                        "between the loader and the loop hand on one batch for each they read (ranks step "
                        "together and states count batches); merge or split batches in the stream instead "
                        "(Stream(batch_size=...), Packing)"
                    )
                self.before = before
                yield batch
        finally:
            self.source.batches = iter(())

    def _culprit(self) -> str:
        return str(self.names()[0]) if len(self.nodes) == 1 else f"among {self.names()}"

    def load(self, saved: Any) -> None:
        """Reset every node to its state in ``saved`` (checked by :func:`check`)."""
        check(self, saved)
        if saved is None and any(n.state() for n in self.nodes):
            warnings.warn(
                f"this checkpoint was saved without nodes; the loader's nodes {self.names()} start afresh",
                stacklevel=4,
            )
        for i, node in enumerate(self.nodes):
            node.reset(saved[i].get("state") or None if saved is not None else None)
        self.before = None


def check(chain: Chain | None, saved: Any) -> None:
    """Raise :class:`~mmloader.errors.ResumeError` unless ``saved`` (a checkpoint's ``"nodes"``;
    None: it has none) fits ``chain``'s nodes (None: the loader has none)."""
    if saved is None:
        return
    entries = saved if isinstance(saved, list) and all(isinstance(e, dict) for e in saved) else None
    names = None if entries is None else [e.get("node") for e in entries]
    mine = chain.names() if chain is not None else []
    if names != mine:
        raise ResumeError(
            f"the checkpoint's nodes are {names}, this loader's {mine}: a checkpoint resumes into the same "
            "nodes, by name and in order (give loader(nodes=[...]) the nodes it was saved with)"
        )
