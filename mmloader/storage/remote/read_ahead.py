"""Read-ahead along the plan for stores read by ranged requests (:class:`ReadAhead`).

The plan is blockwise (runs of ``block_size`` consecutive samples, shuffled within a window), so
the first sample read from a region of a shard announces the rest of that region within the
window. The first touch of a chunk of consecutive samples (about ``chunk_bytes``) plans one large
ranged GET for it, started in the background after the batch's own reads (:meth:`ReadAhead.start`),
and is itself served by a small ranged GET; later samples of the chunk are sliced from it. Chunks
in memory never exceed ``budget`` bytes; a chunk is dropped as soon as each of its samples has
been served once (so memory follows the window), or when it has sat unused while room is needed.

The store it serves provides ``shards`` (manifest entries with ``file``, ``count`` and
``bytes``), ``_shard_index(s)`` (the shard's offset table: rows x fields x (offset, size)) and
``location.start_range(name, start, end)`` (a future of those bytes).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Any, Protocol

import numpy as np


class RangedStore(Protocol):
    """What a :class:`ReadAhead` reads of its store (a :class:`~.tar.RemoteTarStore`;
    declared here so that the two modules do not import each other)."""

    @property
    def shards(self) -> list[dict]: ...

    location: Any  # start_range(name, start, end) -> a concurrent.futures.Future of the bytes

    def _shard_index(self, s: int) -> np.ndarray:
        """Shard ``s``'s offset table: rows x fields x (offset, size), -1 where absent."""
        ...


class _Chunk:
    __slots__ = ("start", "end", "first", "served", "remaining", "future", "data", "nbytes", "used")

    def __init__(self, start: int, end: int, first: int, served: np.ndarray, future):
        self.start, self.end, self.first = start, end, first
        self.served = served
        self.remaining = int((~served).sum())
        self.future = future
        self.data: bytes | None = None
        self.nbytes = end - start
        self.used = time.monotonic()


class ReadAhead:
    """Chunks of consecutive samples fetched ahead, within ``budget`` bytes (see module doc)."""

    STALE_S = 5.0  # a chunk unused this long may be dropped when room is needed

    def __init__(self, store: RangedStore, budget: int, chunk_bytes: int):
        self.store, self.budget, self.chunk_bytes = store, budget, chunk_bytes
        self.lock = threading.Lock()
        self.chunks: OrderedDict[tuple[int, int], _Chunk] = OrderedDict()
        self.held = 0
        self.seen: dict[int, np.ndarray] = {}
        self.rows_per_chunk: dict[int, int] = {}
        self.planned: list[tuple[int, _Chunk]] = []
        self.queue: deque[tuple[int, _Chunk]] = deque()
        self.inflight = 0
        self.fetched = 0  # bytes fetched as chunks (for the benchmark's bytes-per-sample)

    def _rows(self, s: int) -> int:
        r = self.rows_per_chunk.get(s)
        if r is None:
            shard = self.store.shards[s]
            r = self.rows_per_chunk[s] = max(1, int(self.chunk_bytes * shard["count"] // max(shard["bytes"], 1)))
        return r

    def _span(self, s: int, first: int, last: int) -> tuple[int, int]:
        table = self.store._shard_index(s)[first:last]
        offs, sizes = table[..., 0], table[..., 1]
        present = offs >= 0
        if not present.any():
            return 0, 0
        return int(offs[present].min()) - 512, int((offs + sizes)[present].max())

    def serve(self, s: int, row: int, a: int, b: int):
        """``(buffer, base)`` holding bytes ``[a, b)`` of shard ``s`` (sample row ``row``) from a
        chunk that has arrived; None when this read goes its own way: the first read of a region
        (which plans a chunk for the rest of it), or one whose chunk is still on its way (a small
        read now beats waiting behind a large one)."""
        r = self._rows(s)
        c = row // r
        with self.lock:
            chunk = self.chunks.get((s, c))
            seen = self.seen.get(s)
            if seen is None:
                seen = self.seen[s] = np.zeros(self.store.shards[s]["count"], dtype=bool)
            first = c * r
            if chunk is None:
                last = min(first + r, len(seen))
                if seen[row]:  # served before: a new pass over this region
                    seen[first:last] = False
                seen[row] = True
                start, end = self._span(s, first, last)
                if end - start > self.budget or not self._room(end - start):
                    return None
                chunk = self.chunks[(s, c)] = _Chunk(start, end, first, seen[first:last].copy(), None)
                self.held += chunk.nbytes
                self.planned.append((s, chunk))  # started after this batch's own reads (see start)
                return None
            self.chunks.move_to_end((s, c))
            chunk.used = time.monotonic()
            if chunk.data is None:
                future = chunk.future
                if future is None or not future.done():
                    self._served(chunk, s, c, row, seen)  # read directly, now
                    return None
                chunk.future = None
                try:
                    chunk.data = bytes(future.result())
                except Exception:  # the direct read reports the problem (or succeeds)
                    self._drop(s, c, chunk)
                    return None
            if not (chunk.start <= a and b <= chunk.end):
                return None
            self._served(chunk, s, c, row, seen)
            return chunk.data, chunk.start

    def _served(self, chunk: _Chunk, s: int, c: int, row: int, seen: np.ndarray) -> None:
        seen[row] = True
        k = row - chunk.first
        if not chunk.served[k]:
            chunk.served[k] = True
            chunk.remaining -= 1
            if chunk.remaining <= 0:
                self._drop(s, c, chunk)  # every sample served once: the memory goes back

    def _drop(self, s: int, c: int, chunk: _Chunk) -> None:
        if self.chunks.get((s, c)) is chunk:
            del self.chunks[(s, c)]
            self.held -= chunk.nbytes

    def start(self) -> None:
        """Queue the chunks planned so far. Called after a batch's own reads were sent, so the
        first batches are not queued behind the large reads they announce; at most
        ``MAX_IN_FLIGHT`` chunks are fetched at once, so each arrives soon rather than all late."""
        with self.lock:
            self.queue.extend(self.planned)
            self.planned = []
        self._launch()

    MAX_IN_FLIGHT = 8

    def _launch(self) -> None:
        while True:
            with self.lock:
                if self.inflight >= self.MAX_IN_FLIGHT or not self.queue:
                    return
                s, chunk = self.queue.popleft()
                if self.chunks.get((s, (chunk.first // self._rows(s)))) is not chunk:
                    continue  # dropped meanwhile (all its samples served directly)
                self.inflight += 1
                self.fetched += chunk.nbytes
            future = self.store.location.start_range(self.store.shards[s]["file"], chunk.start, chunk.end)
            chunk.future = future
            future.add_done_callback(self._landed)

    def _landed(self, _future) -> None:
        with self.lock:
            self.inflight -= 1
        self._launch()

    def _room(self, nbytes: int) -> bool:
        if self.held + nbytes <= self.budget:
            return True
        now = time.monotonic()
        for key, chunk in list(self.chunks.items()):  # least recently used first
            if self.held + nbytes <= self.budget:
                break
            if chunk.future is None and chunk.data is not None and now - chunk.used > self.STALE_S:
                del self.chunks[key]
                self.held -= chunk.nbytes
        return self.held + nbytes <= self.budget

    def clear(self) -> None:
        with self.lock:
            self.chunks.clear()
            self.held = 0
