"""The standard library's HTTP client: plain HTTP(S), or S3 signed with SigV4. Starts in
milliseconds and survives fork(); listing and writing go through a full client."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Literal, cast

from .client import Client, LocationLike, _Client
from .errors import ConnectFailed, HostNotFound, ObjectChangedError, _HTTPStatus
from .failures import _os_kind, server_refusal, short_message
from .fsspec_client import _FsspecClient
from .hub_api import HubError, refusal_message, retry_after
from .obstore_client import _ObstoreClient
from .proxy import Proxy, connection, proxy_for, tunnel_failure
from .proxy import refusal as proxy_refusal
from .proxy import target as proxy_target
from .ranges import _check_length
from .redaction import redact_url
from .runtime import _background, obstore_usable
from .sigv4 import sigv4_headers, static_s3_credentials
from .urls import endpoint_of

#: the headers a request keeps when a redirect sends it to another host
_HOP_HEADERS = {"range", "if-match", "user-agent", "accept", "accept-encoding"}


def _host_port(netloc: str) -> str:
    """``host:port`` of a URL's authority, without userinfo (never sent as a host name)."""
    return netloc.rpartition("@")[2]


class _SimpleClient(_Client):
    """The standard library's HTTP client (+ SigV4 for S3 with static credentials): starts in
    milliseconds and survives fork. Used to open datasets (a few small reads) and where obstore
    cannot run (a process forked from one that started it)."""

    def __init__(self, location: LocationLike):
        from urllib.parse import quote, urlsplit

        self.location = location
        self._quote = quote
        self._local = threading.local()
        opts = location.storage_options
        # what obstore sends with every request too (an Authorization header: a bearer token, or
        # the Basic credentials of an http://user:password@host/ URL)
        self.headers = dict(opts.get("default_headers") or {})
        hub = getattr(location, "hub", None)
        self._token_source = ""
        if hub is not None and not any(k.lower() == "authorization" for k in self.headers):
            # looked up in this process: never pickled from the environment
            token, self._token_source = hub.bearer_and_source()
            if token:
                self.headers["Authorization"] = f"Bearer {token}"
        #: name -> (URL a redirect sent it to, until when to go there directly): the Hub's
        #: resolve endpoint answers each file with a redirect to its CDN (a signed URL)
        self._moved: dict[str, tuple[str, float]] = {}
        self._proxies: dict[tuple[bool, str], Proxy | None] = {}
        # obstore's allow_invalid_certificates, honoured here too (a test server, a private CA)
        self._verify = str(opts.get("allow_invalid_certificates", "")).lower() not in ("true", "1")
        self.creds: tuple[str, str, str | None] | Literal[True] | None
        if location.scheme == "http":
            parts = urlsplit(location.url)
            self.secure, self.host = parts.scheme == "https", _host_port(parts.netloc)
            self.prefix = parts.path.rstrip("/")
            self.creds = True
        else:
            bucket, _, prefix = location.url.split("://", 1)[1].partition("/")
            self.creds = static_s3_credentials(opts)
            self.region = (
                opts.get("region")
                or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION")
                or "us-east-1"
            )
            endpoint, _where = endpoint_of("s3", opts)
            if endpoint:
                parts = urlsplit(endpoint)
                self.secure, self.host = parts.scheme == "https", _host_port(parts.netloc)
                self.bucket_path = parts.path.rstrip("/") + "/" + bucket
                self.prefix = self.bucket_path + ("/" + prefix if prefix else "")
            else:
                self.secure, self.host = True, f"{bucket}.s3.{self.region}.amazonaws.com"
                self.bucket_path = "/"
                self.prefix = "/" + prefix if prefix else ""
            self.prefix = self.prefix.rstrip("/")
            self.key_prefix = prefix.strip("/")

    @staticmethod
    def usable(location: LocationLike) -> bool:
        return location.scheme == "http" or (
            location.scheme == "s3" and static_s3_credentials(location.storage_options) is not None
        )

    def _conn(self, secure: bool | None = None, host: str | None = None):
        """This thread's kept-alive connection to ``host`` (default: the location's)."""
        secure = self.secure if secure is None else secure
        host = self.host if host is None else host
        conns = getattr(self._local, "conns", None)
        if conns is None or getattr(self._local, "pid", None) != os.getpid():
            conns = self._local.conns = {}
            self._local.pid = os.getpid()
        c = conns.get((secure, host))
        if c is None:
            policy = self.location.policy
            c = conns[secure, host] = connection(
                secure, host, policy.request_timeout, self._proxy(secure, host), self._verify, policy.connect_timeout
            )
        return c

    def _proxy(self, secure: bool, host: str) -> Proxy | None:
        """The proxy requests to ``host`` go through (:func:`~.proxy.proxy_for`), looked up once."""
        key = (secure, host)
        if key not in self._proxies:
            self._proxies[key] = proxy_for(secure, host, self.location.storage_options.get("proxy_url"))
        return self._proxies[key]

    #: Redirects followed per request; where one was sent is remembered this long (s).
    MAX_REDIRECTS, MOVED_TTL = 5, 300.0

    def _request(
        self, method: str, name: str, headers: dict | None = None, query: dict | None = None, path: str | None = None
    ) -> tuple[int, dict, bytes]:
        if path is None:
            path = self._quote(f"{self.prefix}/{name}" if name else self.prefix or "/", safe="/~")
        canonical_query = "&".join(
            f"{self._quote(k, safe='-_.~')}={self._quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items())
        )
        hdrs = {**self.headers, **(headers or {})}
        if self.location.scheme == "s3" and self.creds is not True:
            # not None: an s3 location gets this client only with credentials (see usable)
            creds = cast("tuple[str, str, str | None]", self.creds)
            hdrs.update(sigv4_headers(method, self.host, path, self.region, creds, query=canonical_query))
        target = f"{path}?{canonical_query}" if canonical_query else path
        if self.location.scheme != "http" or query:
            return self._send(self.secure, self.host, method, target, hdrs)
        moved = self._moved.get(name)
        if moved is not None and moved[1] > time.monotonic():
            status, answer, body = self._follow(method, moved[0], hdrs, name)
            if status < 400:
                return status, answer, body
            self._moved.pop(name, None)  # expired or refused (a signed URL's time is up): ask again
        status, answer, body = self._send(self.secure, self.host, method, target, hdrs)
        if status in (301, 302, 303, 307, 308) and "location" in answer:
            from urllib.parse import urljoin

            scheme = "https" if self.secure else "http"
            return self._follow(method, urljoin(f"{scheme}://{self.host}{target}", answer["location"]), hdrs, name)
        return status, answer, body

    def _follow(self, method: str, url: str, hdrs: dict, name: str) -> tuple[int, dict, bytes]:
        """Follow redirects from ``url``; the token is not sent to another host."""
        from urllib.parse import urljoin, urlsplit

        status, answer, body = 0, dict[str, str](), b""
        for _hop in range(self.MAX_REDIRECTS):
            parts = urlsplit(url)
            secure, host = parts.scheme == "https", _host_port(parts.netloc)
            if (secure, host) != (self.secure, self.host):
                # another host (the Hub's CDN, a signed URL): only what the request itself needs,
                # never a credential, cookie or custom header of this location
                hdrs = {k: v for k, v in hdrs.items() if k.lower() in _HOP_HEADERS}
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            status, answer, body = self._send(secure, host, method, target or "/", hdrs)
            if status not in (301, 302, 303, 307, 308) or "location" not in answer:
                if status < 400:
                    self._moved[name] = (url, time.monotonic() + self.MOVED_TTL)
                return status, answer, body
            url = urljoin(url, answer["location"])
        from .errors import RemoteError

        raise RemoteError(f"{self.url(name)}: more than {self.MAX_REDIRECTS} redirects (a redirect loop on the server)")

    def _send(self, secure: bool, host: str, method: str, target: str, hdrs: dict) -> tuple[int, dict, bytes]:
        """One request on this thread's connection to ``host``."""
        proxy = self._proxy(secure, host)
        sent_target, hdrs = proxy_target(secure, host, target, proxy, hdrs)
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._conn(secure, host)
            connecting = conn.sock is None
            try:
                if connecting:  # apart, so that a failure to connect is told from one of the request
                    conn.connect()
                    connecting = False
                conn.request(method, sent_target, headers=hdrs)
                resp = conn.getresponse()
                body = resp.read()
                refused = proxy_refusal(resp.status, proxy, self._shown(secure, host, target))
                if refused is not None:
                    raise refused
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
            except (ConnectionError, OSError) as e:
                conn.close()
                self._local.conns.pop((secure, host), None)
                import http.client

                refused_tunnel = tunnel_failure(e, proxy, self._shown(secure, host, target))
                if refused_tunnel is not None:
                    raise refused_tunnel from None

                if isinstance(e, socket.gaierror) and e.errno != socket.EAI_AGAIN:
                    # no such host (EAI_AGAIN, a resolver that did not answer, is retried)
                    from urllib.parse import urlsplit

                    if proxy is not None:  # the name looked up was the proxy's
                        bare = urlsplit(f"//{proxy.address}").hostname or proxy.address
                        raise HostNotFound(bare, f"the proxy {proxy.shown}; gaierror: {e}") from None
                    bare = urlsplit(f"//{host}").hostname or host
                    raise HostNotFound(bare, f"gaierror: {e}") from None
                kind = _os_kind(e) if connecting else None  # (not a certificate, nor a reset)
                if kind is not None:  # nothing was sent: retried, briefly while the host never answered
                    raise ConnectFailed(kind, host if proxy is None else proxy.address, short_message(e)) from None
                if attempt or not isinstance(
                    e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                ):
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _shown(secure: bool, host: str, target: str) -> str:
        """The URL of a request, as messages show it (redacted: a signed URL's query)."""
        return redact_url(f"{'https' if secure else 'http'}://{host}{target}")

    def _check(self, status: int, body: bytes, name: str, headers: dict | None = None) -> None:
        hub = getattr(self.location, "hub", None)
        if status in (401, 403, 404) and hub is not None:  # gated, private, gone: say which and what to do
            sent = "Authorization" in self.headers
            refusal = refusal_message(status, headers or {}, hub, sent, self._token_source if sent else "")
            if refusal:
                raise HubError(refusal)
        if status == 429 or status == 503:  # the server says how long to wait (Retry-After)
            raise _HTTPStatus(status, self.url(name), body, retry_after=retry_after(headers or {}))
        if status >= 300 and server_refusal(_HTTPStatus(status, self.url(name), body)):
            raise _HTTPStatus(status, self.url(name), body)  # named by _Deadline (no such bucket, ...)
        if status == 404:
            raise FileNotFoundError(f"{self.url(name)}: no such object")
        if status in (401, 403):
            raise PermissionError(f"{self.url(name)}: access denied (HTTP {status})")
        if status == 416:
            raise ObjectChangedError(
                f"{self.url(name)}: the range asked for lies beyond the object's end (HTTP 416): "
                "it was truncated or replaced since it was indexed"
            )
        if status >= 300:
            raise _HTTPStatus(status, self.url(name), body)

    def _rebuild(self) -> None:
        self.__init__(self.location)  # type: ignore[misc]  # credentials read again

    def _pinned(self, name: str, headers: dict) -> dict:
        pinned = self.location.pins.get(name)
        return {**headers, "If-Match": pinned} if pinned else headers

    def get(self, name: str) -> bytes:
        def once():
            status, headers, body = self._request("GET", name, self._pinned(name, {}))
            self._check(status, body, name, headers)
            self.location._checked_etag(name, headers.get("etag"))
            if "content-length" in headers:
                _check_length(body, int(headers["content-length"]), self.url(name), 0)
            return body

        return self._retry("GET", name, once)

    def _range(self, name: str, start: int, end: int) -> bytes:
        def once():
            status, headers, body = self._request(
                "GET", name, self._pinned(name, {"Range": f"bytes={start}-{end - 1}"})
            )
            self._check(status, body, name, headers)
            self.location._checked_etag(name, headers.get("etag"))
            total = None
            if status == 206 and "/" in headers.get("content-range", ""):
                tail = headers["content-range"].rsplit("/", 1)[1]
                total = int(tail) if tail.isdigit() else None
            elif status == 200:  # the server ignored Range: cut the range out
                total = len(body)
                body = body[start:end]
            _check_length(body, end - start, self.url(name), start, total)
            return body

        return self._retry(f"GET bytes {start}-{end - 1}", name, once)

    def versions(self) -> dict[str, str]:
        """S3 ListObjectsV2 under the prefix: name -> ETag. Here, not through obstore: the
        opening process must not start obstore's runtime (forked workers could not use it)."""
        if self.location.scheme != "s3":
            return {}
        import xml.etree.ElementTree as ET

        base = self.key_prefix + "/" if self.key_prefix else ""
        out: dict[str, str] = {}
        token = None
        while True:
            query = {"list-type": "2", "prefix": base, **({"continuation-token": token} if token else {})}

            def once(query=query):
                status, _headers, body = self._request(
                    "GET", "", query=query, path=self._quote(self.bucket_path, safe="/~")
                )
                self._check(status, body, "")
                return body

            root = ET.fromstring(self._retry("LIST", "", once))
            ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            for item in root.iter(f"{ns}Contents"):
                key, etag = item.findtext(f"{ns}Key"), item.findtext(f"{ns}ETag")
                if key and etag and key.startswith(base):
                    out[key[len(base) :]] = etag
            token = root.findtext(f"{ns}NextContinuationToken")
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return out

    def get_many(self, names: list[str]) -> list[bytes]:
        if len(names) == 1:
            return [self.get(names[0])]
        return list(_background().map(self.get, names))

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        if len(requests) == 1:
            return [self._range(*requests[0])]
        return list(_background().map(lambda r: self._range(*r), requests))

    def start_range(self, name: str, start: int, end: int):
        return _background().submit(self._range, name, start, end)

    def head(self, name: str) -> tuple[int | None, str | None]:
        def once():
            status, headers, body = self._request("HEAD", name)
            gone = (
                getattr(self.location, "hub", None) is not None
                and headers.get("x-error-code", "EntryNotFound") != "EntryNotFound"
            )
            if status == 404 and not gone:
                return None, None  # (a Hub repository or commit gone is said by _check)
            self._check(status, body, name, headers)
            return int(headers["content-length"]), headers.get("etag")

        return self._retry("HEAD", name, once)

    def _full(self) -> Client:
        return _ObstoreClient(self.location) if obstore_usable() else _FsspecClient(self.location)

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return self._full().list(prefix)

    def put_file(self, name: str, local: str) -> None:
        self._full().put_file(name, local)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._full().put_bytes(name, data)

    def delete(self, name: str) -> None:
        self._full().delete(name)
