"""The fork gate (mmloader/storage/lmdb/fork_gate.py): forks while other threads read LMDB, and
Ctrl-Cs caught around reads."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import write_dataset

FORK_WHILE_READING = r"""
import os, sys, threading, time
import mmloader
from mmloader.storage.lmdb.fork_gate import FORK_GATE
store = mmloader.open(sys.argv[1])
n = len(store)
stop = threading.Event()
failures = []

def read_batches():
    i = 0
    while not stop.is_set():
        store.read_many([(i + j) % n for j in range(32)], ["jpg", "txt"])
        store.read(i % n, ["txt"])
        i += 32

def wait_for(pid, what):
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if status != 0:
                failures.append(f"{what} exited with status {status}")
            return
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            failures.append(f"{what} hung")
            return
        time.sleep(0.002)

def fork_children(tag, count):
    for k in range(count):
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child re-opens the environment, as a DataLoader worker does
            os._exit(0 if store.read(k % n, ["txt"])["txt"] == f"caption number {k % n} \u00e9".encode() else 1)
        if time.monotonic() - t0 > 5:
            failures.append(f"{tag}: fork {k} waited {time.monotonic() - t0:.0f} s")
        wait_for(pid, f"{tag}: child {k}")

readers = [threading.Thread(target=read_batches, daemon=True) for _ in range(2)]
for t in readers:
    t.start()
time.sleep(0.2)
fork_children("main", 20)
forkers = [threading.Thread(target=fork_children, args=(tag, 10)) for tag in "AB"]  # two forks at once
for t in forkers:
    t.start()
for t in forkers:
    t.join()
with FORK_GATE.hold():  # a fork from inside an LMDB call: neither side waits for it, the child leaves it cleanly
    pid = os.fork()
if pid == 0:
    os._exit(0 if store.read(1, ["txt"]) else 1)
wait_for(pid, "child forked inside the gate")
stop.set()
print("\n".join(failures) or "forked 41 children", flush=True)
"""


@pytest.mark.process
def test_fork_while_other_threads_read_lmdb(tmp_path):
    """A child forked while another thread is inside an LMDB call inherited py-lmdb's count of
    calls in flight and hung closing the environment (about half the children did): e.g. a
    DataLoader's workers started while the thread backend read a batch. Also two threads forking
    at once, and a fork from inside an LMDB call."""
    path = write_dataset(tmp_path / "f.lmdb", 100, "lmdb")
    r = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_READING, str(path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip() == "forked 41 children", r.stdout + r.stderr[-2000:]


CTRL_C_WHILE_READING = r"""
import os, sys, time, signal, subprocess
import mmloader
from mmloader.storage.lmdb.fork_gate import FORK_GATE
store = mmloader.open(sys.argv[1]); n = len(store)
armed = [False]
class Interrupted(Exception):
    pass
def handler(sig, frame):
    if armed[0]:
        armed[0] = False
        raise Interrupted()
signal.signal(signal.SIGINT, handler)
pinger = subprocess.Popen([sys.executable, "-c", "import os, time, random\nwhile True:\n"
                           f"    time.sleep(random.uniform(0.0002, 0.002)); os.kill({os.getpid()}, 2)"])
interrupts = held = 0
end = time.time() + 4
while time.time() < end:
    try:
        armed[0] = True
        while True:
            for i in range(n):
                store.read(i, ["txt"])
                store.read_many([i, (i + 1) % n], ["txt"])
    except Interrupted:
        interrupts += 1
        held += any(lock._is_owned() for lock in FORK_GATE._locks.values())
signal.signal(signal.SIGINT, signal.SIG_IGN)
pinger.kill()
pinger.wait()
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print(interrupts, held, round(time.monotonic() - t0, 1), flush=True)
"""


@pytest.mark.process
def test_ctrl_c_caught_around_reads_leaves_the_fork_gate_open(tmp_path):
    """Thousands of Ctrl-Cs caught around LMDB reads: no thread is left counted inside the gate
    (a counter in Python lost updates to them, and every later fork waited 30 s)."""
    path = write_dataset(tmp_path / "c.lmdb", 50, "lmdb")
    r = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_READING, str(path)], capture_output=True, text=True, timeout=120
    )
    interrupts, held, fork_s = r.stdout.split()
    assert int(interrupts) > 100 and int(held) == 0 and float(fork_s) < 5, r.stdout + r.stderr[-2000:]
