"""The nodes a user puts between the loader and the training loop, run and checkpointed.

``mmloader.loader(stream, nodes=[a, b])`` makes the graph ``batches -> a -> b``: the backend's
batches of the pass under way are its source, and each node reads the one before it. Every node
hands on one batch for each it reads: ranks deliver equal numbers of batches, and the loader's
state, which counts batches, stays true. A node that takes two, hands on nothing, or ends the
pass early, is stopped with an error naming it (left alone, one rank would wait for the others
for good). A node reads from one loader: putting it into a second one while the first lives is
refused.

States: ``loader.state_dict()["nodes"]`` holds each node's name and :meth:`~.base.Node.state`
(copied, checked to be plain data); ``load_state_dict`` resets each node to (a copy of) its own.
A checkpoint resumes only into the same nodes (by name, in order); one saved before any node
was put in starts them afresh, with a warning. Frameworks save one rank's checkpoint for all: a
node's state should be the same on every rank (a count of steps, a schedule), not a statistic of
the rank's own rows.
"""

from __future__ import annotations

import copy
import json
import warnings
import weakref
from typing import Any, Iterator, Sequence

from ...errors import MMLoaderError, ResumeError
from .base import Node

#: node -> the chain it reads in (a node reads from one loader at a time)
_BOUND: weakref.WeakKeyDictionary[Node[Any], weakref.ref[Chain]] = weakref.WeakKeyDictionary()


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


def copies(nodes: Sequence[Node[Any]]) -> list[Node[Any]]:
    """Fresh copies of ``nodes`` for another loader (their sources are not copied)."""
    out = []
    for node in nodes:
        source, node.source = node.source, None
        try:
            out.append(copy.deepcopy(node))
        finally:
            node.source = source
    return out


class Chain:
    """The user's nodes over a loader's batches (see the module docstring)."""

    def __init__(self, nodes: Sequence[Node[Any]]):
        if isinstance(nodes, Node) or not isinstance(nodes, (list, tuple)):
            raise TypeError(f"loader(nodes=...) takes a list of mmloader.Node, got a {type(nodes).__name__}")
        nodes = list(nodes)
        for i, node in enumerate(nodes):
            if not isinstance(node, Node):
                raise TypeError(
                    f"loader(nodes=[...]): item {i} is a {type(node).__name__}, not an mmloader.Node; wrap a "
                    "function of batches as mmloader.Map(fn)"
                )
            owner = _BOUND.get(node)
            if owner is not None and owner() is not None:
                raise ValueError(
                    f"loader(nodes=[...]): node {i} ({name_of(node)}) already reads from another loader; make "
                    "one node object for each loader (mmloader.loading.nodes.chain.copies(nodes) copies them)"
                )
        if len({id(n) for n in nodes}) != len(nodes):
            raise ValueError("loader(nodes=[...]): a node appears twice; make one object for each place")
        self.nodes = nodes
        self.source = _Delivered()
        upstream: Node[Any] = self.source
        for node in nodes:
            node.source = upstream
            _BOUND[node] = weakref.ref(self)
            upstream = node
        self.head = upstream
        self.before: list[dict] | None = None  # the node states before the batch delivered last
        self.tracking = False  # `before` kept for every batch (a read-ahead stage asked for it)

    def names(self) -> list[str]:
        return [name_of(n) for n in self.nodes]

    def states(self) -> list[dict]:
        """Each node's name and a copy of its state, as a checkpoint holds them."""
        out = []
        for node in self.nodes:
            try:
                state = copy.deepcopy(node.state())
            except Exception as e:
                raise MMLoaderError(f"node {name_of(node)}: its state() failed: {type(e).__name__}: {e}") from e
            out.append({"node": name_of(node), "state": state})
        return out

    def saved(self, states: list[dict] | None = None) -> list[dict]:
        """``states`` (default: now), checked to be plain data: a checkpoint is saved as JSON too."""
        states = self.states() if states is None else states
        for entry in states:
            try:
                json.dumps(entry["state"], allow_nan=False)
            except (TypeError, ValueError) as e:
                raise MMLoaderError(
                    f"node {entry['node']}: its state() is not plain data ({e}): checkpoints are saved as JSON "
                    "too (HF Trainer); give numbers as int/float, arrays as lists"
                ) from None
        return states

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The pass's batches through the nodes, each checked to hand on one batch per batch."""
        self.source.batches, self.source.ended = batches, False
        del batches  # held by the source only, and dropped with the pass (its workers stop at once)
        self.before = self.states()  # (the one state() call per pass a plain loop pays)
        first = True
        try:
            while True:
                before = self.states() if self.tracking and not first else self.before
                first, read = False, self.source.read
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
                if batch is None:
                    raise MMLoaderError(f"node {self._culprit()} handed on None for a batch: return the batch")
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
            state = copy.deepcopy(saved[i].get("state")) if saved is not None else None
            try:
                node.reset(state or None)
            except Exception as e:
                raise MMLoaderError(f"node {name_of(node)}: its reset(state) failed: {type(e).__name__}: {e}") from e
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
