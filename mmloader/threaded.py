"""A thread backend for :class:`mmloader.Stream`: the same plan, batches built in this process.

Batches need no pickling and no shared-memory segment to reach the training
loop, and JPEG/PNG decoding (libjpeg-turbo, libpng) releases the GIL, so with
few cores this beats worker processes (see ``benchmarks/RESULTS.md``).
Python-heavy transforms, which hold the GIL, are better served by the process
backend.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import torch

from .stream import Stream

_END = object()


def _decodes_images(stream: Stream) -> bool:
    """Whether batches decode images (work that releases the GIL, so threads run it in parallel)."""
    from .readers.image import ImageReader
    for ds in stream.datasets:
        for reader in getattr(ds, "readers", {}).values():
            if isinstance(reader, ImageReader) and reader.output != "raw":
                return True
    return False


class ThreadLoader:
    """Batches in plan order from threads of this process.

    When batches decode images, ``num_workers`` producer threads each build whole
    batches (j % W == w; decoding releases the GIL, so they run in parallel and
    overlap reading with decoding). Otherwise the work is Python-bound and more
    threads would only fight over the GIL: one producer builds every batch.
    Either way batches arrive in the same order as with the process backend, so
    ``state_dict`` / ``load_state_dict`` mean the same thing. Worker RNGs are not
    reseeded (threads share the process's RNGs).

    >>> loader = mmloader.loader(stream, backend="thread")     # doctest: +SKIP
    """

    def __init__(self, stream: Stream, num_workers: int = 2, prefetch_factor: int = 2,
                 pin_memory: bool = False, producers: int | None = None):
        self.stream = stream
        self.num_workers = max(1, num_workers)
        self.prefetch_factor = max(1, prefetch_factor)
        self.pin_memory = pin_memory
        self.producers = producers

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[Any]:
        self.stream._where()
        producers = self.producers or (self.num_workers if _decodes_images(self.stream) else 1)
        stop = threading.Event()
        queues = [queue.Queue(maxsize=self.prefetch_factor) for _ in range(producers)]

        def put(w: int, item) -> bool:
            while not stop.is_set():
                try:
                    queues[w].put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce(w: int) -> None:
            try:
                for batch in self.stream.iter_worker(w, producers):
                    if not put(w, (None, batch)):
                        return
                put(w, (None, _END))
            except BaseException as e:  # delivered to the consumer, raised there
                put(w, (e, None))

        threads = [threading.Thread(target=produce, args=(w,), daemon=True, name=f"mmloader-{w}")
                   for w in range(producers)]
        for t in threads:
            t.start()
        try:
            j = 0
            while True:  # round-robin: batch j comes from producer j % P, as in a DataLoader
                error, batch = queues[j % producers].get()
                if error is not None:
                    raise error
                if batch is _END:  # batch j does not exist, so no later one does
                    return
                yield _pin(batch) if self.pin_memory else batch
                j += 1
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_pin(v) for v in batch]
    return batch
