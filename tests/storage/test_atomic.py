"""Atomic writes (mmloader/storage/write/atomic.py): a killed or failed writer leaves nothing under
the final name; an existing destination needs overwrite."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import TESTS, write_dataset

import mmloader

WRITER_SCRIPT = r"""
import sys, os, mmloader
sys.path.insert(0, {tests!r})
from conftest import make_samples
with mmloader.writer_for({dst!r}, {fmt!r}, shard_size=3) as w:
    for i, s in enumerate(make_samples(100000)):
        w.write(s)
        if i == 50:
            print("started", flush=True)
"""


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_killed_writer_leaves_nothing_under_final_name(tmp_path, fmt):
    dst = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out")
    script = WRITER_SCRIPT.format(tests=str(TESTS), dst=str(dst), fmt=fmt)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dst.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # only a hidden partial sibling
    with pytest.raises(FileNotFoundError):
        mmloader.open(dst)


def test_failed_writer_leaves_nothing(tmp_path):
    dst = tmp_path / "x.lmdb"
    with pytest.raises(RuntimeError):
        with mmloader.LMDBWriter(dst) as w:
            w.write({"__key__": "a", "txt": "x"})
            raise RuntimeError("boom")
    assert not dst.exists() and not list(tmp_path.iterdir())


def test_existing_destination_needs_overwrite(tmp_path, tar_ds):
    dst = tmp_path / "d"
    write_dataset(dst, 3, "tar")
    with pytest.raises(FileExistsError, match="overwrite"):
        mmloader.ShardWriter(dst)
    write_dataset(dst, 5, "tar", overwrite=True)
    assert len(mmloader.open(dst)) == 5
