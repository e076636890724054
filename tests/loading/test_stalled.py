"""Worker processes that deliver nothing by the loader's deadline: the error says where each one is."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import write_dataset

import mmloader
from mmloader.errors import WorkerStalledError
from mmloader.loading.stalled import DEFAULT_TIMEOUT_S, StackDumps, stalled_error, worker_timeout


def _caption_that_never_comes(text: str) -> str:
    """Blocks for good in a worker (the training process reads the same reader normally)."""
    if torch.utils.data.get_worker_info() is not None:
        time.sleep(3600)
    return text


@pytest.mark.process
@pytest.mark.parametrize("context, deadline", [("fork", 3), ("spawn", 10)])  # (spawned: torch imported first)
def test_a_worker_stuck_in_a_read_is_named_with_its_stack_after_the_deadline(tmp_path, context, deadline):
    path = write_dataset(tmp_path / "p.lmdb", 8, "lmdb")
    ds = mmloader.zip(caption=mmloader.TextReader(path, transform=_caption_that_never_comes))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=2),
        num_workers=2,
        backend="process",
        timeout=deadline,
        multiprocessing_context=context,
    )
    started = time.monotonic()
    with pytest.raises(WorkerStalledError) as caught:
        next(iter(loader))
    message = str(caught.value)
    assert time.monotonic() - started < 60  # the deadline, the stacks, the shutdown: not the sleep
    assert f"no batch from the DataLoader worker processes in {deadline} s" in message
    assert message.count("worker pid") == 2 and message.count("in _caption_that_never_comes") == 2
    assert "timeout=" in message
    if context == "fork":  # a lock inherited at fork is what spawn avoids; spawned workers are told otherwise
        assert "multiprocessing_context='spawn'" in message
    else:
        assert "Workers started by 'spawn' import the main module" in message and "inherited" not in message
    workers = loader.dataloader._iterator
    assert workers is None  # shut down: nothing left sleeping for an hour


class _SlowToUnpickle:
    """A transform whose unpickling hangs in a child process (a spawned worker receives the stream
    pickled): the worker never reaches its loop, so it has no stack to give."""

    def __init__(self) -> None:
        self.made_in = os.getpid()

    def __call__(self, text: str) -> str:
        return text

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.made_in:  # (parent_process() is not set yet while a child unpickles)
            time.sleep(3600)


@pytest.mark.process
def test_a_spawned_worker_stuck_while_starting_is_said_so_with_the_spawn_remedy(tmp_path):
    path = write_dataset(tmp_path / "p.lmdb", 4, "lmdb")
    ds = mmloader.zip(caption=mmloader.TextReader(path, transform=_SlowToUnpickle()))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=2), num_workers=1, backend="process", timeout=8, multiprocessing_context="spawn"
    )
    with pytest.raises(WorkerStalledError) as caught:  # (not torch's "killed by signal" for the stop it causes)
        next(iter(loader))
    message = str(caught.value)
    assert "never reached its worker loop (stuck starting: importing the main module, or unpickling" in message
    assert "Workers started by 'spawn' import the main module" in message and "inherited the lock" not in message
    assert loader.dataloader._iterator is None


class _Owner:
    """What a StackDumps folder lives as long as (a Loader)."""


KILLED_WITH_A_LOADER = """
import os, signal
from mmloader.loading.stalled import StackDumps
class Owner: pass
owner = Owner()
print(StackDumps(owner).folder, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.process
def test_a_worker_that_never_ran_python_is_said_to_have_hung_while_starting():
    """A pid that never armed its dump (as a worker stuck in an inherited lock while starting)."""
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = _Owner()
        dumps = StackDumps(owner)
        stacks = dumps.collect([stuck.pid])
        (name,) = stacks
        assert name.startswith(f"worker pid {stuck.pid}") and stacks[name] is None
        message = str(stalled_error(600, stacks))
        assert f"{name}: never ran its first line of Python (hung while starting)" in message
        assert "stuck in a lock while starting" in message and "'spawn'" in message
    finally:
        stuck.kill()
        stuck.wait()
    folder = dumps.folder
    del owner
    assert not os.path.exists(folder)  # removed with its loader
    killed = subprocess.run([sys.executable, "-c", KILLED_WITH_A_LOADER], capture_output=True, text=True, timeout=120)
    left = Path(killed.stdout.strip())
    assert killed.returncode == -9 and left.is_dir()  # SIGKILL: nothing of the process ran to remove it
    StackDumps(_Owner())  # the next loader of this user sweeps it
    assert not left.exists()


def test_the_deadline_is_given_or_from_the_environment_and_zero_is_forever(monkeypatch):
    monkeypatch.delenv("MMLOADER_WORKER_TIMEOUT", raising=False)
    assert worker_timeout(None) == DEFAULT_TIMEOUT_S and worker_timeout(0) == 0.0
    monkeypatch.setenv("MMLOADER_WORKER_TIMEOUT", "45")
    assert worker_timeout(None) == 45.0 and worker_timeout(5) == 5.0
    monkeypatch.setenv("MMLOADER_WORKER_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"\$MMLOADER_WORKER_TIMEOUT='soon': expected seconds"):
        worker_timeout(None)
    for bad in (-1, float("inf"), float("nan"), "10", True):
        with pytest.raises(ValueError, match=r"timeout=.*expected seconds, a finite number >= 0"):
            worker_timeout(bad)
    for bad in ("-5", "inf", "nan"):
        monkeypatch.setenv("MMLOADER_WORKER_TIMEOUT", bad)
        with pytest.raises(ValueError, match=r"\$MMLOADER_WORKER_TIMEOUT=.*expected seconds"):
            worker_timeout(None)


def test_a_producer_thread_stuck_in_a_read_is_named_with_its_stack_after_the_deadline(tmp_path):
    path = write_dataset(tmp_path / "p.lmdb", 8, "lmdb")
    release = threading.Event()

    def caption(text: str) -> str:
        release.wait(120)  # until the test has the error (then the producer ends)
        return text

    ds = mmloader.zip(caption=mmloader.TextReader(path, transform=caption))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=2), num_workers=1, backend="thread", timeout=1)
    try:
        with pytest.raises(WorkerStalledError) as caught:
            next(iter(loader))
    finally:
        release.set()
    message = str(caught.value)
    assert "no batch from the loader's threads in 1 s" in message
    assert "thread mmloader-0:" in message and ", in caption\n" in message
    assert "release.wait(120)" in message and "timeout=" in message
    assert [b["caption"] for b in loader] and len(list(loader)) == 4  # the next pass, released, reads on


def test_a_live_sources_own_wait_is_never_cut_by_the_default_deadline(monkeypatch):
    """A live source waits up to its timeout for each sample: the loader's default deadline is at
    least twice a whole batch of such waits; one given explicitly is the user's."""
    monkeypatch.delenv("MMLOADER_WORKER_TIMEOUT", raising=False)
    slow = mmloader.LiveStream(
        mmloader.live(lambda rank, world, worker, workers: iter(range(10)), timeout=120), batch_size=4, steps=2
    )
    assert slow.longest_wait_s == 480.0
    assert mmloader.loader(slow, 1, backend="thread").timeout == 960.0
    assert mmloader.loader(slow, 1, backend="thread", timeout=30).timeout == 30.0
    quick = mmloader.LiveStream(
        mmloader.live(lambda rank, world, worker, workers: iter(range(10)), timeout=5), batch_size=4, steps=2
    )
    assert mmloader.loader(quick, 1, backend="thread").timeout == DEFAULT_TIMEOUT_S
