"""Bounding how much of an LMDB data file stays mapped in a process.

Pages read through LMDB's memory map stay mapped until the map is closed, and
the kernel maps 64 KiB or more around each fault: a worker reading random samples
of a dataset much larger than what it reads would map ever more of it. This
module drops a process's own mappings of big data files now and then
(``madvise(MADV_DONTNEED)``); the page cache keeps the data.
"""
from __future__ import annotations

import os

TRIM_FILES_OVER = 512 << 20  # smaller data files stay mapped: they fit, and mapped reads are fastest
TRIM_AFTER_BYTES = 64 << 20  # mapped bytes (estimated) a process reads before it unmaps them
_FAULT_AROUND = 64 << 10  # Linux maps cached pages around each fault (64 KiB by default, whole large folios)
_MADV_DONTNEED = 4
_INLINE_MAX = 2048  # larger values live on overflow pages of their own


class MapTrimmer:
    """Bounds how much of an LMDB data file stays mapped in this process.

    Pages read through LMDB's memory map stay mapped until the map is closed, and
    the kernel maps 64 KiB or more around each fault: a worker reading random samples
    of a dataset much larger than what it reads would map ever more of it (measured:
    10k reads of a 100k-sample dataset added 124 MB to the workers' PSS; over many
    epochs every process would map the whole file, and RSS-based monitors count it
    once per process). For data files over ``TRIM_FILES_OVER``, every ``TRIM_AFTER_BYTES``
    read (estimated) this drops the process's mappings of the file
    (``madvise(MADV_DONTNEED)``): the page cache keeps the data, later reads map it back
    from memory, nothing is copied or lost. The price is those refaults and the madvise
    calls (see benchmarks/RESULTS.md, memory section). Linux only; elsewhere a no-op.
    """

    @classmethod
    def start(cls, path: str, data_file: str) -> "MapTrimmer":
        """Create and register the trimmer of the environment at ``path`` (call after opening it)."""
        trimmer = _TRIMMERS[path] = cls(data_file)
        return trimmer

    def __init__(self, data_file: str):
        small = os.path.getsize(data_file) <= TRIM_FILES_OVER
        self.region = None if small else _mapping_of(data_file)
        self.pending = 0

    def account(self, values) -> None:
        """Count values just read (only those on overflow pages of their own map new pages)."""
        if self.region is not None:
            big = [len(v) for v in values if v is not None and len(v) > _INLINE_MAX]
            self.pending += sum(big) + _FAULT_AROUND * len(big)

    def maybe_trim(self) -> None:
        """Called before a read. Safe at any time, also while another thread uses views into
        the map: a page touched after the trim is faulted back in from the page cache."""
        if self.pending >= TRIM_AFTER_BYTES:
            self.pending = 0
            if self.region is not None and _madvise(*self.region, _MADV_DONTNEED) != 0:
                self.region = None  # not allowed here: stop trying


_TRIMMERS: dict[str, MapTrimmer] = {}


def trimmer_for(path: str) -> MapTrimmer | None:
    """The trimmer of the environment at ``path`` in this process (None before it is opened)."""
    return _TRIMMERS.get(path)


def forget_trimmers() -> None:
    """Drop every trimmer (a forked child re-opens its environments, and their maps)."""
    _TRIMMERS.clear()


def _mapping_of(path: str) -> tuple[int, int] | None:
    """(start, length) of this process's memory map of ``path``, from /proc/self/maps."""
    try:
        target = os.path.realpath(path)
        spans = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].rstrip("\n") == target:
                    a, b = parts[0].split("-")
                    spans.append((int(a, 16), int(b, 16)))
    except (OSError, ValueError):
        return None
    if not spans:
        return None
    start = min(a for a, _b in spans)
    return start, max(b for _a, b in spans) - start


def _madvise(start: int, length: int, advice: int) -> int:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return int(libc.madvise(start, length, advice))
    except (OSError, AttributeError):
        return -1
