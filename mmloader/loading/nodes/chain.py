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

_OWNER = "_mmloader_chain"  # on a node: a weak reference to the chain it reads in (by identity)


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
    """Fresh copies of ``nodes`` for another loader: their sources and loader not copied, each
    reset to its start."""
    out = []
    for node in nodes:
        skip = {id(node.source): None, id(getattr(node, _OWNER, None)): None}
        fresh = copy.deepcopy(node, skip)
        object.__setattr__(fresh, "source", None)
        object.__setattr__(fresh, _OWNER, None)
        fresh.reset(None)
        out.append(fresh)
    return out


def check_list(nodes: Any) -> list[Node[Any]]:
    """``nodes`` as a list, checked (types, each once, none reading from a live loader already)."""
    if isinstance(nodes, Node) or not isinstance(nodes, (list, tuple)):
        raise TypeError(f"loader(nodes=...) takes a list of mmloader.Node, got a {type(nodes).__name__}")
    for i, node in enumerate(nodes):
        if not isinstance(node, Node):
            raise TypeError(
                f"loader(nodes=[...]): item {i} is a {type(node).__name__}, not an mmloader.Node; wrap a "
                "function of batches as mmloader.Map(fn)"
            )
        owner = getattr(node, _OWNER, None)
        if owner is not None and owner() is not None:
            raise ValueError(
                f"loader(nodes=[...]): node {i} ({name_of(node)}) already reads from another loader; make "
                "one node object for each loader (mmloader.loading.nodes.chain.copies(nodes) copies them)"
            )
    if len({id(n) for n in nodes}) != len(nodes):
        raise ValueError("loader(nodes=[...]): a node appears twice; make one object for each place")
    return list(nodes)


class Chain:
    """The user's nodes over a loader's batches (see the module docstring)."""

    def __init__(self, nodes: Sequence[Node[Any]]):
        self.nodes = check_list(nodes)
        self.source = _Delivered()
        upstream: Node[Any] = self.source
        for node in self.nodes:  # (object.__setattr__: a frozen dataclass is a node too)
            object.__setattr__(node, "source", upstream)
            object.__setattr__(node, _OWNER, weakref.ref(self))
            upstream = node
        self.head = upstream
        self.before: list[dict] | None = None  # the node states before the batch delivered last
        self._pass: object | None = None  # the pass whose batches the source holds

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
        """A copy of ``states`` (default: now), checked to be plain data: checkpoints are saved as
        JSON too (HF Trainer), and must come back the same."""
        states = self.states() if states is None else copy.deepcopy(states)
        for entry in states:
            try:
                same = json.loads(json.dumps(entry["state"], allow_nan=False)) == entry["state"]
                why = "JSON would change it: tuples, or keys that are not strings"
            except (TypeError, ValueError) as e:
                same, why = False, str(e)
            if not same:
                raise MMLoaderError(
                    f"node {entry['node']}: its state() is not plain data ({why}): checkpoints are saved as "
                    "JSON too (HF Trainer); give numbers as int/float, arrays as lists, keys as strings"
                )
        return states

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The pass's batches through the nodes, each checked to hand on one batch per batch."""
        token = self._pass = object()
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
                except BaseException:
                    # the batch is delivered again by the next pass: the nodes it went through go back
                    self._reset(before)
                    raise
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
            if self._pass is token:  # (an old pass closed late leaves a newer one's batches alone)
                self.source.batches = iter(())

    def _culprit(self) -> str:
        return str(self.names()[0]) if len(self.nodes) == 1 else f"among {self.names()}"

    def load(self, saved: Any) -> None:
        """Reset every node to its state in ``saved`` (checked by :func:`check`)."""
        check(self, saved)
        if saved is None and any(entry["state"] for entry in self.states()):
            warnings.warn(
                f"this checkpoint was saved without nodes; the loader's nodes {self.names()} start afresh",
                stacklevel=4,
            )
        self._reset(saved)

    def _reset(self, saved: list[dict] | None) -> None:
        for i, node in enumerate(self.nodes):
            state = copy.deepcopy(saved[i].get("state")) if saved is not None else None
            try:
                node.reset(state)
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
