"""How mmloader lays out a tar shard, in one place for the writer and for merge: what a sample
costs in the cut rule, when a shard is cut, how an archive ends, and the file that hashes what
is written to it (so a shard's sha256 needs no second read).

>>> sample_bytes([100, 20_000])
22148
>>> should_cut(samples=3, written=900_000, next_sample=200_000, shard_size=10, shard_bytes=1_000_000)
True
>>> len(end_of_archive(written=512 * 3))
8704
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import Iterable

#: Bytes a member adds beyond its data in the cut rule: a 512-byte header and up to 511 bytes of
#: padding, counted as 1024 (an estimate: the rule decides where to cut, not the file's size).
MEMBER_OVERHEAD = 1024


def sample_bytes(member_sizes: Iterable[int]) -> int:
    """What a sample of members of these data sizes counts for in :func:`should_cut`."""
    return sum(n + MEMBER_OVERHEAD for n in member_sizes)


def should_cut(*, samples: int, written: int, next_sample: int, shard_size: int, shard_bytes: int) -> bool:
    """Close the shard before the next sample? When it holds ``shard_size`` samples, or when the
    next sample (:func:`sample_bytes`) would take it past ``shard_bytes`` (a shard always holds at
    least one sample, however large).

    Args:
        samples: samples in the shard so far.
        written: bytes written to it so far.
        next_sample: the next sample's :func:`sample_bytes`.
        shard_size: most samples per shard.
        shard_bytes: most bytes per shard.
    """
    return samples >= shard_size or (samples > 0 and written + next_sample > shard_bytes)


def end_of_archive(written: int) -> bytes:
    """The end of a tar archive exactly as ``tarfile`` writes it after ``written`` bytes: two zero
    blocks, then zeros up to a whole 10 KiB record."""
    end = tarfile.BLOCKSIZE * 2
    end += (-(written + end)) % tarfile.RECORDSIZE
    return b"\0" * end


class HashingFile:
    """A file being written that hashes (sha256) and counts what is written to it, in one pass.

    Args:
        path: the file to create.
    """

    def __init__(self, path: str | os.PathLike):
        self._f = open(Path(path), "wb")
        self.sha = hashlib.sha256()
        self.pos = 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.pos += len(b)
        return self._f.write(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        """Sync to disk and close (safe to run on another thread after :meth:`flush`)."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def sha256_file(source: str | os.PathLike | int, chunk: int = 1 << 22) -> str:
    """The sha256 (hex) of a file, read in chunks: the one helper for every shard and part file.

    Args:
        source: the file's path, or an open file descriptor (read with ``pread`` from offset 0,
            its position left alone: a cached shard held open by its reader).
        chunk: bytes read at a time.
    """
    h = hashlib.sha256()
    if isinstance(source, int):
        pos = 0
        while b := os.pread(source, chunk, pos):
            h.update(b)
            pos += len(b)
        return h.hexdigest()
    with open(source, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()
