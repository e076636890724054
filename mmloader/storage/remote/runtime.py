"""Per-process machinery of the client: whether this process may use obstore (not when it was
forked from one that started obstore's runtime), and the event loop thread that runs its requests."""

from __future__ import annotations

import asyncio
import atexit
import os
import threading

_OBSTORE_PID: int | None = None  # the process that started obstore's runtime (inherited by fork)
_OBSTORE_LOCK = threading.Lock()


def obstore_inherited() -> bool:
    """This process was forked from one that had started obstore's runtime (which does not
    survive fork(): a request from here would hang)."""
    return _OBSTORE_PID not in (None, os.getpid())


def obstore_started_here() -> bool:
    return _OBSTORE_PID == os.getpid()


def _mark_obstore() -> None:
    global _OBSTORE_PID
    if _OBSTORE_PID != os.getpid():
        with _OBSTORE_LOCK:
            _OBSTORE_PID = os.getpid()


def check_not_inherited(url: str) -> None:
    """Refuse a request from a process forked from one that had started obstore: its runtime
    does not survive ``fork()``, and the request would hang. The remedy is the start method:
    ``mmloader.loader`` starts worker processes that read object storage with ``spawn``."""
    if obstore_inherited():
        from .errors import RemoteError
        from .redaction import redact_url

        raise RemoteError(
            f"{redact_url(url)}: this process was forked from one that had read object storage, and obstore's "
            "runtime does not survive fork(): start worker processes with multiprocessing_context='spawn' "
            "(mmloader.loader does this itself), or read with backend='thread'"
        )


# An event loop thread per process for obstore's async API: many requests in flight from any
# thread, the GIL released while they run.
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    hit = _LOOP
    if hit is None or hit[0] != os.getpid():
        with _LOOP_LOCK:
            hit = _LOOP
            if hit is None or hit[0] != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mmloader-remote", daemon=True).start()
                hit = _LOOP = (os.getpid(), loop)
                atexit.register(_settle_at_exit)
    return hit[1]


def _settle_at_exit(timeout: float = 10.0) -> None:
    """Wait (a bounded time) for requests still in flight, e.g. read-ahead chunks, before the
    interpreter finalizes: obstore's threads hand each answer to the loop by calling into Python,
    and one arriving during finalization aborts the process (SIGABRT at exit)."""
    hit = _LOOP
    if hit is None or hit[0] != os.getpid() or not hit[1].is_running():
        return

    async def settle() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    try:
        asyncio.run_coroutine_threadsafe(settle(), hit[1]).result(timeout + 1)
        # Then give obstore's own threads a moment to finish handing back what they hold: a call
        # into Python from one of them while the interpreter finalizes aborts the process, even
        # after every request has completed (16 exits in 80 on a loaded machine; none in 160
        # with this). The loop keeps running: later atexit handlers may still read.
        if obstore_started_here():
            import gc
            import time

            gc.collect()
            time.sleep(_EXIT_GRACE)
    except Exception:  # at exit: nothing more to do
        pass


#: Seconds obstore's threads get at exit after the last request (see :func:`_settle_at_exit`).
_EXIT_GRACE = 0.2


def run(coro, timeout: float | None = None):
    """Run a coroutine on this process's request loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, event_loop()).result(timeout)
