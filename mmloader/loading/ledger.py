"""The data ledger: which samples a step of a stream holds, by arithmetic, reading no sample.

A stored stream's plan is a pure function of its seed, the epoch and the world, so the keys of
any batch of any rank are known without building it, in any process, before or after training:
"which samples were in step 41,200 on rank 3" is a lookup, not a replay. What it gives equals
the ``__key__`` (and ``__source__``) of the batch the loader delivers at that step, on every
backend, for plain, mixed, scheduled, filtered, bucketed and packed streams, and in a resumed
epoch (also one resumed onto another number of ranks: its steps before the resume are those
the saved world planned). A sample skipped under ``errors="skip"`` is the one the plan holds;
the loader delivers the plan's next one in its place and logs it.

Steps count batches within an epoch, per rank, from 0 (all ranks take step ``s`` together).

>>> stream.keys_at(120, rank=3)                 # doctest: +SKIP
['s004211', 's000917', ...]
>>> stream.steps_of("s004211")                  # doctest: +SKIP
[(3, 120)]
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..planning import RangeList
from ..planning.partition import batches_per_rank, worker_batches
from ..planning.quality import Quality, plan_quality


class Ledger:
    """What a stored stream answers about its plan (:class:`mmloader.Stream` has these methods)."""

    def keys_at(self, step: int, rank: int | None = None, epoch: int | None = None) -> list:
        """The ``__key__`` of the batch ``rank`` takes at ``step`` of ``epoch`` (default: the
        current one), without reading a sample; ``rank=None``: every rank's, in a list. Packed
        rows give a list of keys per row.

        Args:
            step: the batch's place in the epoch, per rank, from 0.
            rank: the data-parallel rank (default: all of the world that took the step).
            epoch: the epoch (default: the stream's current one).
        """
        return keys_at(self, step, rank, epoch)

    def sources_at(self, step: int, rank: int | None = None, epoch: int | None = None) -> list:
        """The ``__source__`` of that batch: each sample's source (a mix's name; ``"dataset"``);
        packed rows give a list per row."""
        return sources_at(self, step, rank, epoch)

    def steps_of(self, key: str, epoch: int | None = None, source: str | None = None) -> list[tuple[int, int]]:
        """``(rank, step)`` of each batch of ``epoch`` holding the sample ``key`` (of the mix's
        source named ``source`` alone, if given), in this world."""
        return steps_of(self, key, epoch, source)

    def quality(self, epoch: int | None = None, window_batches: int = 16) -> Quality:
        """How well ``epoch``'s plan mixes (:mod:`mmloader.planning.quality`): each source's share
        in windows of ``window_batches`` batches against its weight, how a shard's samples spread
        over the epoch, how often neighbours share a shard; ``.verdict()`` says it in a line."""
        return quality(self, epoch, window_batches)

    def token_shares(self, epoch: int | None = None) -> dict[str, float]:
        """Each source's share of the tokens of a packed ``epoch`` (what ``mix(weights_by="tokens")``
        keeps at the weights), by source name."""
        return token_shares(self, epoch)


def token_shares(stream: Any, epoch: int | None = None) -> dict[str, float]:
    """Each source's share of the tokens a packed epoch holds (as packed: truncation counted)."""
    if stream.packer is None:
        raise ValueError("token shares are of a packed stream's epoch (lengths=mmloader.Packing(...))")
    e = _epoch(stream, epoch)
    base = stream.plan(e).plan
    sources, indices = base.lookup(np.arange(len(base), dtype=np.int64))
    tokens = np.bincount(sources, weights=stream.packer.lengths(sources, indices), minlength=len(stream.datasets))
    total = max(float(tokens.sum()), 1.0)
    return {name: float(t) / total for name, t in zip(source_names(stream), tokens)}


def quality(stream: Any, epoch: int | None = None, window_batches: int = 16) -> Quality:
    """The mixing measures of ``epoch``'s plan (see :meth:`Ledger.quality`)."""
    e = _epoch(stream, epoch)
    rows = stream.plan(e)
    plan = rows.plan if stream.packer is not None else rows  # packed: the samples the rows hold
    sources, indices = plan.lookup(np.arange(len(plan), dtype=np.int64))
    shards = np.zeros(len(sources), dtype=np.int64)
    offset = 0
    for s, ds in enumerate(stream.datasets):  # one shard id space over every source
        picked = sources == s
        if not hasattr(ds, "shard_of"):
            raise TypeError(f"plan quality reads where samples are stored; a {type(ds).__name__} does not say")
        shards[picked] = offset + ds.shard_of(indices[picked])
        offset += len(ds) + 1
    weights = np.asarray(plan.quotas, dtype=np.float64) if stream.mix is not None else np.ones(1)
    return plan_quality(sources, shards, weights, window_batches * (stream.batch_size or 1))


def keys_at(stream: Any, step: int, rank: int | None = None, epoch: int | None = None) -> list:
    """The ``__key__`` of the batch ``rank`` takes at ``step`` of ``epoch`` (default: the current
    one); ``rank=None``: a list of every rank's. Packed rows give a list of keys per row."""
    return _per_rank(stream, step, rank, epoch, _keys)


def sources_at(stream: Any, step: int, rank: int | None = None, epoch: int | None = None) -> list:
    """The ``__source__`` of that batch: each sample's source name (a mix's; ``"dataset"``
    otherwise); packed rows give a list per row."""
    return _per_rank(stream, step, rank, epoch, _sources)


def steps_of(stream: Any, key: str, epoch: int | None = None, source: str | None = None) -> list[tuple[int, int]]:
    """``(rank, step)`` of every batch of ``epoch`` that holds the sample ``key`` (of any source
    of a mix, or of the one named ``source``; a padding repeat counts): the epoch delivered whole
    in this stream's world, or, for an epoch this stream resumed mid-way, the steps of its own
    pass and of the pass its state was taken in (under the same plan: the saved world's steps),
    as :func:`keys_at` answers them. Empty when those passes leave the sample out."""
    e = _epoch(stream, epoch)
    plan = stream.plan(e)
    names = source_names(stream)
    if source is not None and source not in names:
        raise ValueError(f"no source {source!r} in this stream: its sources are {names}")
    wanted = [(s, _named(ds).index_of(key)) for s, ds in enumerate(stream.datasets) if source in (None, names[s])]
    wanted = [(s, i) for s, i in wanted if i is not None]
    found: list[tuple[int, int]] = []
    bs = stream.batch_size or 1
    balanced = stream.packer is not None and stream.packer.balance  # rows dealt step by step
    for world, visit, first, limit in _passes(stream, e, plan):
        for rank in range(world):
            per_rank = stream._per_rank(plan, visit, world, rank)
            taken = per_rank if limit is None else min(per_rank, limit * bs)
            # the rank's steps as one span (the batches' split, vectorised), or step by step
            spans = list(worker_batches(taken, stream.batch_size, 1, 0)) if balanced else [(0, taken)] * bool(taken)
            specs = list(stream.specs(plan, visit, e, rank, world, per_rank, spans))
            if not specs:
                continue
            positions = np.concatenate([spec[1] for spec in specs])
            if stream.packer is not None:  # positions are rows: find the rows holding the sample
                sources, indices, _members, offsets = plan.samples(positions)
                owner = np.repeat(np.arange(len(positions)), np.diff(offsets))
            else:
                sources, indices = (np.concatenate([spec[k] for spec in specs]) for k in (2, 3))
                owner = np.arange(len(positions))
            hit = np.zeros(len(sources), dtype=bool)
            for s, i in wanted:
                hit |= (sources == s) & (indices == i)
            found += [(rank, first + int(j) // bs) for j in np.unique(owner[hit])]
    return sorted(set(found))


def _passes(stream: Any, e: int, plan) -> list[tuple[int, RangeList, int, int | None]]:
    """(world, visit, first step, steps taken or None for all) of each pass of epoch ``e`` this
    stream can answer for: the epoch whole in its world, or (resumed mid-way) its own pass and
    the one the saved state was taken in, when that was the same plan."""
    world = stream.where()[1]
    record = stream.resumed_epochs.get(e)
    if record is None:
        return [(world, RangeList([(0, len(plan))]), 0, None)]
    passes: list[tuple[int, RangeList, int, int | None]] = [(world, RangeList(record["ranges"]), record["steps"], None)]
    saved = record["state"]
    if saved.get("plan") == stream.identity():
        taken = -(-int(saved["consumed"]) // (stream.batch_size or 1))  # its last batch may be short
        passes.append((int(saved["world"]), RangeList(saved["ranges"]), record["steps"] - taken, taken))
    return passes


def _per_rank(stream: Any, step: int, rank: int | None, epoch: int | None, what) -> list:
    world = stream.where()[1]
    if rank is None:
        return [what(stream, *_batch(stream, step, r, epoch)) for r in range(_world_at(stream, step, epoch, world))]
    return what(stream, *_batch(stream, step, rank, epoch))


def _world_at(stream: Any, step: int, epoch: int | None, world: int) -> int:
    """The number of ranks that took ``step``: the saved world's, for a step before a resume."""
    e = _epoch(stream, epoch)
    record = stream.resumed_epochs.get(e)
    if record is None or step >= record["steps"]:
        return world
    return int(record["state"]["world"])


def _epoch(stream: Any, epoch: int | None) -> int:
    return stream.epoch if epoch is None else int(epoch)


def _per_sample(stream: Any, plan, positions, sources, indices, value: Callable[[int, int], Any]) -> list:
    """``value(source, index)`` of each sample of a batch; packed rows give a list per row."""
    if stream.packer is None:
        return [value(a, b) for a, b in zip(sources.tolist(), indices.tolist())]
    s, i, _members, offsets = plan.samples(positions)
    flat = [value(a, b) for a, b in zip(s.tolist(), i.tolist())]
    return [flat[offsets[j] : offsets[j + 1]] for j in range(len(positions))]


def _keys(stream: Any, plan, positions, sources, indices) -> list:
    return _per_sample(stream, plan, positions, sources, indices, lambda s, i: _named(stream.datasets[s]).key(i))


def _named(dataset: Any) -> Any:
    """``dataset``, which must name its samples (``key``, ``index_of``: :func:`mmloader.zip`'s do)."""
    if not (hasattr(dataset, "key") and hasattr(dataset, "index_of")):
        raise TypeError(
            f"the data ledger reads sample keys from the datasets; a {type(dataset).__name__} names none "
            "(stream the readers zipped: mmloader.zip(...))"
        )
    return dataset


def source_names(stream: Any) -> list[str]:
    """The names ``__source__`` gives the stream's sources: a mix's, else ``["dataset"]``."""
    return list(stream.mix.names) if stream.mix is not None else ["dataset"]


def sources_holding(stream: Any, key: str) -> list[str]:
    """The names of the sources that hold a sample ``key`` (a mix's sources may share keys)."""
    names = source_names(stream)
    return [names[s] for s, ds in enumerate(stream.datasets) if _named(ds).index_of(key) is not None]


def _sources(stream: Any, plan, positions, sources, indices) -> list:
    names = source_names(stream)
    return _per_sample(stream, plan, positions, sources, indices, lambda s, _i: names[s])


def _batch(stream: Any, step: int, rank: int, epoch: int | None) -> tuple:
    """(plan, positions, sources, indices) of ``rank``'s batch at ``step``."""
    e, world, plan, visit, before = _pass(stream, epoch, step)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside the world of {world} that took step {step}")
    per_rank = stream._per_rank(plan, visit, world, rank)
    steps = batches_per_rank(per_rank, stream.batch_size)
    j = step - before
    if not steps:
        raise IndexError(f"step {step} of epoch {e}: the epoch has no step on {world} rank(s) (drop_last left none)")
    if not 0 <= j < steps:
        raise IndexError(f"step {step} of epoch {e}: the epoch's steps per rank are {before}..{before + steps - 1}")
    bs = stream.batch_size or 1
    span = (j * bs, min((j + 1) * bs, per_rank))
    _plan, positions, sources, indices, _seed, _valid = next(
        stream.specs(plan, visit, e, rank, world, per_rank, [span])
    )
    return plan, positions, sources, indices


def _pass(stream: Any, epoch: int | None, step: int) -> tuple[int, int, Any, RangeList, int]:
    """(epoch, world, plan, visit, steps before it) of the pass that delivered ``step``: the
    epoch whole, else (an epoch resumed mid-way) the resumed part of it, else (a step before the
    resume) the pass the saved state was taken in, as the saved world planned it (:func:`_passes`)."""
    e = _epoch(stream, epoch)
    plan = stream.plan(e)
    whole = e not in stream.resumed_epochs
    for world, visit, first, _taken in _passes(stream, e, plan):  # its own pass first
        if whole or step >= first:
            return e, world, plan, visit, first
    raise ValueError(
        f"step {step} of epoch {e} was delivered before the state this stream resumed from "
        "was taken (by an earlier pass, or under another plan): ask the stream that delivered it"
    )
