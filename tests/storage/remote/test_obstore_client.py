"""The client (obstore) against the local servers (moto's S3, a Range-honouring HTTP server on
127.0.0.1): a real round trip, headers, certificates, first contacts, and a clean exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from conftest import TESTS
from remote_servers import RangeServer, own_cache, s3  # noqa: F401  (fixtures)

from mmloader.storage.remote import Location, ObjectChangedError
from mmloader.storage.remote.obstore_client import _ObstoreClient

pytest.importorskip("obstore")


def _client(url: str, **options) -> _ObstoreClient:
    return _ObstoreClient(Location(url, options))


def test_a_round_trip_on_s3(s3, tmp_path):
    url = f"s3://{s3.bucket}/clients-{uuid.uuid4().hex[:6]}"
    client = _client(url)
    payload = os.urandom(100_000)
    (tmp_path / "b.bin").write_bytes(payload[::-1])
    client.put_bytes("a.bin", payload)
    client.put_file("sub/b.bin", str(tmp_path / "b.bin"))

    size, etag = client.head("a.bin")
    assert size == len(payload) and etag
    assert client.head("missing.bin") == (None, None)
    assert client.get("a.bin") == payload
    assert [bytes(b) for b in client.get_many(["a.bin", "sub/b.bin"])] == [payload, payload[::-1]]
    ranges = [("a.bin", 0, 10), ("a.bin", 99_990, 100_000), ("sub/b.bin", 500, 1500)]
    want = [payload[:10], payload[-10:], payload[::-1][500:1500]]
    assert [bytes(b) for b in client.get_ranges(ranges)] == want
    assert bytes(client.start_range("a.bin", 7, 70).result(30)) == payload[7:70]
    assert [bytes(b) for b in client.start_ranges(ranges).result(30)] == want
    assert sorted(client.list("")) == [("a.bin", len(payload)), ("sub/b.bin", len(payload))]
    assert [n for n, _ in client.list("sub")] == ["sub/b.bin"]
    versions = client.versions()
    assert versions["a.bin"] == etag and set(versions) == {"a.bin", "sub/b.bin"}

    with pytest.raises(FileNotFoundError, match="missing.bin"):
        client.get("missing.bin")
    pinned = _client(url)
    pinned.location.pin("sub/b.bin", '"not-its-etag"')  # as if opened on another version
    with pytest.raises(ObjectChangedError, match="sub/b.bin"):
        pinned.get_ranges([("sub/b.bin", 0, 10)])
    client.delete("a.bin")
    client.delete("a.bin")  # a missing object is not an error
    assert client.head("a.bin") == (None, None)


def test_reads_over_plain_http(tmp_path):
    payload = os.urandom(50_000)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x.bin").write_bytes(payload)
    server = RangeServer(tmp_path)
    try:
        client = _client(f"{server.url}/ds")
        assert client.head("x.bin")[0] == len(payload)
        assert client.get("x.bin") == payload
        assert [bytes(b) for b in client.get_ranges([("x.bin", 1, 5), ("x.bin", 40_000, 50_000)])] == [
            payload[1:5],
            payload[40_000:],
        ]
        assert bytes(client.start_range("x.bin", 0, 3).result(30)) == payload[:3]
        with pytest.raises(ObjectChangedError, match="x.bin"):  # a range beyond the end: truncated or replaced
            client.get_ranges([("x.bin", 49_000, 60_000)])
        with pytest.raises(FileNotFoundError):
            client.get("nothing.bin")
    finally:
        server.stop()


def test_the_headers_option_is_sent_and_unknown_options_are_refused(tmp_path):
    """``storage_options={"headers": ...}`` (fsspec's spelling) is sent, and a key the client does
    not read is refused naming it (it was ignored without a word)."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x.bin").write_bytes(b"payload")
    server = RangeServer(tmp_path, authorization="Bearer the-right-token")
    try:
        url = f"{server.url}/ds"
        client = _ObstoreClient(Location(url, {"headers": {"Authorization": "Bearer the-right-token"}}))
        assert client.get("x.bin") == b"payload" and server.seen[-1] == "Bearer the-right-token"
    finally:
        server.stop()
    with pytest.raises(
        ValueError, match=r"unknown storage_options \['heders'\] .*accepted: .*default_headers, headers"
    ):
        Location(url, {"heders": {"Authorization": "Bearer x"}})
    with pytest.raises(ValueError, match="given twice"):
        Location(url, {"headers": {"authorization": "Bearer x"}, "default_headers": {"Authorization": "Bearer y"}})
    with pytest.raises(ValueError, match=r"unknown storage_options \['anon'\] for s3:// URLs"):
        Location("s3://bucket/ds", {"anon": True})


def test_a_process_that_read_through_obstore_exits_cleanly(tmp_path):
    """obstore's threads could call into Python while the interpreter finalized, after every
    request had completed: SIGABRT at exit in 16 of 80 fresh processes on a loaded machine. The
    exit now gives them a moment (remote.runtime._settle_at_exit)."""
    pytest.importorskip("obstore")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x.bin").write_bytes(b"payload")
    server = RangeServer(tmp_path)
    code = (
        "import os; from mmloader.storage.remote import Location; "
        "from mmloader.storage.remote.obstore_client import _ObstoreClient; "
        "assert _ObstoreClient(Location(os.environ['URL'])).get('x.bin') == b'payload'"
    )
    try:
        env = {**os.environ, "URL": f"{server.url}/ds"}
        codes = [
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode for _ in range(12)
        ]
    finally:
        server.stop()
    assert codes == [0] * 12, codes


def test_certificates(tmp_path):
    """A certificate that does not verify fails at once, saying so; one a private CA made is
    trusted through SSL_CERT_FILE, and ``allow_invalid_certificates`` reads from a server without
    checking it."""
    from remote_servers import make_certificate

    from mmloader.storage.remote import Policy, RemoteError

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x.bin").write_bytes(b"payload")
    server = RangeServer(tmp_path, tls=make_certificate(tmp_path))
    url = f"{server.url}/ds"
    try:
        t = time.monotonic()
        with pytest.raises(RemoteError, match="TLS certificate does not verify"):
            _ObstoreClient(Location(url, policy=Policy(retry_deadline=60))).get("x.bin")
        assert time.monotonic() - t < 10  # not retried for the minute the deadline allows
        unchecked = Location(url, {"allow_invalid_certificates": True})
        assert _ObstoreClient(unchecked).get("x.bin") == b"payload"
        # SSL_CERT_FILE set when the process starts, as a user sets it
        code = (
            f"from test_obstore_client import _ObstoreClient, Location; "
            f"assert _ObstoreClient(Location({url!r})).get('x.bin') == b'payload'"
        )
        env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "cert.pem"), "PYTHONPATH": str(TESTS)}
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.dirname(__file__), capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    finally:
        server.stop()


# -- a host that never answered: fail within seconds, saying why; one that answered: wait for it ----------
def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections to it are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def first_contacts(monkeypatch):
    """No server has answered this process yet (a port of an earlier test's server may come
    again), no proxy in the environment, and the default deadlines (120 s, 5 s for a first
    contact)."""
    from mmloader.storage.remote import forget_answers

    for var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    for var in ("MMLOADER_RETRY_DEADLINE", "MMLOADER_FIRST_CONTACT_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    forget_answers()
    yield monkeypatch
    forget_answers()


@pytest.mark.timeout(120)  # before: 120 s per request (the whole retry_deadline), each retry logged
def test_a_host_that_never_answered_fails_within_seconds_naming_the_reason(first_contacts):
    """Connection refused (plain HTTP, and S3 at an endpoint), a host name that does not resolve,
    and a connect that times out: each fails within seconds, though ``retry_deadline`` is
    120 s, with an error naming the host, the reason and what to check."""
    import socket

    from mmloader.storage.remote import HostUnreachable, Policy, RemoteError

    port = _closed_port()
    s3 = {"endpoint": f"http://127.0.0.1:{port}", "access_key_id": "AKID", "secret_access_key": "testing1"}
    for url, options, said, limit in (
        (f"http://127.0.0.1:{port}/ds", {}, "the URL's host and port", "5"),  # the default
        ("s3://bucket/ds", s3, r"the endpoint \(storage_options\['endpoint'\], AWS_ENDPOINT_URL\)", "1.5"),
    ):
        if limit != "5":
            first_contacts.setenv("MMLOADER_FIRST_CONTACT_DEADLINE", limit)
        t = time.monotonic()
        with pytest.raises(HostUnreachable) as e:
            _ObstoreClient(Location(url, dict(options))).get("index.json")
        elapsed = time.monotonic() - t
        assert elapsed < 20, (url, elapsed)
        message = str(e.value)
        assert re.search(
            rf"index\.json: GET failed: cannot connect to 127\.0\.0\.1:{port}: the connection was refused", message
        ), message
        assert f"first_contact_deadline={limit} s" in message, message
        assert re.search(f"check {said}, the network", message), message
        assert "retry_deadline" not in message, message

    t = time.monotonic()  # a name that does not resolve: at once
    with pytest.raises(RemoteError, match="the host name 'no-such-host.invalid' does not resolve"):
        _ObstoreClient(Location("http://no-such-host.invalid/ds")).get("index.json")
    assert time.monotonic() - t < 20

    # a connect that times out: a listening socket that never accepts, its queue full
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = []
    for _ in range(4):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(listener.getsockname())
        except BlockingIOError:
            pass
        queued.append(sock)
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/ds"
        t = time.monotonic()
        with pytest.raises(HostUnreachable, match=r"the connect timed out \(connect_timeout=1 s\)"):
            _ObstoreClient(Location(url, policy=Policy(connect_timeout=1, first_contact_deadline=1))).get("index.json")
        assert time.monotonic() - t < 20
    finally:
        for sock in (*queued, listener):
            sock.close()


@pytest.mark.timeout(120)
def test_a_server_that_answered_once_is_waited_for_when_it_restarts(first_contacts, tmp_path):
    """A server that answered, then refuses connections for 2.5 s (restarting): the read waits
    for it and succeeds, though the first-contact deadline is 0.5 s; a host never heard from
    fails after those 0.5 s."""
    import pickle
    import threading

    from remote_servers import FaultProxy

    from mmloader.storage.remote import HostUnreachable, Policy, answered, forget_answers, location_server

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x.bin").write_bytes(b"payload" * 100)
    server = RangeServer(tmp_path)
    front = FaultProxy(f"127.0.0.1:{server.port}")  # stopped and started again on its port
    policy = Policy(retry_deadline=60, first_contact_deadline=0.5)
    try:
        location = Location(f"{front.url}/ds", policy=policy)
        client = _ObstoreClient(location)
        assert client.get("x.bin") == b"payload" * 100
        assert answered(location_server(location))
        front.stop()
        threading.Timer(2.5, front.start).start()
        t = time.monotonic()
        assert client.get("x.bin") == b"payload" * 100  # retried for retry_deadline, not 0.5 s
        assert time.monotonic() - t >= 2.0

        blob = pickle.dumps(location)
        forget_answers()
        assert answered(location_server(pickle.loads(blob)))  # a worker is told that it answered
        t = time.monotonic()
        with pytest.raises(HostUnreachable, match="first_contact_deadline=0.5 s"):
            _ObstoreClient(Location(f"http://127.0.0.1:{_closed_port()}/ds", policy=policy)).get("x.bin")
        assert time.monotonic() - t < 10
    finally:
        front.stop()
        server.stop()
