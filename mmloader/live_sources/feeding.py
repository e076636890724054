"""How one builder's batches of a live pass are made (a DataLoader worker, or one of the thread
backend's producers): which slice and step each reads, its stored part, and its live samples,
taken in planned order and decoded. Apart from :mod:`.stream`, which sizes, saves and delivers
the pass: this is what runs where the batches are built."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import LiveSourceError, SampleError
from ..readers.seeding import batch_seed, enter_batch
from ..readers.timing import timed
from .fetch import Fetcher
from .steps import is_live_step, stored_by_step

log = logging.getLogger("mmloader")

_EMPTY = np.zeros(0, dtype=np.int64)


def batch_tasks(
    stream: Any, worker: int = 0, workers: int = 1, seed_globals: bool = False, readers: int | None = None
) -> Iterator[Callable[[], Any]]:
    """:meth:`mmloader.LiveStream.batch_tasks` of ``stream``: step ``j`` of the pass is built by
    worker ``j % workers`` and reads slice ``(before + j) % readers`` of its rank."""
    seed_globals = seed_globals and bool(stream.python_work())
    rank, world = stream.where()
    total, before, epoch = stream.remaining(), stream._steps_before, stream.epoch
    stored = _stored_parts(stream, worker, workers, before)
    slices = readers or workers
    layout = {"world": world, "workers": slices}
    fetchers: dict[int, Fetcher] = {}
    tickets: dict[int, int] = {}
    try:
        for j in range(worker, total, workers):
            # Step g of the epoch reads slice g % slices, whichever worker builds it: a pass
            # always starts at worker 0 (the DataLoader's round robin), a resumed one at `before`.
            part = (before + j) % slices
            slice_key = f"{rank}/{part}"
            fetcher = fetchers.get(part)
            if fetcher is not None and fetcher.finished:  # its source ended or stalled: no later step
                return
            step = before + j
            live_step = stream.composition == "sample" or is_live_step(step, stream.share)
            n_live = (stream.live_rows if stream.composition == "sample" else stream.batch_size) if live_step else 0
            planned = None
            if stream.stored is not None and n_live < stream.batch_size:
                planned = next(stored, None)
                if planned is None:  # (never: the pass is no longer than the stored epoch)
                    return
            if n_live and fetcher is None:
                fetcher = fetchers[part] = stream.slices.open(rank, world, part, slices, slice_key, layout)
            if planned is not None:
                plan, positions, sources, indices, seed, _valid = planned
            else:
                plan, positions, sources, indices = None, _EMPTY, _EMPTY, _EMPTY
                seed = functools.partial(batch_seed, stream.seed, epoch, rank, step)
            info = {"step": j, "slice": slice_key if n_live else None, "layout": layout}
            yield functools.partial(
                _build,
                stream,
                plan,
                positions,
                sources,
                indices,
                n_live,
                fetcher if n_live else None,
                tickets.get(part, 0) if n_live else None,
                seed,
                seed_globals,
                info,
            )
            if n_live:
                tickets[part] = tickets.get(part, 0) + 1
    except GeneratorExit:  # the pass was left: nothing will take what is read
        for opened in fetchers.values():
            opened.close()
        raise


def _stored_parts(stream: Any, worker: int, workers: int, before: int) -> Iterator[tuple | None]:
    """The stored part of each of this reader's steps that has one, in order."""
    if stream.stored is None:
        return iter(())
    if stream.composition == "sample":  # stored batch j is step j's, built by the same reader
        return stream.stored.planned(worker, workers)
    return stored_by_step(stream.stored.planned(0, 1), worker, workers, before, stream.share)


def _build(
    stream: Any,
    plan,
    positions,
    sources,
    indices,
    n_live: int,
    fetcher: Fetcher | None,
    ticket: int | None,
    seed: int | Callable[[], int],
    seed_globals: bool,
    info: dict,
) -> tuple[Any, dict]:
    """``(batch, info)``; ``(None, info)`` with ``info["ended"]`` when the source ended or
    stalled before the batch could be made (the loader then ends the pass)."""
    enter_batch(seed, seed_globals)
    clock = stream.control.batch_clock()
    samples: list = []
    info = dict(info)
    if fetcher is not None:
        with timed("read"):  # (the source's own pace: a live source's read is waiting for it)
            taken = fetcher.take(n_live, stream.source.timeout, stream.source.on_stall, ticket)
        samples, info["state"] = taken.samples, taken.state
        if taken.short is not None:
            log.info("%s %s at step %d", fetcher.where, taken.short, info["step"])
            if not samples or stream.drop_last or plan is not None:
                info["ended"] = taken.short
                return None, info
            info["short"] = taken.short
    keys = [f"{stream.live_name}/{info['slice']}/{info['step']}/{i}" for i in range(len(samples))]
    rows = [row for row in (_row(stream, sample, key) for sample, key in zip(samples, keys)) if row is not None]
    if samples and not rows and plan is None:
        raise LiveSourceError(f"live source {stream.live_name!r}: every sample of step {info['step']} failed to decode")
    batch = stream.builder.build_with_rows(plan, positions, sources, indices, rows)
    clock.done()
    return batch, info


def _row(stream: Any, sample: Any, key: str) -> dict | None:
    """One live sample decoded; with ``on_error="skip"`` a bad one is left out of its batch
    (counted in :attr:`mmloader.LiveStream.skipped`, logged with its key) and None returned: a replacement would
    come from later in the source, outside the batch's checkpointed position."""
    try:
        row = stream.source.decode_sample(sample, key)
    except SampleError as e:
        if stream.on_error == "raise":
            raise
        stream.control.skip("live sample (its batch is one row short)", e)
        return None
    if stream.stored is not None:
        row["__source__"] = stream.live_name
    return row
