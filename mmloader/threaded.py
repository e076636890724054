"""A thread backend for :class:`mmloader.Stream`: the same plan, batches built in this process.

One producer thread walks the rank's batches in plan order (the Python-level
work: plan lookups, store reads, collate — more threads would only fight over
the GIL), and a pool of ``num_workers`` threads decodes each batch's images in
parallel (libjpeg-turbo and libpng release the GIL) straight into one batch
tensor. Batches need no pickling and no shared-memory segment to reach the
training loop: with few cores this beats worker processes (see
``benchmarks/RESULTS.md``). Python-heavy transforms, which hold the GIL, are
better served by the process backend.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import torch

from .readers.image import set_decode_pool
from .stream import Stream

_END = object()


class ThreadLoader:
    """One producer thread in plan order plus ``num_workers`` decode threads.

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
        stop = threading.Event()
        batches: queue.Queue = queue.Queue(maxsize=self.prefetch_factor * self.num_workers)
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="mmloader-decode")

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            set_decode_pool(pool)
            try:
                for batch in self.stream.iter_worker(0, 1):
                    if not put((None, batch)):
                        return
                put((None, _END))
            except BaseException as e:  # delivered to the consumer, raised there
                put((e, None))

        producer = threading.Thread(target=produce, daemon=True, name="mmloader-producer")
        producer.start()
        try:
            while True:
                error, batch = batches.get()
                if error is not None:
                    raise error
                if batch is _END:
                    return
                yield _pin(batch) if self.pin_memory else batch
        finally:
            stop.set()
            producer.join(timeout=5)
            pool.shutdown(wait=False, cancel_futures=True)


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_pin(v) for v in batch]
    return batch
