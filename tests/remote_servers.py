"""Real servers on 127.0.0.1 for the object-storage tests, started and stopped by the tests.

* :class:`MotoS3`: moto's server mode (``ThreadedMotoServer``, a real S3 HTTP API), with a bucket.
* :class:`RangeServer`: a standard-library HTTP server over a folder that honours ``Range``,
  optionally behind an ``Authorization`` header it requires (Basic or Bearer).
* :class:`FaultProxy`: an HTTP proxy in front of either, injecting latency, 5xx bursts, connection
  resets, truncated bodies and hung requests, and that can be killed and restarted on its port.

And the fixtures the remote test modules share (import them into a test module to use them):
``s3`` (a moto server for the module, its credentials in the environment) and ``own_cache``
(the default shard cache under the test's folder, never ``~/.cache``).
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import socketserver
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest


class MotoS3:
    """moto's S3 server on a free loopback port, with ``bucket`` created."""

    def __init__(self, bucket: str = "mmloader-test"):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.port = port
        self.bucket = bucket
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
        self.client().create_bucket(Bucket=bucket)

    def client(self, endpoint: str | None = None):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def upload(self, local: str | os.PathLike, prefix: str) -> str:
        """Copy a local dataset folder to ``s3://bucket/prefix/``; returns that URL."""
        c = self.client()
        local = Path(local)
        for p in sorted(local.rglob("*")):
            if p.is_file():
                c.upload_file(str(p), self.bucket, f"{prefix}/{p.relative_to(local).as_posix()}")
        return f"s3://{self.bucket}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        out = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in out.get("Contents", []))

    def stop(self) -> None:
        self.server.stop()


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    required: str | None = None  # the Authorization header every request must carry
    seen: list  # the Authorization headers received (None where there was none)

    def log_message(self, *args) -> None:
        pass

    def _refused(self) -> bool:
        got = self.headers.get("Authorization")
        self.seen.append(got)
        if self.required is None or got == self.required:
            return False
        # a careless server: its answer echoes the credentials it was sent
        body = f"401 Unauthorized: {got!r} is not accepted for {self.path}".encode()
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="test"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return True

    def send_head(self):
        if self._refused():
            return None
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        f = open(path, "rb")
        size = os.fstat(f.fileno()).st_size
        start, end = 0, size
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a:
                start, end = int(a), min(int(b) + 1, size) if b else size
            else:
                start = max(size - int(b), 0)
            if start >= size:
                f.close()
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", f'"{size}-{int(os.fstat(f.fileno()).st_mtime_ns)}"')
        self.end_headers()
        f.seek(start)
        self._left = end - start
        return f

    def copyfile(self, source, outputfile) -> None:
        left = self._left
        while left > 0:
            chunk = source.read(min(left, 1 << 16))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class RangeServer:
    """A static HTTP server over ``root`` on 127.0.0.1 that honours ``Range``. With
    ``authorization`` (an ``Authorization`` header value, e.g. ``"Basic dTpw"``), a request
    without exactly that header is answered 401, the answer echoing the header it got; ``seen``
    lists the ``Authorization`` headers of every request."""

    def __init__(self, root: str | os.PathLike, authorization: str | None = None, tls: tuple | None = None):
        root = str(root)
        self.seen: list = []
        seen = self.seen

        class Handler(_RangeHandler):
            required = authorization

            def __init__(self, *a, **kw):
                self.seen = seen
                super().__init__(*a, directory=root, **kw)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if tls is not None:  # (certificate, key) files: HTTPS
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.url = f"https://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def make_certificate(folder: Path) -> tuple[str, str]:
    """(certificate, key) files of a self-signed certificate for 127.0.0.1, made by openssl
    (skips the test where there is none). Trusted only where ``SSL_CERT_FILE`` names it."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` (``host:port``) with faults to order.

    ``latency`` seconds are added to every request. ``fail(n, status)`` answers the next ``n``
    requests with ``status`` (503 SlowDown by default); ``refuse(status, methods)`` answers every
    request of those methods so until ``refuse(None)``; with ``echo=True`` either answer's body
    echoes the request's credentials (its ``Authorization`` and ``x-amz-security-token``
    headers), in its message as a careless server does, and in a ``<CanonicalRequest>`` as S3's
    SignatureDoesNotMatch answers do; ``reset(n)`` closes the next ``n``
    connections with a TCP reset before answering; ``truncate(n)`` sends the next ``n`` bodies
    half-way and closes; ``hang(n)`` holds the next ``n`` requests without answering until
    :meth:`stop`. :meth:`stop` kills the server (its port refuses connections); :meth:`start`
    brings it back on the same port. ``requests`` counts the requests seen, ``ranges`` the
    ``Range`` headers (and ``gets`` the paths) forwarded.
    """

    def __init__(self, upstream: str, port: int = 0):
        self.upstream = upstream
        self.latency = 0.0
        self.lock = threading.Lock()
        self.faults: list[str] = []
        self.requests = 0
        self.ranges: list[tuple[str, str | None]] = []
        self.refusing: tuple[int, frozenset, bool] | None = None
        self._hung = threading.Event()
        self._open: set = set()
        self.port = port
        self.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _next_fault(self, method: str) -> str | None:
        with self.lock:
            self.requests += 1
            if self.refusing is not None and method in self.refusing[1]:
                status, _methods, echo = self.refusing
                return f"status:{status}:{'echo' if echo else ''}"
            return self.faults.pop(0) if self.faults else None

    def fail(self, n: int = 1, status: int = 503, echo: bool = False) -> None:
        with self.lock:
            self.faults += [f"status:{status}:{'echo' if echo else ''}"] * n

    def refuse(self, status: int | None, methods=("GET", "HEAD", "PUT", "POST", "DELETE"), echo: bool = False) -> None:
        with self.lock:
            self.refusing = None if status is None else (status, frozenset(methods), echo)

    def reset(self, n: int = 1) -> None:
        with self.lock:
            self.faults += ["reset"] * n

    def truncate(self, n: int = 1) -> None:
        with self.lock:
            self.faults += ["truncate"] * n

    def hang(self, n: int = 1) -> None:
        with self.lock:
            self.faults += ["hang"] * n

    def start(self) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy.lock:
                    proxy._open.add(self.connection)

            def finish(self) -> None:
                with proxy.lock:
                    proxy._open.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def _error_body(self, status: int, echo: bool) -> bytes:
                if not echo:
                    return (
                        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                        b"<Message>Please reduce your request rate.</Message></Error>"
                    )
                from xml.sax.saxutils import escape

                auth = self.headers.get("Authorization") or ""
                token = self.headers.get("x-amz-security-token") or ""
                code = "SignatureDoesNotMatch" if status == 403 else "InternalError"
                canonical = f"{self.command}\n{self.path}\nauthorization:{auth}\nx-amz-security-token:{token}"
                return (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>refused {escape(token)} {escape(auth)}</Message>"
                    f"<CanonicalRequest>{escape(canonical)}</CanonicalRequest></Error>"
                ).encode()

            def _forward(self) -> None:
                fault = proxy._next_fault(self.command)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.latency:
                    time.sleep(proxy.latency)
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "hang":
                    proxy._hung.wait(120)
                    self.close_connection = True
                    return
                if fault and fault.startswith("status:"):
                    _, status_text, echo = fault.split(":")
                    status = int(status_text)
                    payload = self._error_body(status, echo == "echo")
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has no body (the connection is kept)
                        self.wfile.write(payload)
                    return
                with proxy.lock:
                    proxy.ranges.append((self.path, self.headers.get("Range")))
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in (
                        "connection",
                        "keep-alive",
                        "transfer-encoding",
                        "content-length",
                        "server",
                        "date",
                    ):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "truncate" and self.command == "GET" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._hung.clear()
        for _ in range(50):
            try:
                self.httpd = _Server(("127.0.0.1", self.port), Handler)
                break
            except OSError:
                time.sleep(0.1)  # the port of a server just stopped may linger a moment
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Kill the server: no new connection is accepted and every open one is cut."""
        self._hung.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            conns, self._open = list(self._open), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    server = MotoS3()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    import mmloader.storage.remote.shard_cache as shard_cache

    monkeypatch.delenv("MMLOADER_CACHE_DIR", raising=False)
    monkeypatch.setattr(shard_cache, "DEFAULT_CACHE_DIR", str(tmp_path / "default-cache"))  # never ~/.cache here
