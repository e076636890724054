"""``mmloader.loader``: a loader set up right for a :class:`~.stream.Stream`, with mid-epoch resume.

Two backends build the same batches in the same order: worker processes
(:class:`Loader`, a real ``torch.utils.data.DataLoader``) and threads of the
training process (:class:`mmloader.loading.threaded.ThreadLoader`). ``backend="auto"``
(the default) picks by what the pipeline runs: only built-in decoders (JPEG/PNG
decoding and store reads release the GIL or are short) -> threads, which need no
pickling or shared-memory copies and measured fastest here for decoded and raw
batches alike; user Python per sample (transforms, custom decoders or readers, a
custom collate), which holds the GIL -> worker processes.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import multiprocessing
import os
import threading
import time
from typing import Any, Iterable, Iterator, Sequence, cast

import torch
import torch.utils.data

from ..errors import MMLoaderError
from .distributed import available_cpus, local_world_size
from .nodes.base import Node
from .nodes.chain import Chain, check_list
from .protocol import StreamLike, check_stream
from .resumable import Resumable
from .ring import BatchRing
from .stalled import StackDumps, stalled_error, worker_timeout
from .threaded import ThreadLoader, _pin, can_pin

log = logging.getLogger("mmloader")
BACKENDS = ("auto", "thread", "process", "ray")
_DATALOADER_SETTINGS = frozenset(
    {
        "num_workers",
        "pin_memory",
        "pin_memory_device",
        "persistent_workers",
        "prefetch_factor",
        "multiprocessing_context",
        "timeout",
        "worker_init_fn",
        "collate_fn",
        "generator",
        "in_order",
    }
)


def _reads_object_storage(stream: StreamLike) -> bool:
    """Whether ``stream``'s workers read object storage: obstore, which does not survive fork()
    (a worker forked after this process read would be refused at its first read)."""
    return any(getattr(ds, "reads_object_storage", lambda: False)() for ds in getattr(stream, "datasets", ()))


def _pickle_failure(stream: StreamLike) -> str | None:
    """Why ``stream`` does not pickle (spawned workers receive it pickled), or None where it does."""
    import pickle

    try:
        pickle.dumps(stream)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _check_spawnable(stream: StreamLike) -> None:
    """A stream that spawned workers cannot receive (a lambda or a local function as a transform),
    said with the remedy before any worker starts (torch would say only that pickling failed)."""
    failure = _pickle_failure(stream)
    if failure is not None:
        raise MMLoaderError(
            f"the stream reads object storage, so its worker processes start with 'spawn' (its client does not "
            f"survive fork()), and spawned workers receive the stream pickled, which fails: {failure}. Define "
            "transforms and decoders at module level (not lambdas or local functions), and guard the script "
            'with `if __name__ == "__main__":`; or pass backend="thread"'
        )


def default_num_workers() -> int:
    """CPUs available to this process divided by the ranks on this node (never more than CPUs)."""
    return max(1, available_cpus() // max(local_world_size(), 1))


class Loader(Resumable):
    """Batches of a :class:`~.stream.Stream` from DataLoader worker processes, knowing where it is.

    ``state_dict()`` records the epoch and how many batches this rank has
    delivered; ``load_state_dict()`` resumes at exactly the next unseen batch by
    arithmetic (nothing is replayed), also onto another world size or worker count.

    It runs a :class:`torch.utils.data.DataLoader` (``loader.dataloader``; its public
    attributes, e.g. ``num_workers``, read through) but is not one: frameworks that
    rebuild or re-shard DataLoaders (accelerate's ``prepare``, HF Trainer) leave it as
    it is, so the sharding stays mmloader's.

    >>> loader = mmloader.loader(stream, backend="process")     # doctest: +SKIP
    >>> for epoch in range(start_epoch, 100):                    # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         step(batch); ckpt["loader"] = loader.state_dict()

    Args:
        stream: the Stream to deliver.
        num_workers: worker processes (default: the CPUs per local rank).
        pin_memory: pin batches (default: when CUDA is available).
        persistent_workers: keep workers between passes (default: with workers).
        prefetch_factor: batches each worker builds ahead (default 2).
        ring: batches cross from workers through shared-memory slots (:mod:`mmloader.loading.ring`).
        timeout: seconds to wait for the workers' next batch before raising
            :class:`~mmloader.errors.WorkerStalledError` with where each worker is (default 600,
            ``$MMLOADER_WORKER_TIMEOUT``; 0 waits forever): :mod:`mmloader.loading.stalled`.
        **kwargs: other :class:`torch.utils.data.DataLoader` options (e.g. ``multiprocessing_context``).
    """

    def __init__(
        self,
        stream: StreamLike,
        num_workers: int | None = None,
        *,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        ring: bool = True,
        timeout: float | None = None,
        **kwargs: Any,
    ):
        check_stream(stream)
        workers = default_num_workers() if num_workers is None else num_workers
        self.timeout = worker_timeout(timeout, stream.longest_wait_s)
        if workers == 0:
            self.timeout = 0.0  # batches are built in the calling thread: nothing to wait for
        self._stacks: StackDumps | None = None
        if workers > 0 and self.timeout:  # each worker leaves its stack when the deadline passes
            self._stacks = StackDumps(self)
            kwargs["worker_init_fn"] = self._stacks.arming(kwargs.get("worker_init_fn"))
        if stream.restarts_each_pass:
            # Each pass's readers start from the positions the training process delivered up to,
            # which workers started for an earlier pass would not know.
            if persistent_workers:
                raise ValueError(
                    "a live stream starts its readers afresh each pass: persistent_workers=True does not apply"
                )
            persistent_workers = False
        if persistent_workers is None:
            persistent_workers = workers > 0
        pin_memory = torch.cuda.is_available() if pin_memory is None else can_pin(pin_memory)
        if workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        # Batches cross from the workers through a ring of shared-memory slots (mmloader.loading.ring);
        # with pinned memory they are pinned here, after the ring, not by the DataLoader's thread.
        self.ring: BatchRing | None = None
        if ring and workers > 0:
            assert prefetch_factor is not None  # set above where there are workers
            self.ring = BatchRing(workers, prefetch_factor + 2)
        self.pin_batches = bool(pin_memory and self.ring is not None)
        # Batches leave the Stream collated: no second conversion (torch's default one turns a
        # collate's tuples into lists, so the two backends would differ).
        kwargs.setdefault("collate_fn", _as_is)
        dataset: Any = _RingStream(stream, self.ring) if self.ring is not None else stream  # an IterableDataset
        if workers > 0 and kwargs.get("multiprocessing_context") is None and _reads_object_storage(stream):
            # obstore's runtime, started here to open the dataset (or later), does not survive
            # fork(): a forked worker's first read would hang (storage.remote refuses it instead)
            kwargs["multiprocessing_context"] = "spawn"
            log.info(
                "mmloader.loader: worker processes start with 'spawn' (the stream reads object storage, whose "
                "client does not survive fork()); pass multiprocessing_context= to choose"
            )
            _check_spawnable(stream)
        self.dataloader = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            num_workers=workers,
            pin_memory=pin_memory and not self.pin_batches,
            persistent_workers=persistent_workers and workers > 0,
            prefetch_factor=prefetch_factor if workers > 0 else None,
            timeout=self.timeout,
            **kwargs,
        )
        self.stream = stream
        self.batches_seen = 0

    def __getattr__(self, attr: str) -> Any:  # num_workers, pin_memory... of the DataLoader
        # Only its settings: a `dataset` or `batch_sampler` here would have frameworks treat
        # this loader as a DataLoader to rebuild.
        if attr not in _DATALOADER_SETTINGS or "dataloader" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        return getattr(self.dataloader, attr)

    def __len__(self) -> int:
        return len(self.stream)

    def _batches(self) -> Iterator[Any]:
        iterator = iter(self.dataloader)  # (persistent workers: reset for this pass)
        # Persistent workers reuse one iterator, which remembers the length of the pass it was
        # made for; a resumed (shorter) pass must not make later full passes look too long.
        if hasattr(iterator, "_IterableDataset_len_called"):
            try:
                cast(Any, iterator)._IterableDataset_len_called = len(self.stream)  # torch's stubs: None
            except TypeError:  # a live stream without a bound
                cast(Any, iterator)._IterableDataset_len_called = None
        return self._stop_workers_on_error(self._received(iterator), iterator)

    def _received(self, iterator: Iterator[Any]) -> Iterator[Any]:
        if self.ring is None:
            yield from iterator
            return
        for item in iterator:
            batch = self.ring.receive(item)
            del item
            yield _pin(batch) if self.pin_batches else batch

    def _stop_workers_on_error(self, iterator: Iterator[Any], workers: Any = None) -> Iterator[Any]:
        this_pass = self._active
        try:
            yield from iterator
            if _join_index_feeders is not None:  # the pass ended: its workers are shut down
                _join_index_feeders(workers)
        except (OSError, EOFError) as e:  # e.g. ConnectionResetError: a worker died handing over a batch
            dead = self._dead_workers()
            self._shutdown(workers)
            if dead:
                raise RuntimeError(
                    f"DataLoader worker(s) exited unexpectedly ({', '.join(dead)}) while "
                    f"sending a batch ({type(e).__name__}: {e})"
                ) from e
            raise
        except GeneratorExit:
            # The pass was left (a break, a framework dropping its iterator, interpreter exit after
            # an error raised in the loop's own code): stop its workers, unless a newer pass already
            # uses them (persistent workers, an old iterator closed late).
            if self._active is this_pass:
                self._shutdown(workers)
            raise
        except BaseException as e:
            if self._stacks is not None and isinstance(e, RuntimeError) and str(e).startswith("DataLoader timed out"):
                raise self._stalled(workers) from e
            # A worker died or raised: stop the others now. Left running, they stay registered
            # with the DataLoader's SIGCHLD handler, which would raise later in unrelated code.
            # (Workers that are not persistent belong to this pass's iterator, not the DataLoader.)
            self._shutdown(workers)
            raise

    def _stalled(self, workers: Any) -> Exception:
        """The error for workers past the deadline, with their stacks (asked before they stop),
        once they are stopped: stuck, they would not hear a polite stop (torch waits 5 s for each)."""
        assert self._stacks is not None  # (set wherever there is a deadline)
        stuck = [w for w in getattr(workers, "_workers", ()) if w.exitcode is None]
        stalled = stalled_error(self.timeout, self._stacks.collect([w.pid for w in stuck]), start=self._start_method())
        # Unregistered from torch's SIGCHLD check first, which would take their ending for a crash.
        if getattr(workers, "_worker_pids_set", False):
            torch.utils.data._utils.signal_handling._remove_worker_pids(id(workers))
            workers._worker_pids_set = False
        for w in stuck:
            w.terminate()
        self._shutdown(workers)
        return stalled

    def _start_method(self) -> str:
        """How the worker processes start: ``fork``, ``spawn`` or ``forkserver``."""
        context = self.dataloader.multiprocessing_context  # (a context: torch turns a name into one)
        return context.get_start_method() if context is not None else multiprocessing.get_start_method()

    def _dead_workers(self, wait_s: float = 2.0) -> list[str]:
        """Workers that exited, waiting a moment for one whose death broke the connection."""
        workers = getattr(getattr(self.dataloader, "_iterator", None), "_workers", [])
        deadline = time.monotonic() + wait_s
        while True:
            dead = [
                f"pid {w.pid} killed by signal {-w.exitcode}"
                if w.exitcode < 0
                else f"pid {w.pid} exit code {w.exitcode}"
                for w in workers
                if w.exitcode is not None
            ]
            if dead or not workers or time.monotonic() > deadline:
                return dead
            time.sleep(0.05)

    def _shutdown(self, this_pass: Any = None) -> None:
        """Stop the persistent workers (and ``this_pass``'s, an iterator of workers that are not)."""
        shutdown = getattr(this_pass, "_shutdown_workers", None)
        if shutdown is not None and not getattr(this_pass, "_shutdown", True):
            shutdown()
            if _join_index_feeders is not None:
                _join_index_feeders(this_pass)
        dataloader: Any = self.__dict__.get("dataloader")
        if getattr(dataloader, "_iterator", None) is not None:
            workers = list(getattr(dataloader._iterator, "_workers", []))
            dataloader._iterator._shutdown_workers()
            if _join_index_feeders is not None:  # (None at interpreter exit: module globals are gone)
                _join_index_feeders(dataloader._iterator)
            dataloader._iterator = None
            killed = [w.pid for w in workers if w.exitcode is not None and w.exitcode < 0]
            if killed:  # (checked first: at interpreter exit this module's functions may be gone)
                _remove_orphan_segments(killed)

    def _resume_now(self, state: dict) -> None:
        super()._resume_now(state)
        self._shutdown()  # persistent workers restart once, so they see the new plan


def _join_index_feeders(iterator: Any, timeout: float = 5.0) -> None:
    """Wait for the feeder threads of a shut-down DataLoader iterator's index queues to end.

    ``multiprocessing.Queue`` feeds its pipe from a thread, which ends after the queue is closed.
    On CPython 3.11 a fork while a thread is ending can hang the child for good (it waits in
    ``PyOS_AfterFork_Child`` for the interpreter's thread-list lock the ending thread held): the
    next loader's workers forked while the last loader's feeders end hung 1 run in N here. Joining
    them first (``join`` returns after that lock is released) keeps forks from meeting them.
    """
    if iterator is None or not getattr(iterator, "_shutdown", False):
        return
    for queue in getattr(iterator, "_index_queues", ()):
        feeder = getattr(queue, "_thread", None)
        if feeder is not None and feeder is not threading.current_thread():
            feeder.join(timeout)


def _remove_orphan_segments(pids: Iterable[int]) -> None:
    """Unlink the shared-memory files of workers killed by a signal.

    torch creates each segment as ``/dev/shm/torch_<pid>_<n>`` and unlinks it at once; a worker
    killed between those two calls leaves the file behind, and nobody else ever removes it.
    """
    for pid in pids:
        for leftover in glob.glob(f"/dev/shm/torch_{int(pid)}_*"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)


def _as_is(batch: Any) -> Any:
    return batch


class _RingStream(torch.utils.data.IterableDataset):
    """What the DataLoader's workers iterate: the stream's batches, each built into a ring slot."""

    def __init__(self, stream: StreamLike, ring: BatchRing):
        self.stream, self.ring = stream, ring

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is None:  # num_workers=0 never gets here (no ring); keep it correct anyway
            yield from self.stream
            return
        for build in self.stream.batch_tasks(info.id, info.num_workers, seed_globals=self.stream.seed_workers):
            yield self.ring.send(build, info.id)


def choose_backend(stream: StreamLike) -> tuple[str, str]:
    """(backend, why) for ``backend="auto"``: threads unless user Python runs per sample."""
    work = stream.python_work()
    if work:
        return "process", f"{', '.join(work[:3])} run(s) Python per sample, which holds the GIL"
    return "thread", "only built-in decoders run (they release the GIL)"


def loader(
    stream: StreamLike,
    num_workers: int | None = None,
    *,
    backend: str = "auto",
    nodes: Sequence[Node[Any]] = (),
    **kwargs: Any,
) -> Loader | ThreadLoader | Any:
    """A loader for ``stream``: workers from the CPUs per local rank, pinned memory with CUDA,
    the same batches in the same order on either backend, ``state_dict``/``load_state_dict``.

    ``backend="auto"`` (default) uses threads when the pipeline runs only mmloader's own
    decoders and worker processes when it runs user Python per sample (transforms, custom
    readers or decoders, a custom collate), and logs which and why; ``"thread"`` or
    ``"process"`` choose. Process-only options (``persistent_workers``,
    ``multiprocessing_context``...) select the process backend under ``"auto"``.
    ``backend="ray"`` builds the batches on a Ray cluster (:class:`~.on_ray.RayLoader`: its
    options ``address``, ``actors`` (``num_workers`` counts builders for the whole job there),
    ``in_flight``...); it is never chosen by ``"auto"``.

    ``nodes``: :class:`~mmloader.Node` s the batches pass through, in order, in the training
    process (:class:`~mmloader.Map`, :class:`~mmloader.Filter`, your own), each checkpointed in
    ``state_dict()`` with the rest (:mod:`mmloader.loading.nodes.chain`).

    >>> for batch in mmloader.loader(mmloader.Stream(ds, batch_size=32)): ...   # doctest: +SKIP
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
    nodes = check_list(nodes)  # (checked before anything starts; bound once the loader is made)
    made = _made(stream, num_workers, backend, kwargs)
    made._chain = Chain(nodes) if nodes else None
    return made


def _made(stream: StreamLike, num_workers: int | None, backend: str, kwargs: dict[str, Any]) -> Any:
    """The backend's loader :func:`loader` returns (before its nodes are put in)."""
    thread_options = {"pin_memory", "prefetch_factor", "producers", "timeout"}
    if backend == "auto":
        check_stream(stream)  # asked of it below; each backend's loader checks it otherwise
        process_only = sorted(set(kwargs) - thread_options)
        if process_only:
            backend, why = "process", f"process-only options {process_only} were given"
        else:
            backend, why = choose_backend(stream)
            if backend == "process" and _reads_object_storage(stream) and _pickle_failure(stream):
                backend, why = "thread", why + ", but the stream reads object storage (its workers would start with "
                why += "'spawn') and does not pickle (a lambda or a local function?)"
        log.info("mmloader.loader: backend=%s (%s); pass backend= to choose", backend, why)
    if backend == "ray":  # batches built on a Ray cluster: its own options
        from .on_ray import RAY_OPTIONS, RayLoader

        unknown = sorted(set(kwargs) - set(RAY_OPTIONS))
        if unknown:
            raise TypeError(f"backend='ray' does not take {unknown}; it takes {', '.join(RAY_OPTIONS)}")
        if num_workers is not None:
            if num_workers < 1:
                raise ValueError(f"backend='ray': num_workers={num_workers} (the job's builders): expected >= 1")
            kwargs.setdefault("actors", num_workers)
        return RayLoader(stream, **kwargs)
    workers = default_num_workers() if num_workers is None else num_workers
    if backend == "thread":
        unknown = sorted(set(kwargs) - thread_options)
        if unknown:
            raise TypeError(f"backend='thread' does not take {unknown}")
        pin = kwargs.get("pin_memory")
        return ThreadLoader(
            stream,
            workers,
            kwargs.get("prefetch_factor") or 2,
            torch.cuda.is_available() if pin is None else pin,
            kwargs.get("producers"),
            kwargs.get("timeout"),
        )
    if "producers" in kwargs:
        raise TypeError("producers= is an option of backend='thread'")
    return Loader(stream, num_workers=num_workers, **kwargs)
