"""Worker processes that deliver nothing by a deadline: where each one is, said in the error.

A DataLoader waits for its workers forever by default. A worker stuck in a lock it inherited
(a fork of a process whose other threads held it: a decoder's, a client's, the interpreter's
own) or a read that never returns would hold the training loop up without a word. So each wait
has a deadline (``timeout=``, default :data:`DEFAULT_TIMEOUT_S`, ``$MMLOADER_WORKER_TIMEOUT``),
and when it passes, every worker is asked for its Python stack (:mod:`faulthandler`, armed in
each worker at its start), which the error carries with the remedy.

A worker with no stack to give never ran its first line of Python: it hung while starting,
which is what an inherited lock does, and what ``multiprocessing_context="spawn"`` avoids.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import WorkerStalledError

#: Seconds a loader waits for its worker processes' next batch before it raises.
DEFAULT_TIMEOUT_S = 600.0
_ENV = "MMLOADER_WORKER_TIMEOUT"
_LINES = 40  # of each worker's stack in the error: the innermost frames (faulthandler prints them first)
_DUMP_WAIT_S = 2.0

_armed: list[Any] = []  # the worker's dump file, kept open for faulthandler (never closed by GC)


def worker_timeout(given: Any, at_least: float = 0.0) -> float:
    """The deadline in seconds: ``given``, else ``$MMLOADER_WORKER_TIMEOUT``, else the default,
    never below ``at_least`` (how long the data itself may rightly make a batch wait: a live
    source's); 0 waits forever (an explicit choice, never the default).

    >>> worker_timeout(30), worker_timeout(0), worker_timeout(None, at_least=3840)
    (30.0, 0.0, 7680.0)
    """
    name = "timeout"
    if given is None:
        name, raw = f"${_ENV}", os.environ.get(_ENV)
        try:
            given = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected seconds (a number; 0 waits forever)") from None
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 <= given < float("inf"):
        raise ValueError(f"{name}={given!r}: expected seconds, a finite number >= 0 (0 waits forever)")
    if name != "timeout" and given:  # (twice: a batch may wait its whole bound, then be built)
        given = max(given, 2 * at_least)
    return float(given)


def _stacks_root() -> Path:
    """This user's folder of stack folders: one per loader, named by the process that made it."""
    return Path(tempfile.gettempdir()) / f"mmloader-stacks-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def _sweep(root: Path) -> None:
    """Remove the stack folders of processes that ended without removing them (killed)."""
    for folder in root.glob("*-*"):
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


class StackDumps:
    """A folder where each worker leaves its stack when asked (``SIGUSR1``), removed with its owner."""

    def __init__(self, owner: object):
        root = _stacks_root()
        root.mkdir(mode=0o700, exist_ok=True)
        if Path("/proc/self").exists():
            _sweep(root)
        self.folder = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root)
        weakref.finalize(owner, shutil.rmtree, self.folder, True)

    def arming(self, then: Callable[[int], Any] | None) -> _Arm:
        """A ``worker_init_fn`` that arms the worker, then runs ``then`` (the user's, if any)."""
        return _Arm(self.folder, then)

    def collect(self, pids: Iterable[int]) -> dict[str, str | None]:
        """Each worker's stack (None: it never armed, so never ran Python), asked for now."""
        asked: dict[int, Path | None] = {}
        for pid in pids:
            path = Path(self.folder) / f"{pid}.txt"
            armed = path.exists()
            if armed:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:  # exited meanwhile
                    armed = False
            asked[pid] = path if armed else None
        deadline = time.monotonic() + _DUMP_WAIT_S
        stacks: dict[str, str | None] = {}
        for pid, dump in asked.items():
            if dump is None:
                stacks[f"worker pid {pid}{_kernel_wait(pid)}"] = None
                continue
            text = ""
            while not text and time.monotonic() < deadline:
                time.sleep(0.05)
                text = dump.read_text(errors="replace")
            if text:  # written at once by the signal handler; a moment for the last threads
                time.sleep(0.1)
                text = dump.read_text(errors="replace")
            stacks[f"worker pid {pid}"] = text or "(no stack came within 2 s)"
        return stacks


def _kernel_wait(pid: int) -> str:
    """Where the kernel has ``pid`` waiting (Linux), e.g. `` (waiting in futex_wait_queue)``: a lock."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return ""
    return f" (waiting in {wchan})" if wchan and wchan != "0" else ""


class _Arm:
    """Picklable (spawned workers receive it): registers the dump, then the user's init."""

    def __init__(self, folder: str, then: Callable[[int], Any] | None):
        self.folder, self.then = folder, then

    def __call__(self, worker_id: int) -> None:
        if hasattr(signal, "SIGUSR1"):
            dump = open(Path(self.folder) / f"{os.getpid()}.txt", "w")  # noqa: SIM115 - open for the process
            _armed.append(dump)
            faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        if self.then is not None:
            self.then(worker_id)


def thread_stacks(threads: Iterable[threading.Thread]) -> dict[str, str | None]:
    """Each live thread's Python stack, innermost call first (as :mod:`faulthandler` writes one)."""
    frames = sys._current_frames()
    stacks: dict[str, str | None] = {}
    for t in threads:
        frame = frames.get(t.ident) if t.ident is not None else None
        if frame is not None:
            lines = traceback.format_stack(frame)[::-1]
            stacks[f"thread {t.name}"] = "".join(lines)
    return stacks


def stalled_error(
    timeout: float, stacks: dict[str, str | None], processes: bool = True, start: str = "fork"
) -> WorkerStalledError:
    """The error for builders (worker processes started by ``start``, or the thread backend's
    producer threads) that delivered nothing in ``timeout`` seconds, with where each one is
    (``stacks``, by name; None: a worker that never reached its first batch's code)."""
    forked = start == "fork"
    parts = []
    for name, stack in stacks.items():
        if stack is None:
            parts.append(
                f"{name}: never ran its first line of Python (hung while starting)"
                if forked
                else f"{name}: never reached its worker loop (stuck starting: importing the main module, or "
                "unpickling the stream)"
            )
        else:
            lines = stack.strip("\n").splitlines()
            shown = lines if len(lines) <= _LINES else lines[:_LINES] + ["..."]
            parts.append(f"{name}:\n" + "\n".join("    " + line for line in shown))
    where = "\n".join(parts)
    slow = "A batch that is only slow (a first remote read, long videos): pass a larger timeout= (0 waits forever)"
    if not processes:
        return WorkerStalledError(
            f"no batch from the loader's threads in {timeout:g} s (the loader's timeout=, ${_ENV}); where "
            f"each is now (innermost call first):\n{where}\n{slow}; one stuck for good is stuck in the call "
            "shown first (threads cannot be stopped: it is left behind, a daemon thread)"
        )
    if forked:
        stuck = (
            "One stuck in a lock"
            + (" while starting" if None in stacks.values() else "")
            + ": it inherited the lock held by another thread of this process when the workers were forked; "
            "pass multiprocessing_context='spawn' (or 'forkserver'), which starts them without this process's "
            "threads"
        )
    else:
        stuck = (
            f"Workers started by {start!r} import the main module and unpickle the stream first: guard the "
            'script with `if __name__ == "__main__":`, and keep what the stream holds cheap to unpickle'
        )
    return WorkerStalledError(
        f"no batch from the DataLoader worker processes in {timeout:g} s (the loader's timeout=, "
        f"${_ENV}); where each is now (innermost call first):\n{where}\n{slow}. {stuck}"
    )
