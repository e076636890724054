"""Nothing the suite starts listens beyond loopback: the watch that checks it (tests/listeners.py,
run for the whole session by conftest.py) sees a listener on every interface, and the suite's
servers (moto's S3, the Range HTTP server, the local Hub) and a Ray cluster listen on loopback only."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from listeners import Watch, beyond_loopback, is_loopback, listening

LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
    "s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)\n"
)


def _listener(address: str, session_watch: Watch) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, "-c", LISTEN, address], stdout=subprocess.PIPE, text=True)
    session_watch.ignored.add(child.pid)  # (before it binds: ~30 ms to start Python)
    return child, int(child.stdout.readline())


@pytest.mark.process
def test_the_watch_sees_a_listener_on_every_interface_and_not_one_on_loopback(loopback_only):
    for address, wide in (("0.0.0.0", True), ("::", True), ("127.0.0.1", False), ("::1", False)):
        with Watch(period_s=0.1) as watch:
            child, port = _listener(address, loopback_only)
            try:
                time.sleep(0.3)
                assert (address, port) in listening(child.pid)
            finally:
                child.kill()
                child.wait()
        assert bool([s for s in watch.seen if f":{port}" in s]) == wide, (address, watch.seen)


@pytest.mark.process
def test_a_listener_on_every_interface_of_a_loopback_only_namespace_is_loopback(loopback_only):
    """torchft's managers bind ``::`` and take no other address: the torchft tests run them in a
    network namespace whose only interface is loopback (``unshare -n``), where that is loopback."""
    cmd = ["unshare", "-n", "sh", "-c", f'ip link set lo up && exec "{sys.executable}" -c "$0" ::', LISTEN]
    with Watch(period_s=0.1) as watch:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        loopback_only.ignored.add(child.pid)  # (the session's watch: the check is this one's)
        try:
            port = int(child.stdout.readline())
            time.sleep(0.3)
            assert ("::", port) in listening(child.pid)
        finally:
            child.kill()
            child.wait()
    assert not [s for s in watch.seen if f":{port}" in s], watch.seen


def test_loopback_addresses():
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1"))


@pytest.mark.network
def test_the_suite_servers_listen_on_loopback_only(tmp_path):
    from remote_servers import MotoS3, RangeServer

    sys.path.insert(0, str(ROOT / "samples"))
    from local_hub import HubServer

    servers = [MotoS3(), RangeServer(tmp_path), HubServer()]
    try:
        ours = listening(os.getpid())
        assert len(ours) >= 4 and all(is_loopback(a) for a, _port in ours), ours
        assert beyond_loopback(os.getpid()) == []
    finally:
        for s in servers:
            s.stop()
