"""Write WebDataset-compatible tar shards plus mmloader's manifest and offset indexes."""

from __future__ import annotations

import os
import tarfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from ..encoding import split_sample
from ..keys import validate_field, validate_key
from ..write.atomic import AtomicDirectory, AtomicWriter
from .index import ShardIndexBuilder
from .layout import HashingFile, end_of_archive, sample_bytes, should_cut

#: One default per concept, shared by the Python API and the CLI.
DEFAULT_SHARD_SIZE = 10_000  # samples per shard
DEFAULT_SHARD_BYTES = 1 << 30  # bytes per shard (1 GiB)


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def ustar_header(name: str, size: int, mtime: int) -> bytes:
    """The 512-byte header tarfile writes for a plain file with a short ASCII name (PAX format
    adds nothing then), built directly: tarfile's generic path costs ~35 us per member."""
    head = b"".join(
        [
            name.encode("ascii").ljust(100, b"\0"),
            _octal(0o444, 8),
            _octal(0, 8),
            _octal(0, 8),
            _octal(size, 12),
            _octal(mtime, 12),
            b"        ",
            b"0",
            b"\0" * 100,
            b"ustar\x0000",
            b"\0" * 32,
            b"\0" * 32,
            b"\0" * 16,
            b"\0" * 155,
        ]
    )  # no device numbers for files
    checksum = b"%06o\0 " % sum(head)
    return (head[:148] + checksum + head[156:]).ljust(512, b"\0")


class ShardWriter(AtomicWriter):
    """Write samples to ``DIR/NAME-000000.tar, ...`` atomically (the directory appears when closed).

    Shards are cut at ``shard_size`` samples or ``shard_bytes`` bytes. Member names
    are ``KEY.FIELD``; a sample's members are contiguous, as WebDataset expects.
    Member mtimes are fixed (``mtime``) so the same input gives identical bytes.

    >>> with ShardWriter("shards/", shard_size=1000) as w:          # doctest: +SKIP
    ...     w.write({"__key__": "0001", "jpg": jpeg_bytes, "txt": "a cat"})
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        name: str = "data",
        shard_size: int = DEFAULT_SHARD_SIZE,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        overwrite: bool = False,
        metadata: Mapping | None = None,
        mtime: int = 0,
    ):
        for option, value in (("shard_size", shard_size), ("shard_bytes", shard_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{option}={value!r}: expected a positive integer")
        validate_key(name)
        self._dir = AtomicDirectory(directory, overwrite=overwrite)
        self.path = self._dir.final
        self.name, self.shard_size, self.shard_bytes, self.mtime = name, shard_size, shard_bytes, mtime
        self.user_metadata = dict(metadata or {})
        self._index = ShardIndexBuilder(self._dir.tmp)
        self._file: HashingFile | None = None
        self._shard_samples = 0
        self._known_fields: set[str] = set()
        self._syncer: ThreadPoolExecutor | None = None
        self._syncs: list[Future] = []

    @property
    def count(self) -> int:
        return self._index.count

    def _open_shard(self) -> None:
        fname = f"{self.name}-{len(self._index.shards):06d}.tar"
        self._file = HashingFile(self._dir.tmp / fname)
        self._file_name = fname
        self._shard_samples = 0

    def _close_shard(self) -> None:
        if self._file is None:
            return
        self._file.write(end_of_archive(self._file.pos))
        self._file.flush()
        # The shard's fsync waits on the disk, not the CPU: run it beside the next shard's writing
        # (the commit waits for it, so nothing is renamed into place before it is on disk).
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix="shard-sync")
        self._syncs.append(self._syncer.submit(self._file.close))
        self._index.end_shard(self._file_name, self._file.pos, self._file.sha.hexdigest())
        self._file = None

    def _wait_for_syncs(self) -> None:
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
            self._syncer = None
        syncs, self._syncs = self._syncs, []
        for done in syncs:
            done.result()  # an fsync error fails the write, nothing is committed

    def write(self, sample: Mapping[str, Any]) -> int:
        """Append one sample; returns its index in the dataset."""
        key, fields = split_sample(dict(sample))
        validate_key(key)
        for f in fields:
            if f not in self._known_fields:
                self._known_fields.add(validate_field(f))
        size = sample_bytes(len(v) for v in fields.values())
        if self._file is not None and should_cut(
            samples=self._shard_samples,
            written=self._file.pos,
            next_sample=size,
            shard_size=self.shard_size,
            shard_bytes=self.shard_bytes,
        ):
            self._close_shard()
        if self._file is None:
            self._open_shard()
        # The members tarfile.addfile would write (same headers: TarInfo.tobuf, PAX for long or
        # non-ASCII names), assembled here so a sample is one write and one hash update.
        offsets: dict[str, tuple[int, int]] = {}
        chunks: list[bytes] = []
        assert self._file is not None  # opened just above
        pos = self._file.pos
        for f, data in fields.items():
            name = f"{key}.{f}"
            if len(name) < 100 and name.isascii() and len(data) < 8**11:
                header = ustar_header(name, len(data), self.mtime)
            else:  # long or non-ASCII names need PAX extended headers: let tarfile write them
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o444, self.mtime
                header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            pad = -len(data) % tarfile.BLOCKSIZE
            offsets[f] = (pos + len(header), len(data))
            chunks += (header, data, b"\0" * pad)
            pos += len(header) + len(data) + pad
        self._file.write(b"".join(chunks))
        self._index.add_sample(key, offsets, fields)
        self._shard_samples += 1
        return self._index.count - 1

    def close(self) -> Path:
        self._close_shard()
        self._wait_for_syncs()
        self._index.finish(self.user_metadata)
        return self._dir.commit()

    def abort(self) -> None:
        try:
            if self._file is not None:
                self._file._f.close()
            try:
                self._wait_for_syncs()
            except OSError:
                pass  # the partial directory goes anyway
        finally:
            self._dir.abort()
