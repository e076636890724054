"""LMDB map trimming (mmloader/storage/lmdb/map_trimmer.py): what is mapped stays bounded, and
only LMDB's own map is ever unmapped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import mmloader


def _mapped_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path``."""
    target, rss, current = os.path.realpath(path), 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                current = parts[5] if len(parts) >= 6 else None
            elif line.startswith("Rss:") and current == target:
                rss += int(parts[1])
    return rss


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
@pytest.mark.parametrize("trimmed", [True, False])
def test_lmdb_readers_unmap_what_they_read_from_big_files(tmp_path, monkeypatch, trimmed):
    """Reading every value of a big file maps all of it, unless the trimmer unmaps it as it goes
    (values used after later reads trimmed the map stay right). The bound leaves room for what
    one read of two values may fault in: up to two 2 MB page-cache folios each, whatever else
    this process did before (large folios are the kernel's choice)."""
    from mmloader.storage.lmdb import map_trimmer

    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", (1 << 20) if trimmed else (1 << 40))
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", 512 << 10)
    monkeypatch.setattr(map_trimmer, "CHECK_EVERY", 1)
    rng = np.random.default_rng(0)
    values = [rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes() for _ in range(1000)]  # ~30 MB
    path = tmp_path / "big.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i, v in enumerate(values):
            w.write({"__key__": f"k{i:04d}", "bin": v})
    store = mmloader.open(path)
    order = rng.permutation(len(values)).tolist()
    for views in (True, False):
        got = []
        for a in range(0, len(order), 2):
            _keys, cols = store.read_many(order[a : a + 2], ["bin"], views=views)
            got += [bytes(v) for v in cols["bin"]]  # used after later reads may have trimmed
        assert got == [values[i] for i in order]
    mapped, size_kb = _mapped_kb(path / "data.mdb"), os.path.getsize(path / "data.mdb") / 1024
    if trimmed:
        assert mapped < 0.4 * size_kb, f"{mapped} kB of {size_kb:.0f} kB still mapped"
    else:
        assert mapped > 0.6 * size_kb, "untrimmed, the reads should map the file: the test proves nothing"


def _lmdb_of(path: Path, values: list[bytes]) -> Path:
    with mmloader.LMDBWriter(path) as w:
        for i, v in enumerate(values):
            w.write({"__key__": f"k{i:04d}", "bin": v})
    return path


def _counting_trims(monkeypatch) -> list[str]:
    """Record each trim (the real one still runs)."""
    from mmloader.storage.lmdb import map_trimmer

    trims: list[str] = []
    real = map_trimmer.MapTrimmer.trim

    def trim(self):
        trims.append(self.data_file)
        real(self)

    monkeypatch.setattr(map_trimmer.MapTrimmer, "trim", trim)
    return trims


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_lmdb_map_stays_within_the_bound_whatever_a_fault_maps(tmp_path, monkeypatch):
    """The trimmer measures what is mapped (a fault may map a whole page-cache folio, far more than
    the value it serves): whenever a big file's map is over the bound at a read, that read trims."""
    from mmloader.storage.lmdb import map_trimmer

    bound_kb = 2048
    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", 1 << 20)
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", bound_kb << 10)
    monkeypatch.setattr(map_trimmer, "CHECK_EVERY", 1)
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes() for _ in range(300)]  # ~9.5 MB
    path = _lmdb_of(tmp_path / "bound.lmdb", values)
    store = mmloader.open(path)
    store.read_many([0], ["bin"])
    map_trimmer._TRIMMERS[store.path].trim()  # start from an empty map
    trims = _counting_trims(monkeypatch)
    order = rng.permutation(300).tolist()
    over, untrimmed_over = 0, []
    for a in range(0, len(order), 2):
        before, count = _mapped_kb(path / "data.mdb"), len(trims)
        _keys, cols = store.read_many(order[a : a + 2], ["bin"], views=True)
        assert [bytes(v) for v in cols["bin"]] == [values[i] for i in order[a : a + 2]]
        if before > bound_kb + 64:  # (64 kB: what the first measure's baseline may hold)
            over += 1
            if len(trims) == count:
                untrimmed_over.append(before)
    assert trims and over, "never over the bound: the test proves nothing"
    assert not untrimmed_over, f"reads over the bound that did not trim: {untrimmed_over}"


@pytest.mark.slow
def test_trimming_while_another_thread_opens_environments(tmp_path, monkeypatch):
    """Opening an environment registers its trimmer while other threads read and trim."""
    import threading

    from mmloader.storage.lmdb import map_trimmer

    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", 1)  # every environment is trimmed
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", 0)  # trim at every read
    monkeypatch.setattr(map_trimmer, "CHECK_EVERY", 1)
    rng = np.random.default_rng(2)
    values = [rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes() for _ in range(100)]
    big = mmloader.open(_lmdb_of(tmp_path / "big.lmdb", values))
    others = [_lmdb_of(tmp_path / f"small{i}.lmdb", [b"x" * 100]) for i in range(40)]
    big.read_many([0], ["bin"])
    errors, done = [], threading.Event()

    def read():
        r = np.random.default_rng(3)
        while not done.is_set():
            try:
                idx = r.integers(0, 100, 8).tolist()
                _k, cols = big.read_many(idx, ["bin"], views=True)
                assert [bytes(v) for v in cols["bin"]] == [values[i] for i in idx]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                return

    t = threading.Thread(target=read)
    t.start()
    try:
        for p in others:
            mmloader.open(p).read_many([0], ["bin"])
    finally:
        done.set()
        t.join()
    assert not errors


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_trimming_touches_only_lmdbs_own_map(tmp_path, monkeypatch):
    """The data file may be mapped elsewhere too (a user's mmap): only LMDB's map is unmapped,
    never the memory between two maps of the file."""
    import mmap

    from mmloader.storage.lmdb import map_trimmer
    from mmloader.storage.lmdb.store import shared_env

    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", 1 << 20)
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", 0)
    monkeypatch.setattr(map_trimmer, "CHECK_EVERY", 1)
    rng = np.random.default_rng(4)
    values = [rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes() for _ in range(100)]
    path = _lmdb_of(tmp_path / "twice.lmdb", values)
    with open(path / "data.mdb", "rb") as f:
        user_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    between = np.full(8 << 20, 7, dtype=np.uint8)  # anonymous memory, mapped after the user's map
    store = mmloader.open(path)
    store.read_many([0], ["bin"])
    trims = _counting_trims(monkeypatch)
    start, length = map_trimmer._TRIMMERS[store.path].region
    env, _dbs = shared_env(store.path)
    assert length <= env.info()["map_size"] + os.sysconf("SC_PAGE_SIZE")
    assert not start <= between.ctypes.data < start + length
    for i in range(0, 40, 2):
        _k, cols = store.read_many([i, i + 1], ["bin"], views=True)
        assert [bytes(v) for v in cols["bin"]] == values[i : i + 2]
    assert trims and (between == 7).all() and user_map[:4096] == (path / "data.mdb").read_bytes()[:4096]
    user_map.close()


def test_many_small_lmdb_files_together_are_trimmed(tmp_path, monkeypatch):
    """The threshold is what a process has open in total: many files under it add up."""
    from mmloader.storage.lmdb import map_trimmer

    monkeypatch.setattr(map_trimmer, "_TRIMMERS", {})  # only this test's environments are open
    rng = np.random.default_rng(5)
    values = [rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes() for _ in range(50)]
    a = mmloader.open(_lmdb_of(tmp_path / "a.lmdb", values))
    b = mmloader.open(_lmdb_of(tmp_path / "b.lmdb", values))
    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", int(os.path.getsize(tmp_path / "a.lmdb" / "data.mdb") * 1.5))
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", 0)
    monkeypatch.setattr(map_trimmer, "CHECK_EVERY", 1)
    trims = _counting_trims(monkeypatch)
    for i in range(0, 50, 5):
        a.read_many(list(range(i, i + 5)), ["bin"])
    assert not trims, "one file under the threshold stays mapped"
    for i in range(0, 50, 5):
        assert b.read_many(list(range(i, i + 5)), ["bin"])[1]["bin"] == values[i : i + 5]
    assert trims, "two files over the threshold together are trimmed"


def test_a_map_of_the_file_right_next_to_lmdbs_is_not_taken_for_part_of_it(tmp_path):
    """The kernel may place a user's map of data.mdb right next to LMDB's (a flake of the test
    above): pieces of one map adjoin in memory *and* in file offset; a second map starts again
    at offset 0, so it must not be merged into the region that gets unmapped."""
    import ctypes
    import mmap

    from mmloader.storage.lmdb import map_trimmer
    from mmloader.storage.lmdb.store import shared_env

    path = _lmdb_of(tmp_path / "next.lmdb", [b"x" * 10_000] * 20)
    store = mmloader.open(path)
    store.read_many([0], ["bin"])
    env, _dbs = shared_env(store.path)
    data = str(path / "data.mdb")
    lmdb_start, lmdb_len = map_trimmer._mapping_of(data, _lmdb_map_address(data))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long],
    )
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    size = -(-os.path.getsize(data) // page) * page
    got = None
    with open(data, "rb") as f:
        for want in (lmdb_start + lmdb_len, lmdb_start - size):  # right after LMDB's map, else right before
            got = libc.mmap(want, size, mmap.PROT_READ, mmap.MAP_SHARED | 0x100000, f.fileno(), 0)  # NOREPLACE
            if got == want:
                break
            if got not in (None, ctypes.c_void_p(-1).value):
                libc.munmap(got, size)
            got = None
    if got is None:
        pytest.skip("could not map the file right next to LMDB's map here")
    try:
        assert map_trimmer._mapping_of(data, lmdb_start) == (lmdb_start, lmdb_len)
        assert lmdb_len <= env.info()["map_size"] + os.sysconf("SC_PAGE_SIZE")
    finally:
        libc.munmap(got, size)


def _lmdb_map_address(data_file: str) -> int:
    """An address inside the largest mapping of ``data_file`` (LMDB's map: map_size long)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].rstrip("\n") == os.path.realpath(data_file):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                spans.append((b - a, a))
    return max(spans)[1]
