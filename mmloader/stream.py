"""``mmloader.Stream``: an epoch plan streamed to one rank's DataLoader workers."""
from __future__ import annotations

import functools
import itertools
import logging
import random
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.utils.data

from .batching import Collate, collate, collate_columns
from .distributed import rank_and_world
from .errors import MMLoaderError, SampleError
from .planning import RangeList, rank_positions, remaining_ranges, samples_per_rank, worker_batches
from .planning.bucketing import BucketedOrder
from .planning.mixing import SingleOrder
from .planning.partition import batches_per_rank

log = logging.getLogger("mmloader")
PLAN_CHUNK_BATCHES = 16  # batches a worker plans per call (shuffle + partition lookups are vectorised)

# Slots of the shared state tensor: the main process writes, workers (also
# persistent ones, under fork or spawn) read at the start of every epoch.
_EPOCH, _RANK, _WORLD, _RESUMING = range(4)


class Stream(torch.utils.data.IterableDataset):
    """Deterministic, rank- and worker-aware stream over a map-style dataset (or a :func:`mix`).

    * The epoch's order is a pure function of ``(seed, epoch)`` (blockwise shuffle:
      blocks of ``block_size`` samples, shuffled within ``window_blocks`` blocks),
      independent of world size and worker count.
    * Each rank gets an equal contiguous part, at sample granularity; padding
      (repeating from the plan's start) or ``drop_last`` keeps batch counts equal.
    * With ``batch_size``, workers build whole batches (use ``mmloader.loader``).
    * ``on_error="skip"`` replaces a bad sample with the next one in the plan
      (counted in ``skipped``, logged with its key), so batch counts stay equal.
    * ``bucket_by`` (a modality name — its stored byte size is the length — or a
      callable ``index -> length``) groups samples of similar length into batches
      within windows of ``bucket_window`` batches, to cut padding.

    >>> stream = Stream(dataset, batch_size=64, seed=0)     # doctest: +SKIP
    >>> for epoch in range(10):                             # doctest: +SKIP
    ...     stream.set_epoch(epoch)
    ...     for batch in mmloader.loader(stream): ...
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, *, block_size: int = 1024, window_blocks: int = 16,
                 collate_fn: Callable[[list], Any] | None = collate, on_error: str = "raise",
                 max_consecutive_errors: int = 100, seed_workers: bool = True,
                 bucket_by: str | Callable[[int], int] | None = None, bucket_window: int = 64):
        from .mixture import Mix
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be >= 1 or None")
        self.mix = dataset if isinstance(dataset, Mix) else None
        if self.mix is None:
            try:
                len(dataset)
            except TypeError:
                raise TypeError(f"Stream needs a dataset with a known length, got {type(dataset).__name__}") \
                    from None
        if self.mix is not None and self.mix.composition == "source" and not batch_size:
            raise ValueError("mix(batch_composition='source') needs Stream(batch_size=...)")
        self.datasets = self.mix.datasets if self.mix is not None else [dataset]
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, int(seed), drop_last
        self.block_size, self.window_blocks = block_size, window_blocks
        self.collate_fn, self.on_error, self.max_consecutive_errors = collate_fn, on_error, max_consecutive_errors
        self.seed_workers = seed_workers
        if bucket_by is not None and not batch_size:
            raise ValueError("bucket_by needs batch_size")
        if isinstance(bucket_by, str) and self.mix is None:
            readers = getattr(dataset, "readers", {})
            if bucket_by not in readers:
                raise ValueError(f"bucket_by={bucket_by!r} is not a modality of the dataset ({sorted(readers)})")
        self.bucket_by, self.bucket_window = bucket_by, bucket_window
        self._state = torch.zeros(4, dtype=torch.int64).share_memory_()
        self._resume: dict | None = None
        self.skipped = 0

    # -- epoch, place in the world, resume -------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._state[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's plan; persistent workers see it on their next pass."""
        self._state[_EPOCH] = int(epoch)
        self._state[_RESUMING] = 0

    def set_world(self, rank: int, world: int) -> None:
        """Fix (rank, world); by default they are detected at first use."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world {world}")
        self._state[_RANK], self._state[_WORLD] = rank, world

    def _where(self) -> tuple[int, int]:
        if int(self._state[_WORLD]) == 0:
            rank, world = rank_and_world()
            self._state[_RANK], self._state[_WORLD] = rank, world
        return int(self._state[_RANK]), int(self._state[_WORLD])

    def plan(self, epoch: int | None = None):
        """The epoch plan: ``len(plan)`` positions, ``plan.lookup(positions) -> (source, index)``."""
        e = self.epoch if epoch is None else epoch
        opts = dict(seed=self.seed, epoch=e, shuffle=self.shuffle, block_size=self.block_size,
                    window_blocks=self.window_blocks)
        if self.mix is not None:
            unit = self.batch_size if self.mix.composition == "source" else 1
            plan = self.mix.order(unit=unit, **opts)
        else:
            plan = SingleOrder(len(self.datasets[0]), **opts)
        if self.bucket_by is not None:
            plan = BucketedOrder(plan, self._lengths, self.batch_size, self.bucket_window, self.seed, e)
        return plan

    def _lengths(self, sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if callable(self.bucket_by):
            return np.array([self.bucket_by(int(i)) if self.mix is None else self.bucket_by(int(s), int(i))
                             for s, i in zip(sources, indices)])
        out = np.zeros(len(indices), dtype=np.int64)
        for n, (s, i) in enumerate(zip(sources.tolist(), indices.tolist())):
            ds = self.datasets[s]
            reader = getattr(ds, "readers", {}).get(self.bucket_by)
            if reader is not None:
                pos = int(ds.positions[i]) if getattr(ds, "positions", None) is not None else i
                if getattr(ds, "by_key", False):  # the reader's store may order samples differently
                    pos = reader.store.index_of(ds.key(i))
                out[n] = reader.store.field_size(pos, reader.field)
        return out

    def _visit(self, plan) -> RangeList:
        r = self._resume
        if int(self._state[_RESUMING]) and r is not None and r["epoch"] == self.epoch:
            return RangeList(r["ranges"])
        return RangeList([(0, len(plan))])

    def _per_rank(self, plan, visit: RangeList, world: int) -> int:
        if plan.unit > 1:  # whole single-source batches
            return samples_per_rank(len(visit) // plan.unit, world, None, self.drop_last) * plan.unit
        return samples_per_rank(len(visit), world, self.batch_size, self.drop_last)

    def _layout(self):
        """(rank, world, plan, visit, samples per rank) of the current epoch."""
        rank, world = self._where()
        plan = self.plan()
        visit = self._visit(plan)
        return rank, world, plan, visit, self._per_rank(plan, visit, world)

    def geometry(self) -> dict[str, int]:
        """Plan length, samples and batches per rank for the current epoch and world."""
        rank, world, plan, visit, per_rank = self._layout()
        return {"plan": len(plan), "visit": len(visit), "world": world, "rank": rank,
                "samples_per_rank": per_rank, "batches_per_rank": batches_per_rank(per_rank, self.batch_size),
                "padding": max(per_rank * world - len(visit), 0)}

    def __len__(self) -> int:
        """Batches per rank when batching, else samples per rank."""
        g = self.geometry()
        return g["batches_per_rank"] if self.batch_size else g["samples_per_rank"]

    def progress(self, batches_seen: int) -> dict:
        """A resumable state after this rank delivered ``batches_seen`` batches (all ranks step together)."""
        _rank, world, plan, visit, per_rank = self._layout()
        return {"version": 1, "seed": self.seed, "epoch": self.epoch, "world": world,
                "plan_len": len(plan), "ranges": visit.as_list(), "samples_per_rank": per_rank,
                "consumed": min(batches_seen * (self.batch_size or 1), per_rank),
                "batch_size": self.batch_size, "drop_last": self.drop_last}

    def resume(self, state: dict) -> None:
        """Continue ``state``'s epoch with only the samples it had not delivered.

        Same world size: the remaining batches are exactly those of an uninterrupted
        run. Another world size or worker count: every unseen sample exactly once.
        """
        if state.get("version") != 1:
            raise MMLoaderError(f"unknown stream state version {state.get('version')!r}")
        if state["seed"] != self.seed:
            raise MMLoaderError(f"state was saved with seed {state['seed']}, this stream has seed {self.seed}")
        self._state[_EPOCH] = state["epoch"]
        plan = self.plan()
        if len(plan) != state["plan_len"]:
            raise MMLoaderError(f"the dataset changed since the state was saved: the epoch plan has "
                                f"{len(plan)} positions, the state {state['plan_len']}")
        _rank, world = self._where()
        ranges = remaining_ranges(state["ranges"], state["world"], state["samples_per_rank"],
                                  state["consumed"], keep_padding=world == state["world"])
        self._resume = {"epoch": state["epoch"], "ranges": ranges}
        self._state[_RESUMING] = 1

    def end_of_pass(self) -> None:
        """Called when a full pass over the epoch finished: a repeat pass is a full epoch."""
        self._state[_RESUMING] = 0

    @property
    def _columnar(self):
        """The column collate to use with ``get_batch``, or None when the batch path does not apply."""
        if self.mix is not None or not hasattr(self.datasets[0], "get_batch"):
            return None
        if self.collate_fn is collate:
            return collate_columns
        if isinstance(self.collate_fn, Collate):
            return self.collate_fn.columns
        return None

    # -- iteration (runs in the DataLoader workers) ---------------------------
    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.iter_worker(worker, workers, seed_rngs=info is not None and self.seed_workers)

    def iter_worker(self, worker: int, workers: int, seed_rngs: bool = False) -> Iterator[Any]:
        """The batches (or samples) worker ``worker`` of ``workers`` produces: j % workers == worker."""
        for build in self.batch_tasks(worker, workers, seed_rngs):
            yield build()

    def batch_tasks(self, worker: int = 0, workers: int = 1, seed_rngs: bool = False) -> Iterator[Callable[[], Any]]:
        """What :meth:`iter_worker` yields, as zero-argument callables that build each batch
        (or sample) when called: planning stays in order here, building can happen on any
        thread (the thread backend's producers take them from one shared sequence)."""
        rank, world, plan, visit, per_rank = self._layout()
        if seed_rngs:
            s = int(np.random.SeedSequence([self.seed, self.epoch, rank, worker]).generate_state(1)[0])
            random.seed(s)
            np.random.seed(s)
            torch.manual_seed(s)
        for positions, sources, indices in self._planned(
                worker_batches(per_rank, self.batch_size, workers, worker), visit, plan, rank, world, per_rank):
            yield functools.partial(self._build, plan, positions, sources, indices)

    def _build(self, plan, positions: np.ndarray, sources: np.ndarray, indices: np.ndarray) -> Any:
        if self.batch_size and self._columnar is not None:
            try:  # whole-batch path: one store call per store, raw images packed directly
                return self._columnar(self.datasets[0].get_batch(indices.tolist()))
            except SampleError:
                pass  # the per-sample path below reports (or skips) the culprit by key
        samples = [self._fetch(plan, int(p), int(s), int(i)) for p, s, i in zip(positions, sources, indices)]
        if self.batch_size:
            return self.collate_fn(samples) if self.collate_fn is not None else samples
        return samples[0]

    @staticmethod
    def _planned(spans: Iterator[tuple[int, int]], visit, plan, rank: int, world: int, per_rank: int,
                 chunk: int = PLAN_CHUNK_BATCHES) -> Iterator[tuple]:
        """``(positions, sources, indices)`` per batch span, planned ``chunk``
        batches per call: the planning functions cost mostly per call, not per sample."""
        spans = iter(spans)
        while group := list(itertools.islice(spans, chunk)):
            flat = np.concatenate([rank_positions(len(visit), world, rank, per_rank, a, b) for a, b in group])
            positions = visit.take(flat)
            sources, indices = plan.lookup(positions)
            o = 0
            for a, b in group:
                n = b - a
                yield positions[o:o + n], sources[o:o + n], indices[o:o + n]
                o += n

    def _fetch(self, plan, position: int, source: int, index: int) -> Any:
        for _ in range(self.max_consecutive_errors + 1):
            try:
                sample = self.datasets[source][index]
                if self.mix is not None and isinstance(sample, dict):
                    sample = {**sample, "__source__": self.mix.names[source]}
                return sample
            except SampleError as e:
                if self.on_error == "raise":
                    raise
                self.skipped += 1
                log.warning("skipping sample (replaced by the next in the plan): %s", e)
                position = (position + 1) % len(plan)
                (s,), (i,) = plan.lookup(np.array([position]))
                source, index = int(s), int(i)
        raise MMLoaderError(f"{self.max_consecutive_errors} consecutive samples failed to load; "
                            "the dataset looks broken (run `mmloader verify`)")
