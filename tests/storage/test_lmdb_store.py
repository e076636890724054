"""The LMDB store and writer (mmloader/storage/lmdb/store.py): a map that grows, pages without
leftover heap bytes, one environment per process and a dataset written again under its path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mmloader


def test_lmdb_map_grows_when_full(tmp_path):
    big = os.urandom(300_000)
    with mmloader.LMDBWriter(tmp_path / "small.lmdb", map_size=1 << 20, commit_every=3) as w:
        for i in range(20):  # 6 MB into a 1 MB map
            w.write({"__key__": f"k{i}", "bin": big[i:] + big[:i]})
    ds = mmloader.open(tmp_path / "small.lmdb")
    assert len(ds) == 20 and ds[19]["bin"] == big[19:] + big[:19]


LEFTOVER_HEAP = r"""
import os, sys
import mmloader
marker = b"LEFTOVER-SECRET-"
junk = [marker * (i % 500 + 1) + os.urandom(8) for i in range(20000)]  # freed heap blocks of many sizes
del junk
with mmloader.LMDBWriter(sys.argv[1]) as w:
    for i in range(3000):
        w.write({"__key__": f"k{i:05d}", "txt": "short caption " * (i % 5 + 1), "jpg": os.urandom(5000 + i % 7000)})
print("leaked" if marker in open(os.path.join(sys.argv[1], "data.mdb"), "rb").read() else "clean")
"""


@pytest.mark.process
def test_lmdb_files_hold_no_leftover_heap_bytes(tmp_path):
    """Pages are zeroed before use (LMDB's meminit): with it off, bytes the writing process had
    freed (here a marker; in real life captions of other datasets, credentials) were written into
    the unused part of pages, in files that are handed to strangers."""
    r = subprocess.run(
        [sys.executable, "-c", LEFTOVER_HEAP, str(tmp_path / "x.lmdb")], capture_output=True, text=True, timeout=300
    )
    assert r.stdout.strip() == "clean", r.stdout + r.stderr[-2000:]


def test_a_dataset_written_again_in_this_process_is_read_anew(tmp_path):
    """An LMDB environment is opened once per process; a dataset written again under the same
    path (overwrite=True) must not go on being served from the old file's map."""
    path = tmp_path / "again.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "k0", "txt": "old"})
    assert mmloader.open(path)[0]["txt"] == b"old"
    with mmloader.LMDBWriter(path, overwrite=True) as w:
        w.write({"__key__": "k0", "txt": "new value"})
    store = mmloader.open(path)
    assert store[0]["txt"] == b"new value" and store.metadata["field_bytes"]["txt"] == 9


def _write_tagged(path, tag: str, fmt: str, n: int = 40) -> None:
    extra = {} if fmt == "lmdb" else {"shard_size": 8}
    with mmloader.writer_for(path, fmt, overwrite=True, **extra) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:03d}", "txt": f"{tag} {i} " + "x" * (i * 7 % 13)})


def test_lmdb_written_again_beside_its_old_lock_file_opens_while_the_old_one_is_open(tmp_path):
    """py-lmdb refuses files of an environment open in this process, lock.mdb included: a new
    data.mdb beside the old lock.mdb (or one that took the inode of a deleted lock.mdb) was
    refused with 'already open in this process' while the old store was still open."""
    _write_tagged(tmp_path / "a.lmdb", "A", "lmdb")
    _write_tagged(tmp_path / "b.lmdb", "B", "lmdb")
    assert (tmp_path / "a.lmdb" / "lock.mdb").is_file()
    old = mmloader.open(tmp_path / "a.lmdb")
    assert bytes(old[1]["txt"]) == b"A 1 xxxxxxx"
    (tmp_path / "a.lmdb" / ".new").write_bytes((tmp_path / "b.lmdb" / "data.mdb").read_bytes())
    os.replace(tmp_path / "a.lmdb" / ".new", tmp_path / "a.lmdb" / "data.mdb")  # lock.mdb stays
    new = mmloader.open(tmp_path / "a.lmdb")
    assert bytes(new[1]["txt"]) == b"B 1 xxxxxxx"
    assert bytes(old[2]["txt"]) == b"A 2 " + b"x" * 1  # the old store reads the file it opened


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_converting_again_in_one_process_with_readers_alive(tmp_path, fmt):
    """A notebook converts into one path again and again while a reader of the first dataset
    keeps reading in a thread: every new open reads the new data, the old reader its own."""
    import threading

    from mmloader.converters.pairs import main as convert_pairs

    path = tmp_path / ("d.lmdb" if fmt == "lmdb" else "d")
    _write_tagged(path, "A", fmt)
    old = mmloader.open(path)
    wrong: list = []
    stop = threading.Event()

    def keep_reading() -> None:
        while not stop.is_set():
            try:
                value = bytes(old[7]["txt"])
            except Exception as e:  # noqa: BLE001 - any failure of the old reader is the test's
                wrong.append(repr(e))
                return
            if value != b"A 7 " + b"x" * (49 % 13):
                wrong.append(value)
                return

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        raw = tmp_path / "raw"
        raw.mkdir()
        for round in range(12):
            if round % 3 == 2:  # through the converter, as the CLI runs it
                for i in range(5):
                    (raw / f"s{i}.txt").write_text(f"C{round} {i}")
                assert convert_pairs([str(raw), str(path), "--overwrite", "-q"]) == 0
                assert bytes(mmloader.open(path)[3]["txt"]) == f"C{round} 3".encode()
            else:
                _write_tagged(path, f"B{round}", fmt)
                assert bytes(mmloader.open(path)[3]["txt"]).startswith(f"B{round} 3".encode()), round
    finally:
        stop.set()
        reader.join(30)
    assert not wrong
