"""Remote reads through an HTTP proxy (a real one: proxy.py on 127.0.0.1, asking for
credentials), as a cluster behind one reads: ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` or
``storage_options["proxy_url"]``, plain HTTP, HTTPS through a CONNECT tunnel, and hf:// (the Hub's API and its files)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import ROOT, write_dataset
from remote_servers import RangeServer, make_certificate

from mmloader.storage import open_store
from mmloader.storage.remote import Location, RemoteError
from mmloader.storage.remote.hub import forget_revisions
from mmloader.storage.remote.proxy import parse_proxy, proxy_for

pytest.importorskip("proxy", reason="proxy.py (the test extras) is the proxy these tests go through")
sys.path.insert(0, str(ROOT / "samples"))
from local_hub import HubServer  # noqa: E402

PROXY_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "all_proxy", "no_proxy")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """proxy.py on 127.0.0.1, which answers 407 to a request without ``user:pw``: ``host:port``."""
    folder = tmp_path_factory.mktemp("proxy")
    port_file = folder / "port"
    cmd = [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
           "--num-acceptors", "1", "--num-workers", "1", "--threaded", "--basic-auth", "user:pw",
           "--log-level", "WARNING"]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"proxy.py did not start (exit code {process.poll()})")
        time.sleep(0.05)
    yield f"127.0.0.1:{port_file.read_text().strip()}"
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """Tar shards served over HTTP and HTTPS (a certificate trusted through SSL_CERT_FILE)."""
    root = tmp_path_factory.mktemp("origin")
    local = write_dataset(root / "shards", 12, "tar", shard_size=5)
    cert = make_certificate(root)
    servers = {"http": RangeServer(root), "https": RangeServer(root, tls=cert)}
    yield local, servers, cert[0]
    for server in servers.values():
        server.stop()


@pytest.fixture
def env(monkeypatch, origin):
    for var in PROXY_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", origin[2])
    return monkeypatch


def _rows(store) -> list[tuple]:
    return [(store[i]["__key__"], store[i]["txt"]) for i in range(len(store))]


def test_proxy_rules():
    assert parse_proxy("http://u:p%40ss@10.0.0.1:3128").credentials == ("u", "p@ss")
    for bad, said in (("https://p:3128", "only http://"), ("socks5://p:1080", "only http://"), ("http://p:x", "port")):
        with pytest.raises(ValueError, match=said):
            parse_proxy(bad)
    assert "u:p" not in repr(parse_proxy("http://u:p@h:1"))


def test_proxy_choice_follows_the_environment(env):
    assert proxy_for(True, "example.org:443") is None
    env.setenv("HTTPS_PROXY", "http://secure-proxy:3128")
    env.setenv("HTTP_PROXY", "http://plain-proxy:3128")
    assert proxy_for(True, "example.org:443").address == "secure-proxy:3128"
    assert proxy_for(False, "example.org").address == "plain-proxy:3128"
    env.setenv("NO_PROXY", "internal.corp,127.0.0.1")
    assert proxy_for(True, "data.internal.corp:443") is None and proxy_for(False, "127.0.0.1:9000") is None
    assert proxy_for(True, "127.0.0.1:9000", "http://given:1").address == "given:1"  # proxy_url wins
    for no_proxy, host, direct in (
        ("*", "anything.org", True),
        ("127.0.0.1:9000", "127.0.0.1:9000", True),
        ("127.0.0.1:9000", "127.0.0.1:9001", False),
        ("10.0.0.0/8", "10.20.30.40:80", True),
        ("::1", "[::1]:9000", True),
        ("[::1]:9000", "[::1]:9000", True),
        ("fd00::/8", "[fd12::1]", True),
        ("*.corp.net", "a.b.corp.net", True),
        ("corp.net", "notcorp.net", False),
        ("example.org:443", "example.org", True),  # HTTPS: port 443 when none is named
    ):
        env.setenv("NO_PROXY", no_proxy)
        assert (proxy_for(True, host) is None) is direct, (no_proxy, host)
    env.delenv("NO_PROXY")
    env.setenv("https_proxy", "http://lower:1")  # the lowercase variable first, as curl reads them
    assert proxy_for(True, "example.org").address == "lower:1"
    env.setenv("https_proxy", "")  # set and empty: no proxy for HTTPS (not the uppercase one)
    assert proxy_for(True, "example.org") is None
    env.delenv("HTTP_PROXY")
    env.setenv("ALL_PROXY", "all-proxy:8080")
    assert proxy_for(False, "example.org").address == "all-proxy:8080"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_reads_go_through_the_proxy(proxy, origin, env, scheme):
    local, servers, _cert = origin
    url = f"{servers[scheme].url}/shards"
    expected = _rows(open_store(local))
    env.setenv(f"{scheme.upper()}_PROXY", f"user:pw@{proxy}")  # no scheme: http:// (curl's reading)
    assert _rows(open_store(url)) == expected

    env.setenv(f"{scheme.upper()}_PROXY", f"http://user:wrong@{proxy}")  # the proxy refuses: it was used
    t = time.monotonic()
    with pytest.raises(RemoteError, match="407") as e:
        _rows(open_store(url, retry_deadline=30))
    assert time.monotonic() - t < 10 and "wrong" not in str(e.value)  # not retried; no password shown

    for no_proxy in ("127.0.0.1", "*", f"127.0.0.1:{servers[scheme].port}"):  # bypassed for this host
        env.setenv("NO_PROXY", no_proxy)
        assert _rows(open_store(url, retry_deadline=5)) == expected, no_proxy
    env.delenv("NO_PROXY")
    env.setenv("ALL_PROXY", f"http://user:wrong@{proxy}")  # the only variable left: used
    env.delenv(f"{scheme.upper()}_PROXY")
    with pytest.raises(RemoteError, match="407"):
        _rows(open_store(url, retry_deadline=30))


def test_proxy_url_option_wins_over_the_environment(proxy, origin, env):
    local, servers, _cert = origin
    env.setenv("HTTPS_PROXY", f"http://user:wrong@{proxy}")
    store = open_store(f"{servers['https'].url}/shards", storage_options={"proxy_url": f"http://user:pw@{proxy}"})
    assert _rows(store) == _rows(open_store(local))
    t = time.monotonic()
    with pytest.raises(RemoteError, match="no-such-proxy.invalid"):  # the proxy's name, not the server's
        _rows(open_store(f"{servers['https'].url}/shards", storage_options={"proxy_url": "no-such-proxy.invalid:3128"}))
    assert time.monotonic() - t < 10
    env.delenv("MMLOADER_RETRY_DEADLINE", raising=False)  # 120 s
    env.setenv("MMLOADER_FIRST_CONTACT_DEADLINE", "1")  # (default 5 s)
    t = time.monotonic()  # a proxy that is down: named, within seconds, not after retry_deadline
    with pytest.raises(
        RemoteError,
        match=r"cannot connect to the proxy http://127\.0\.0\.1:9 \(on the way to 127\.0\.0\.1:\d+\): the "
        r"connection was refused .*check .*that the proxy http://127\.0\.0\.1:9 runs there",
    ):
        _rows(open_store(f"{servers['https'].url}/shards", storage_options={"proxy_url": "127.0.0.1:9"}))
    assert time.monotonic() - t < 20


def test_no_credentials_from_netrc_or_to_a_redirect(proxy, origin, env, tmp_path):
    """A ~/.netrc's credentials are never sent with a read (aiohttp, trusting the environment,
    would), and a redirect of the Hub's API to a host the proxy does not serve gets no
    Proxy-Authorization."""
    import http.server
    import threading

    local, servers, _cert = origin
    (tmp_path / ".netrc").write_text("default login bob password netrc-password-123\n")
    env.setenv("HOME", str(tmp_path))
    env.setenv("NETRC", str(tmp_path / ".netrc"))
    servers["http"].seen.clear()
    assert len(_rows(open_store(f"{servers['http'].url}/shards"))) == 12
    assert servers["http"].seen and not any(servers["http"].seen), servers["http"].seen

    seen: list[dict] = []

    class Target(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the revision API, after the redirect
            seen.append(dict(self.headers))
            body = b'{"id": "org/redirected", "sha": "' + b"a" * 40 + b'"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(307)
            self.send_header("Location", f"http://localhost:{target.server_address[1]}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        forget_revisions()
        env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
        env.setenv("HTTP_PROXY", f"http://user:pw@{proxy}")
        env.setenv("NO_PROXY", "localhost")  # the redirect's host: reached directly
        Location("hf://datasets/org/redirected")
        assert seen and not any(k.lower() == "proxy-authorization" for k in seen[0]), seen
    finally:
        forget_revisions()
        for server in (hub, target):
            server.shutdown()
            server.server_close()


def test_hub_through_the_proxy(proxy, origin, env, tmp_path):
    from huggingface_hub import close_session

    local, _servers, _cert = origin
    # No file is redirected to the CDN here: through a plain-HTTP proxy, obstore's HTTP library
    # drops the proxy's credentials when it follows a redirect to another host (docs: object
    # storage, "Proxies"; over HTTPS they belong to the tunnel and stay)
    hub = HubServer(lfs_threshold=1 << 30)
    try:
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
            env.delenv(var, raising=False)
        env.setenv("HF_HOME", str(tmp_path / "hf-home"))
        env.setenv("HF_ENDPOINT", hub.url)
        hub.upload_folder("org/proxied", local, "data")
        forget_revisions()
        env.setenv("HTTP_PROXY", f"http://user:wrong@{proxy}")
        close_session()  # huggingface_hub reads the proxy variables when its session starts
        with pytest.raises(RemoteError, match="proxy .*407"):  # the revision API call goes through it
            open_store("hf://datasets/org/proxied/data", retry_deadline=30)
        env.setenv("HTTP_PROXY", f"http://user:pw@{proxy}")
        close_session()
        store = open_store("hf://datasets/org/proxied/data")
        assert _rows(store) == _rows(open_store(local))
        env.setenv("HTTP_PROXY", f"http://user:wrong@{proxy}")  # the files go through it too
        with pytest.raises(RemoteError, match="407"):
            open_store("hf://datasets/org/proxied/data")[3]
        env.delenv("HTTP_PROXY")
        close_session()
        forget_revisions()
        # huggingface_hub's API calls take the environment's proxy only: an option that would
        # route the files one way and the API another is refused, saying what to set
        with pytest.raises(ValueError, match=r"unknown storage_options \['proxy_url'\] for hf://"):
            open_store("hf://datasets/org/proxied/data", storage_options={"proxy_url": f"http://user:pw@{proxy}"})
    finally:
        forget_revisions()
        close_session()
        hub.stop()
