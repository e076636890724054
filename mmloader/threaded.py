"""A thread backend for :class:`mmloader.Stream`: the same plan, batches built in threads.

JPEG/PNG decoding (libjpeg-turbo, libpng) and file reads release the GIL, so
threads decode in parallel while batches need no pickling and no shared-memory
segment to reach the training loop: on few cores this is faster than worker
processes (see ``benchmarks/RESULTS.md``). Python-heavy transforms, which hold
the GIL, are better served by the process backend.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import torch

from .stream import Stream

_END = object()


class ThreadLoader:
    """Round-robin over ``num_workers`` threads, each producing batches j with j % W == w.

    Batches arrive in the same order as with the process backend (plan order), so
    ``state_dict`` / ``load_state_dict`` mean the same thing. Worker RNGs are not
    reseeded (threads share the process's RNGs).

    >>> loader = mmloader.loader(stream, backend="thread")     # doctest: +SKIP
    """

    def __init__(self, stream: Stream, num_workers: int = 2, prefetch_factor: int = 2,
                 pin_memory: bool = False):
        self.stream = stream
        self.num_workers = max(1, num_workers)
        self.prefetch_factor = max(1, prefetch_factor)
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[Any]:
        self.stream._where()
        workers = self.num_workers
        stop = threading.Event()
        queues = [queue.Queue(maxsize=self.prefetch_factor) for _ in range(workers)]

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
                for batch in self.stream.iter_worker(w, workers):
                    if not put(w, (None, batch)):
                        return
                put(w, (None, _END))
            except BaseException as e:  # delivered to the consumer, raised there
                put(w, (e, None))

        threads = [threading.Thread(target=produce, args=(w,), daemon=True, name=f"mmloader-{w}")
                   for w in range(workers)]
        for t in threads:
            t.start()
        try:
            j = 0
            while True:
                error, batch = queues[j % workers].get()
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
