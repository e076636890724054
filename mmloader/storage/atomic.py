"""Write a dataset into a hidden sibling directory and rename it into place when complete.

A killed or failed writer therefore never leaves a half dataset under the final
name: either the old content (or nothing) or the complete new dataset is there.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicDirectory:
    """A temporary directory that becomes ``final`` on :meth:`commit`.

    >>> d = AtomicDirectory("/tmp/out.lmdb", overwrite=True)   # doctest: +SKIP
    >>> (d.tmp / "file").write_text("..."); d.commit()          # doctest: +SKIP
    """

    def __init__(self, final: str | os.PathLike, overwrite: bool = False):
        self.final = Path(final).absolute()
        if self.final.exists() and not overwrite:
            raise FileExistsError(f"{self.final} already exists; pass overwrite=True (CLI: --overwrite) "
                                  "to replace it")
        parent = self.final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PermissionError(f"cannot create the parent directory of {self.final}: {e}") from e
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write into {parent} (needed to create {self.final.name})")
        self.tmp = parent / f".{self.final.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
        self.tmp.mkdir()
        self.done = False

    def commit(self) -> Path:
        for f in self.tmp.iterdir():
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        old = None
        if self.final.exists():
            old = self.final.parent / f".{self.final.name}.old-{secrets.token_hex(3)}"
            os.rename(self.final, old)
        os.rename(self.tmp, self.final)
        _fsync_dir(self.final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        self.done = True
        return self.final

    def abort(self) -> None:
        if not self.done:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.done = True


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
