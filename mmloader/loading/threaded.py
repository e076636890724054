"""A thread backend for :class:`mmloader.Stream`: the same plan, batches built in this process.

Batches need no pickling and no shared-memory segment to reach the training
loop, and JPEG/PNG decoding (libjpeg-turbo, libpng) releases the GIL, so with
few cores this beats worker processes (see ``benchmarks/RESULTS.md``).
Python-heavy transforms, which hold the GIL, are better served by the process
backend.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch

from ..readers.columns import release_pool
from .protocol import StreamLike, check_stream
from .resumable import Resumable
from .stalled import stalled_error, thread_stacks, worker_timeout


class ThreadLoader(Resumable):
    """Batches in plan order from threads of this process, with the same resume API as
    the process backend (``set_epoch``, ``state_dict``, ``load_state_dict``).

    Producer threads take batches in order from one shared sequence and build them
    ahead of the consumer (at most ``prefetch_factor`` per producer). When batches
    decode images there are ``num_workers`` producers (decoding releases the GIL, so
    they run in parallel and overlap reading with decoding); otherwise the work is
    Python-bound, more threads would only fight over the GIL, and one producer builds.
    (Letting the idle consumer build batches too was measured and rejected: two
    threads in GIL-bound work ran ~20% slower than one.) Batches arrive in the same
    order as with the process backend, so states mean the same thing. The global RNGs
    are left alone (they belong to the training loop); :func:`mmloader.rng` gives each
    batch its seeded generators.

    >>> loader = mmloader.loader(stream, backend="thread")     # doctest: +SKIP
    """

    def __init__(
        self,
        stream: StreamLike,
        num_workers: int = 2,
        prefetch_factor: int = 2,
        pin_memory: bool = False,
        producers: int | None = None,
        timeout: float | None = None,
    ):
        check_stream(stream)
        self.stream = stream
        # past it, the producers' stacks are said (mmloader.loading.stalled)
        self.timeout = worker_timeout(timeout, stream.longest_wait_s)
        self.num_workers = max(1, num_workers)
        self.prefetch_factor = max(1, prefetch_factor)
        self.pin_memory = can_pin(pin_memory)
        self.producers = producers
        self.batches_seen = 0

    def __len__(self) -> int:
        return len(self.stream)

    def _batches(self) -> Iterator[Any]:
        parallel = any(getattr(ds, "releases_gil", False) for ds in self.stream.datasets)
        producers = self.producers or (self.num_workers if parallel else 1)
        self.builders = producers  # (Python work holds the GIL: one producer, whatever num_workers says)
        tasks = self.stream.batch_tasks(0, 1, readers=self.num_workers)  # a live source's slices, as with processes
        run = _Run(tasks, producers, self.prefetch_factor * producers, self.pin_memory, self.timeout)
        return run.batches()


class _Run:
    """One pass: batch j is built by whichever producer claims it first; delivered in j order.

    Producers and the consumer wait on separate conditions (one lock), so a thread
    is only woken when there is something for it: waking a thread on another core
    costs tens of microseconds, more on VMs.
    """

    def __init__(self, tasks: Iterator[Callable[[], Any]], producers: int, ahead: int, pin: bool, timeout: float = 0):
        self.tasks, self.ahead, self.pin, self.timeout = tasks, ahead, pin, timeout
        lock = threading.Lock()
        self.ready = threading.Condition(lock)  # the consumer waits here
        self.room = threading.Condition(lock)  # producers wait here for the window to move
        self.results: dict[int, tuple[BaseException | None, Any]] = {}
        self.claimed = 0  # batches handed out to builders
        self.delivered = 0  # batches the consumer has taken
        self.exhausted = self.stopped = False
        self.threads = [
            threading.Thread(target=self._produce, daemon=True, name=f"mmloader-{w}") for w in range(producers)
        ]
        _RUNS.add(self)

    def _claim(self) -> tuple[int, Callable[[], Any]] | None:
        """The next batch to build (called with the lock held); None when there is none
        or when producers are far enough ahead of the consumer."""
        if self.exhausted or self.claimed >= self.delivered + self.ahead:
            return None
        j = self.claimed
        try:
            task = next(self.tasks)  # planning is cheap and must stay in order: done under the lock
        except StopIteration:
            self.exhausted = True
            self.ready.notify_all()
            self.room.notify_all()
            return None
        except BaseException as e:  # a planning error is delivered in order, like a batch's
            self.exhausted = True
            self.claimed += 1
            self.results[j] = (e, None)
            self.ready.notify_all()
            self.room.notify_all()
            return None
        self.claimed += 1
        return j, task

    def _build(self, j: int, task: Callable[[], Any]) -> None:
        try:
            item: tuple[BaseException | None, Any] = (None, task())
        except BaseException as e:  # delivered to the consumer, raised there
            item = (e, None)
        with self.ready:
            self.results[j] = item
            if item[0] is not None:
                # The pass ends at this batch: build no later one. (Each would first wait out
                # what failed this one, a server's retry deadline, say, and the consumer's
                # stop() waits for the batches under way before it raises.)
                self.exhausted = True
                self.room.notify_all()
                self.ready.notify_all()
            elif j == self.delivered:  # the batch the consumer is (or will be) waiting for
                self.ready.notify()

    def _produce(self) -> None:
        one_intra_op_thread()
        while True:
            with self.room:
                while True:
                    if self.stopped or self.exhausted:
                        return
                    claim = self._claim()
                    if claim is not None:
                        break
                    if self.exhausted:  # this very claim found the end
                        return
                    self.room.wait()
            self._build(*claim)

    def batches(self, _release: Callable[[], None] = release_pool) -> Iterator[Any]:
        # (_release bound here: a pass left open runs this finally at interpreter exit, when
        # module globals are already gone)
        for t in self.threads:
            t.start()
        stuck = False
        try:
            j = 0
            while True:
                with self.ready:
                    deadline = time.monotonic() + self.timeout if self.timeout else None
                    while j not in self.results:
                        if self.exhausted and j >= self.claimed:
                            return
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:  # stuck: stop() below does not wait for them
                            stuck = True
                            raise stalled_error(self.timeout, thread_stacks(self.threads), processes=False)
                        self.ready.wait(left)
                    error, batch = self.results.pop(j)
                    self.delivered = j + 1
                    self.room.notify()
                if error is not None:
                    raise error
                yield _pin(batch) if self.pin else batch
                j += 1
        finally:
            self.stop(0.0 if stuck else 5.0)
            try:
                _release()  # the pass's spare batch buffers: kept no longer than the pass
            except Exception:  # at interpreter exit the pool's module may be gone already
                pass

    def stop(self, timeout: float = 5.0, _now: Callable[[], float] = time.monotonic) -> None:
        """Let the producers finish the batch they are building, and wait for them (``timeout``
        in all: this also runs at interpreter exit, which must not hang)."""
        deadline = _now() + timeout  # (_now bound here: at interpreter exit module globals are gone)
        # A Ctrl-C caught inside a Condition wait can leave its lock taken for good: never wait
        # for it without a limit (the producers are daemon threads; left waiting, they end with us).
        if self.ready.acquire(timeout=timeout):
            try:
                self.stopped = True
                self.room.notify_all()
            finally:
                self.ready.release()
        else:
            self.stopped = True
        for t in self.threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout=max(0.0, deadline - _now()))


# Passes still running when the interpreter exits (a loop left with ``break``, the iterator
# still referenced): their daemon producers would be cut off wherever they are, and one cut
# off inside a native decoder or tokenizer (Rust, C++) aborts the process ("FATAL: exception
# not rethrown"). atexit runs before that happens: stop them there.
_RUNS: "weakref.WeakSet[_Run]" = weakref.WeakSet()


@atexit.register
def _stop_runs_at_exit() -> None:
    # Generous: a batch still being built is waited for (a slow one takes seconds); only a
    # producer stuck for a minute is left to be cut off.
    for run in list(_RUNS):
        run.stop(timeout=60.0)


def one_intra_op_thread() -> None:
    """Run this thread's torch ops on one thread, as a DataLoader worker process does.

    Producers already build batches side by side; a torch op in one of them that starts an
    OpenMP team of its own only fights the others for the cores (measured with the fused
    augmentation on 2 cores: 2,082 images/s with torch's default team, about 2,550 with one).
    ``torch.set_num_threads(1)`` cannot be used: besides this thread's OpenMP setting it
    changes torch's process-wide count, which the training thread and every thread started
    later then take (tested). OpenMP's own ``omp_set_num_threads`` sets the calling thread's
    team size only; torch sets each thread up from its process-wide count on the thread's
    first call, so that call comes first. Without an OpenMP runtime in the process, nothing.
    """
    torch.get_num_threads()  # torch's set-up of this thread, which would undo what follows
    set_threads = _omp_set_num_threads()
    if set_threads is not None:
        set_threads(1)


@functools.lru_cache(maxsize=1)
def _omp_set_num_threads() -> Callable[[int], Any] | None:
    """``omp_set_num_threads`` of the OpenMP runtime torch loaded (found in this process's maps)."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp5", "libomp")):
            try:
                return ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                continue
    return None


def can_pin(pin_memory: bool | None) -> bool:
    """``pin_memory`` as it can be honoured here: pinned memory needs CUDA. Asked for without it,
    batches are not pinned and a warning says so, as torch's DataLoader does (pinning would fail
    with 'Found no NVIDIA driver')."""
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True, but no CUDA device is available: batches are not pinned", UserWarning, stacklevel=3
        )
        return False
    return bool(pin_memory)


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_pin(v) for v in batch]
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return tuple(_pin(v) for v in batch)
    return batch
