"""Bounding how much of an LMDB data file stays mapped in a process.

Pages read through LMDB's memory map stay mapped until the map is closed, and a fault
maps far more than the page it needs: 64 KiB of fault-around, or the whole page-cache folio
(hundreds of KB for a file that entered the cache sequentially). A worker reading random
samples of a big dataset would map ever more of it. This module measures what the process
has mapped and drops its own mappings of big data files (``madvise(MADV_DONTNEED)``) when that
grows past a bound; the page cache keeps the data.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("mmloader")

TRIM_FILES_OVER = 512 << 20  # data files of a process totalling less stay mapped (they fit; mapped reads are fastest)
TRIM_AFTER_BYTES = 64 << 20  # growth of this process's mapped file pages (measured) before it unmaps
CHECK_EVERY = 32  # values read between two measurements (one read of /proc/self/statm, ~3 us)
_MADV_DONTNEED = 4


class MapTrimmer:
    """Bounds how much of an LMDB data file stays mapped in this process.

    Pages read through LMDB's memory map stay mapped until the map is closed, and the kernel
    maps whole page-cache folios around each fault: on a 2 GB dataset that entered the page
    cache sequentially, one 20 KB sample mapped ~690 KB (measured: 10k random reads mapped
    1 GB). Over many epochs every process would map the whole file, and RSS-based monitors
    count it once per process. When the data files a process has open total more than
    ``TRIM_FILES_OVER`` (one big file or many small ones), :func:`maybe_trim`
    measures this process's resident file-backed pages (``/proc/self/statm``) every
    ``CHECK_EVERY`` values read, and when they have grown by ``TRIM_AFTER_BYTES`` since the
    last trim it drops the process's mappings of those files (``madvise(MADV_DONTNEED)``):
    the page cache keeps the data, later reads map it back from memory, nothing is copied or
    lost. Measuring instead of estimating holds the bound whatever the folio sizes are. The
    measure is the whole process's (other mapped files and shared memory count too), so a
    process reading another big mapped file trims a little more often than it needs to. The
    price is the refaults and the madvise calls (benchmarks/RESULTS.md, memory section).
    Linux only; elsewhere a no-op.

    >>> MapTrimmer.start(env_dir, env_dir + "/data.mdb", inside=address_of_a_value)  # doctest: +SKIP
    >>> maybe_trim(len(batch))                              # before each read   # doctest: +SKIP
    """

    @classmethod
    def start(cls, path: str, data_file: str, inside: int | None) -> "MapTrimmer":
        """Create and register the trimmer of the environment at ``path`` (call after opening it);
        ``inside``: an address inside LMDB's map of ``data_file`` (None: nothing to trim)."""
        trimmer = _TRIMMERS[path] = cls(data_file, inside)
        return trimmer

    def __init__(self, data_file: str, inside: int | None):
        self.data_file = data_file
        self.size = os.path.getsize(data_file)
        self.region = None if inside is None else _mapping_of(data_file, inside)

    def trim(self) -> None:
        """Drop this process's mappings of the file. Safe at any time, also while another thread
        uses views into the map: a page touched after the trim is faulted back in from the cache."""
        if self.region is not None and _madvise(*self.region, _MADV_DONTNEED) != 0:
            self.region = None  # not allowed here (e.g. memory locked): stop trying, and say so
            log.warning(
                "mmloader: cannot unmap what was read of %s (madvise refused); its pages stay mapped in this process",
                self.data_file,
            )


class _Meter:
    """This process's resident file-backed bytes, and their level after the last trim."""

    def __init__(self) -> None:
        self.pid, self.fd, self.reads = -1, -1, 0
        self.baseline: int | None = None
        self.lock = threading.Lock()

    def resident_file_bytes(self) -> int | None:
        """``shared`` of /proc/self/statm (file-backed + shmem pages), read by an fd opened in this
        process (/proc/self names the process that opened it), or None without /proc."""
        if self.pid != os.getpid():
            self.pid, self.baseline, self.reads = os.getpid(), None, 0
            try:
                self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = -1
        if self.fd < 0:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[2]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_METER = _Meter()
_TRIMMERS: dict[str, MapTrimmer] = {}


def maybe_trim(values: int = 1) -> None:
    """Call before reading ``values`` values through a trimmed map: every ``CHECK_EVERY`` values,
    measure, and trim every big map of this process when they have grown past the bound."""
    meter = _METER
    meter.reads += values
    if meter.reads < CHECK_EVERY:  # the hot path: one addition per read
        return
    meter.reads = 0
    trimmers = tuple(_TRIMMERS.values())  # a snapshot: another thread may open an environment
    if sum(t.size for t in trimmers) <= TRIM_FILES_OVER or not any(t.region is not None for t in trimmers):
        return
    with meter.lock:  # threads of one process share the maps and the measure
        now = meter.resident_file_bytes()
        if now is None:
            return
        trimmed = meter.baseline is not None and now - meter.baseline >= TRIM_AFTER_BYTES
        if trimmed:
            for trimmer in trimmers:
                trimmer.trim()
            now = meter.resident_file_bytes()
        if trimmed or meter.baseline is None or (now is not None and now < meter.baseline):
            meter.baseline = now  # first measure, after a trim, or other files unmapped: count from here


def forget_trimmers() -> None:
    """Drop every trimmer and the measure (a forked child re-opens its environments, and their
    maps; its lock must not be one another thread of the parent held at the fork)."""
    _TRIMMERS.clear()
    if _METER.fd >= 0:
        try:
            os.close(_METER.fd)  # the parent's /proc/self/statm: it would measure the parent
        except OSError:
            pass
    type(_METER).__init__(_METER)


def _mapping_of(path: str, inside: int) -> tuple[int, int] | None:
    """(start, length) of the mapping of ``path`` that holds address ``inside`` (with the
    pieces the kernel split it into: adjoining in memory *and* in file offset), from
    /proc/self/maps. Only that map: the file may be mapped elsewhere too (a user's mmap,
    which the kernel may place right next to LMDB's), and MADV_DONTNEED would wipe it."""
    try:
        target = os.path.realpath(path)
        spans = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].rstrip("\n") == target:
                    a, b = parts[0].split("-")
                    spans.append((int(a, 16), int(b, 16), int(parts[2], 16)))
    except (OSError, ValueError):
        return None
    spans.sort()
    hit = next((j for j, (a, b, _o) in enumerate(spans) if a <= inside < b), None)
    if hit is None:
        return None

    def continues(left: tuple[int, int, int], right: tuple[int, int, int]) -> bool:
        return left[1] == right[0] and left[2] + (left[1] - left[0]) == right[2]

    first = last = hit
    while first > 0 and continues(spans[first - 1], spans[first]):
        first -= 1
    while last + 1 < len(spans) and continues(spans[last], spans[last + 1]):
        last += 1
    return spans[first][0], spans[last][1] - spans[first][0]


def _madvise(start: int, length: int, advice: int) -> int:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return int(libc.madvise(start, length, advice))
    except (OSError, AttributeError):
        return -1
