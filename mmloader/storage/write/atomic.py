"""Write a dataset into a hidden sibling directory and rename it into place when complete.

A killed or failed writer therefore never leaves a half dataset under the final
name: either the old content (or nothing) or the complete new dataset is there.

Around that rename:

* **One writer per destination.** A writer holds an exclusive ``flock`` on the hidden
  sibling ``.NAME.lock`` from start to commit/abort; a second writer to the same
  destination fails at once (:class:`DestinationBusyError`) instead of racing. The
  kernel drops the lock when its holder dies, SIGKILL included.
* **No silent replacement at publish time.** Existence is checked again when
  publishing, and the rename itself refuses to replace a dataset that appeared meanwhile
  (``renameat2(RENAME_NOREPLACE)`` where the kernel and file system offer it), unless
  ``overwrite`` was given.
* **Stale partials are removed.** Each partial directory ``.NAME.partial-PID-TOKEN``
  holds a small record of its writer (host, PID, boot id, process start time). On start,
  partials of the same destination whose writer is gone — same host, and the PID no
  longer runs, or runs a different process, or the machine rebooted since — are deleted
  and reported; a live one, one from another host, or one without a record is never
  touched (it is reported, so a person can decide).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows; the other checks still apply
    fcntl = None  # type: ignore[assignment]  # optional module; uses check for None

log = logging.getLogger("mmloader")

#: The writer record inside a partial directory; removed just before the rename into place.
WRITER_RECORD = ".mmloader-writer.json"


class DestinationBusyError(FileExistsError):
    """Another live process is writing the same destination."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22) or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()  # fields after "(comm)" start at 3


def writer_record() -> dict:
    """Who is writing: host, PID, boot id and start time of this process."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "boot_id": _boot_id(),
        "start_time": _start_time(os.getpid()),
    }


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def writer_alive(record: dict) -> bool | None:
    """True/False when it can be told from this host, None when it cannot (another host)."""
    if record.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if record.get("boot_id") and boot and record["boot_id"] != boot:
        return False  # the machine rebooted since: no process of that run survives
    pid = int(record.get("pid", -1))
    if pid <= 0 or not _pid_runs(pid):
        return False
    started = _start_time(pid)
    if record.get("start_time") and started and started != record["start_time"]:
        return False  # the PID was reused by another process
    return True


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


@dataclass
class Partial:
    """A hidden ``.NAME.partial-*`` directory of a destination and what was done with it."""

    path: Path
    bytes: int
    removed: bool
    why: str

    def __str__(self) -> str:
        mb = f"{self.bytes / 1e6:.1f} MB"
        return (
            f"removed stale partial {self.path} ({mb}): {self.why}"
            if self.removed
            else f"left alone: {self.path} ({mb}): {self.why}"
        )


def partials_of(final: str | os.PathLike) -> list[Path]:
    final = Path(final).absolute()
    try:
        return sorted(p for p in final.parent.glob(f".{final.name}.partial-*") if p.is_dir())
    except OSError:
        return []


def clean_stale_partials(final: str | os.PathLike, remove: bool = True) -> list[Partial]:
    """Remove the partials of ``final`` left by writers that no longer run on this host.

    Returns one :class:`Partial` per partial found (removed or left alone, with why).
    Call it while holding the destination's lock (:class:`AtomicDirectory` does), or
    accept that a writer starting this very moment is seen as live and left alone.
    """
    out = []
    for p in partials_of(final):
        try:
            record = json.loads((p / WRITER_RECORD).read_text())
        except (OSError, ValueError):
            out.append(
                Partial(
                    p,
                    _du(p),
                    False,
                    "no writer record (an older mmloader, or a writer "
                    "starting now); delete it by hand if nothing writes it",
                )
            )
            continue
        alive = writer_alive(record)
        who = f"writer PID {record.get('pid')} on {record.get('host')}"
        if alive is None:
            out.append(Partial(p, _du(p), False, f"{who}, another host: cannot tell whether it runs"))
        elif alive:
            out.append(Partial(p, _du(p), False, f"{who} is still running"))
        elif not remove:
            out.append(Partial(p, _du(p), False, f"{who} no longer runs"))
        else:
            size = _du(p)
            shutil.rmtree(p, ignore_errors=True)
            out.append(Partial(p, size, not p.exists(), f"{who} no longer runs"))
    return out


# -- the destination lock ---------------------------------------------------------------------
def lock_path(final: str | os.PathLike) -> Path:
    final = Path(final).absolute()
    return final.parent / f".{final.name}.lock"


class DestinationLock:
    """An exclusive, non-blocking ``flock`` on ``.NAME.lock`` beside the destination."""

    def __init__(self, final: str | os.PathLike):
        self.final = Path(final).absolute()
        self.path = lock_path(self.final)
        self.fd: int | None = None

    def acquire(self) -> "DestinationLock":
        if fcntl is None:  # pragma: no cover
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = ""
                try:
                    holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                    holder = f" (PID {holder.get('pid')} on {holder.get('host')})"
                except (OSError, ValueError, AttributeError):
                    holder = ""
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise DestinationBusyError(
                        f"{self.final} is being written by another writer{holder}; two writers to one "
                        "destination would race: wait for it to finish, or write elsewhere"
                    ) from None
                raise
            # The holder before us may have unlinked the file after we opened it: then our lock
            # is on a file nobody else will look at. Retry on the one that is there now.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(writer_record()).encode(), 0)
                return self
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: the next writer starts from a new file
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def check_not_busy(final: str | os.PathLike) -> None:
    """Raise :class:`DestinationBusyError` now if another process is writing ``final``
    (an early check; :class:`AtomicDirectory` takes the lock itself)."""
    DestinationLock(final).acquire().release()


# -- rename without replacing -----------------------------------------------------------------
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _load_renameat2() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    except (OSError, AttributeError):  # pragma: no cover - no glibc >= 2.28
        return None
    return fn


_renameat2 = _load_renameat2()


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; ``FileExistsError`` if ``dst`` exists, atomically where the
    kernel and file system support ``RENAME_NOREPLACE`` (checked just before otherwise)."""
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST or err == errno.ENOTEMPTY:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(src))
    if os.path.lexists(dst):  # fallback: a check, then the rename (os.rename replaces empty dirs)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


class AtomicDirectory:
    """A temporary directory that becomes ``final`` on :meth:`commit`.

    >>> d = AtomicDirectory("/tmp/out.lmdb", overwrite=True)   # doctest: +SKIP
    >>> (d.tmp / "file").write_text("..."); d.commit()          # doctest: +SKIP

    ``stale`` lists the partials of the same destination found on start (removed when their
    writer is gone, see :func:`clean_stale_partials`).
    """

    def __init__(self, final: str | os.PathLike, overwrite: bool = False):
        self.final = Path(final).absolute()
        self.overwrite = overwrite
        self.done = False
        parent = self.final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PermissionError(f"cannot create the parent directory of {self.final}: {e}") from e
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write into {parent} (needed to create {self.final.name})")
        self._lock = DestinationLock(self.final).acquire()
        try:
            if self.final.exists() and not overwrite:
                raise FileExistsError(
                    f"{self.final} already exists; pass overwrite=True (CLI: --overwrite) to replace it"
                )
            self.stale = clean_stale_partials(self.final)
            for p in self.stale:  # a removal is news; a partial left alone was there before and stays
                log.log(logging.WARNING if p.removed else logging.INFO, "%s", p)
            self.tmp = parent / f".{self.final.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
            self.tmp.mkdir()
            (self.tmp / WRITER_RECORD).write_text(json.dumps(writer_record()))
        except BaseException:
            self._lock.release()
            raise

    def commit(self) -> Path:
        """Rename the finished directory into place; on any failure nothing is published, the
        partial is removed and the lock released."""
        try:
            return self._commit()
        except BaseException:
            self.abort()
            raise

    def _commit(self) -> Path:
        try:
            (self.tmp / WRITER_RECORD).unlink()
        except FileNotFoundError:
            pass
        for f in self.tmp.iterdir():
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        old = None
        if os.path.lexists(self.final):
            if not self.overwrite:
                raise FileExistsError(
                    f"{self.final} appeared while this dataset was being written (by "
                    "another program?); it was not replaced and the new data was "
                    "discarded. Pass overwrite=True (CLI: --overwrite) to replace it"
                )
            old = self.final.parent / f".{self.final.name}.old-{secrets.token_hex(3)}"
            os.rename(self.final, old)
        try:
            rename_noreplace(self.tmp, self.final)
        except FileExistsError:
            if old is not None and not os.path.lexists(self.final):
                os.rename(old, self.final)
            raise FileExistsError(
                f"{self.final} appeared while this dataset was being published; it was "
                "not replaced and the new data was discarded"
            ) from None
        self.done = True
        _fsync_dir(self.final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        self._lock.release()
        return self.final

    def abort(self) -> None:
        if not self.done:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.done = True
        self._lock.release()


class AtomicWriter:
    """Context-manager protocol of the writers: ``close()`` on success, ``abort()`` on error."""

    def close(self) -> Path:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
