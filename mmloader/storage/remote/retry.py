"""The retry policy: which failures are retried (:func:`transient`), which are named at once
(:func:`server_refusal`: a missing bucket, refused access; :func:`unresolved_host`: a host name
that does not resolve), which are failures to connect (:func:`connect_failure`), retried only
briefly while their host has never answered (:func:`answered`), and the per-request
bookkeeping of backoff and deadline (:class:`_Deadline`), whose messages and log lines go
through :func:`~.redaction.redact`."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import re
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol
from urllib.parse import urlsplit

from .errors import (
    ConnectFailed,
    HostNotFound,
    HostUnreachable,
    LongBody,
    ObjectChangedError,
    RemoteError,
    RemoteUnavailableError,
    ShortBody,
)
from .proxy import Proxy, proxy_for
from .redaction import redact, redact_url
from .urls import endpoint_of

log = logging.getLogger("mmloader")


@dataclass(frozen=True)
class Policy:
    """How requests behave: ``retry_deadline`` (s) bounds how long a failing request is retried
    (a server that is gone pauses the reader that long, then the error names the URL);
    ``first_contact_deadline`` (s, at most ``retry_deadline``) bounds it instead while the
    request cannot connect to a host that has not answered this process yet (refused, a
    resolver that does not answer, a connect timed out: a wrong endpoint, not a server
    restarting);
    ``request_timeout`` (s) bounds one request, ``connect_timeout`` (s) its connect;
    ``max_in_flight`` requests run at once per process; backoff doubles from ``backoff`` up to
    ``max_backoff`` with full jitter."""

    retry_deadline: float = 120.0
    request_timeout: float = 30.0
    connect_timeout: float = 5.0
    max_in_flight: int = 64
    backoff: float = 0.1
    max_backoff: float = 5.0
    first_contact_deadline: float = 5.0

    @classmethod
    def from_env(cls, **overrides: Any) -> "Policy":
        env = {
            "retry_deadline": "MMLOADER_RETRY_DEADLINE",
            "request_timeout": "MMLOADER_REQUEST_TIMEOUT",
            "first_contact_deadline": "MMLOADER_FIRST_CONTACT_DEADLINE",
        }
        values: dict[str, Any] = {}
        for name, var in env.items():
            if os.environ.get(var):
                values[name] = float(os.environ[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def __post_init__(self) -> None:
        for name, low, strict in (
            ("retry_deadline", 0, False),
            ("first_contact_deadline", 0, False),
            ("request_timeout", 0, True),
            ("connect_timeout", 0, True),
            ("backoff", 0, False),
            ("max_backoff", 0, False),
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < low or (strict and value == low) or value != value:
                raise ValueError(f"{name}={value!r}: expected a number of seconds {'>' if strict else '>='} {low}")
        if not isinstance(self.max_in_flight, int) or isinstance(self.max_in_flight, bool) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight!r}: expected an integer >= 1")

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))


_STATUS = re.compile(r"status(?: code)?:? *(\d{3})", re.I)


def _status(e: BaseException) -> int | None:
    for attr in ("status", "status_code", "code"):
        v = getattr(e, attr, None)
        if isinstance(v, int) and 100 <= v < 600:
            return v
    m = _STATUS.search(str(e))
    return int(m.group(1)) if m else None


def transient(e: BaseException) -> bool:
    """Whether a failed request may succeed when repeated: timeouts, connection errors and
    resets, short bodies, 5xx and 408/429; not a missing object, a refused permission, a TLS
    certificate that does not verify or another 4xx."""
    if isinstance(
        e, (FileNotFoundError, IsADirectoryError, NotADirectoryError, ObjectChangedError, LongBody, ValueError)
    ):
        return False
    if isinstance(e, ShortBody):
        return True
    if untrusted_certificate(e) is not None or proxy_auth_refused(e):
        return False  # a certificate that does not verify, or a proxy's 407, is the same next time
    if unresolved_host(e) is not None:
        return False
    if type(e).__module__.startswith("obstore") and (
        type(e).__name__ in _OBSTORE_PERMANENT or "builder error" in str(e)
    ):
        return False  # a request that cannot be built (its URL or a header) is built the same again
    if type(e).__name__ == "InvalidURL" and type(e).__module__ == "http.client":
        return False  # a port that is no number
    status = _status(e)
    if status is not None:
        return (status >= 500 and status not in (501, 505)) or status in (408, 429)
    if isinstance(e, PermissionError):
        return False
    return isinstance(e, (OSError, asyncio.TimeoutError, TimeoutError, ConnectionError, EOFError)) or type(
        e
    ).__module__.startswith(("obstore", "aiohttp", "botocore", "aiobotocore", "urllib3", "http"))


#: obstore errors that repeating the request cannot cure (a server without Range support, a
#: failed precondition, a bad path or configuration, refused credentials).
_OBSTORE_PERMANENT = {
    "NotSupportedError",
    "PreconditionError",
    "NotModifiedError",
    "InvalidPathError",
    "AlreadyExistsError",
    "UnknownConfigurationKeyError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "JoinError",
}
#: S3 error codes (the ``<Code>`` of an error answer) that no retry can cure, as said to a user.
S3_REFUSALS = {
    "NoSuchBucket": "no such bucket",
    "InvalidBucketName": "invalid bucket name",
    "AccessDenied": "access denied",
    "AllAccessDisabled": "access denied (all access disabled)",
    "InvalidAccessKeyId": "access denied (the access key ID is unknown to the server)",
    "SignatureDoesNotMatch": "access denied (the secret key does not match the access key ID)",
    "AccountProblem": "access denied (a problem with the account)",
    "PermanentRedirect": "the bucket is at another endpoint or in another region",
    "AuthorizationHeaderMalformed": "the request's region does not match the bucket's",
}
_S3_CODE = re.compile(r"<Code>\s*(\w+)\s*</Code>|An error occurred \((\w+)\)")


def server_refusal(e: BaseException) -> str | None:
    """What an S3 error answer inside ``e`` says, when it is one of :data:`S3_REFUSALS`:
    ``"no such bucket 'b' (NoSuchBucket: The specified bucket does not exist)"``; else None.
    Read from the answer's XML (obstore and the plain-HTTP client keep it in the error's text)
    or from botocore's parsed ``response``."""
    text = str(e) + "\n" + bytes(getattr(e, "body", b"") or b"").decode("utf-8", "replace")
    response = getattr(e, "response", None)
    code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
    if not code:
        m = _S3_CODE.search(text)
        code = (m.group(1) or m.group(2)) if m else None
    if code not in S3_REFUSALS:
        return None
    what = S3_REFUSALS[code]
    bucket = re.search(r"<BucketName>([^<]*)</BucketName>", text)
    if bucket:
        what += f" {bucket.group(1)!r}"
    message = re.search(r"<Message>([^<]*)</Message>", text)
    if message is None and isinstance(response, dict):
        detail = (response.get("Error") or {}).get("Message")
    else:
        detail = message.group(1) if message else None
    return f"{what} (the server says {code}" + (f": {detail.strip()})" if detail else ")")


#: How obstore (reqwest) and aiohttp word a host name that does not resolve; "Temporary failure
#: in name resolution" (EAI_AGAIN: the resolver did not answer) is retried like any other
#: connection error.
_DNS_FAILURE = re.compile(
    r"failed to lookup address information|Name or service not known|nodename nor servname|No address associated",
    re.I,
)
_EAI_AGAIN = getattr(socket, "EAI_AGAIN", -3)


def unresolved_host(e: BaseException, url: str = "") -> str | None:
    """The host name whose lookup failed for good inside ``e`` (the error itself, its causes, or
    the text obstore and aiohttp give), or None when the failure was not that one. The host is
    taken from the error where it says it, else from the first URL in its text, else from
    ``url``; ``"?"`` when none says it.

    Args:
        e: a failed request's error.
        url: the URL the request went to (its host, when the error names none).

    >>> unresolved_host(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "http://nohost.invalid/x")
    'nohost.invalid'
    >>> unresolved_host(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")) is None
    True
    """
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 8 and cur not in seen:
        seen.append(cur)
        if isinstance(cur, HostNotFound):
            return cur.host
        if isinstance(cur, socket.gaierror):
            return _host_in(str(e), url) if cur.errno != _EAI_AGAIN else None
        os_error = getattr(cur, "os_error", None)  # aiohttp's ClientConnectorError keeps the gaierror there
        if isinstance(os_error, socket.gaierror):
            if os_error.errno == _EAI_AGAIN:
                return None
            host = getattr(cur, "host", None)
            return str(host) if host else _host_in(str(cur), url)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    text = str(e)
    if "Temporary failure in name resolution" in text or not _DNS_FAILURE.search(text):
        return None
    return _host_in(text, url)


def proxy_auth_refused(e: BaseException) -> bool:
    """Whether ``e`` is a proxy's 407 (Proxy Authentication Required): an answer's status, or
    the ``ProxyAuthRequired`` of obstore's error text (a ``CONNECT`` the proxy refused).

    Args:
        e: a failed request's error.
    """
    if _status(e) == 407:
        return True
    return type(e).__module__.startswith("obstore") and "ProxyAuthRequired" in str(e)


def untrusted_certificate(e: BaseException) -> str | None:
    """Why the server's TLS certificate did not verify, when that is what ``e`` says (the
    standard library's ``SSLCertVerificationError``, bare or inside a ``URLError``, or the
    ``InvalidCertificate`` in obstore's error text); else None.

    Args:
        e: a failed request's error.

    >>> untrusted_certificate(ValueError("x")) is None
    True
    """
    for cur in (e, getattr(e, "reason", None), e.__cause__):
        if isinstance(cur, ssl.SSLCertVerificationError):
            return getattr(cur, "verify_message", None) or str(cur)  # aiohttp's has none
    m = re.search(r"InvalidCertificate\(([^)]*)", str(e)) if type(e).__module__.startswith("obstore") else None
    if m is None:
        return None
    names = [w for w in re.findall(r"[A-Za-z]\w+", m.group(1)) if w not in ("Other", "OtherError")]
    return names[0] if names else "invalid certificate"


def _host_in(text: str, url: str) -> str:
    for candidate in (*re.findall(r"[a-z][a-z0-9+.-]*://[^\s'\",)]+", text, re.I), url):
        try:
            host = urlsplit(candidate).hostname
        except ValueError:
            continue
        if host:
            return host
    return "?"


@dataclass(frozen=True)
class Server:
    """The server a location's requests go to, as far as this process can tell: ``address``
    (``host:port``, or the bucket where the storage service's host is not known here), and the
    proxy the requests go through (what is connected to, then). ``key`` is what
    :func:`answered` remembers: the scheme, host and port, and the proxy."""

    key: str
    address: str
    proxy: Proxy | None = None


def server_of(url: str, proxy_url: str | None = None) -> Server | None:
    """The :class:`Server` of an ``http(s)://`` URL (None for another scheme or a URL without a
    host), with the proxy :func:`~.proxy.proxy_for` chooses for it.

    Args:
        url: the URL requests go to.
        proxy_url: ``storage_options["proxy_url"]``.

    >>> server_of("http://127.0.0.1/data/x").address
    '127.0.0.1:80'
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not host:
        return None
    address = f"[{host}]:" if ":" in host else f"{host}:"
    address += str(port or (443 if scheme == "https" else 80))
    try:
        proxy = proxy_for(scheme == "https", address, proxy_url)
    except ValueError:
        proxy = None
    return Server(f"{scheme}://{address}" + (f" via {proxy.address}" if proxy else ""), address, proxy)


def location_server(location: Any) -> Server:
    """The :class:`Server` of a :class:`~.location.Location`: its URL's (``http(s)://``), its
    endpoint's (``storage_options["endpoint"]``, ``AWS_ENDPOINT_URL``), or the storage
    service's for the bucket.

    Args:
        location: the location (its ``url``, ``scheme`` and ``storage_options``).
    """
    options = getattr(location, "storage_options", None) or {}
    scheme, url = location.scheme, location.url
    if scheme != "http":
        endpoint, _where = endpoint_of(scheme, options)
        bucket = url.split("://", 1)[-1].partition("/")[0]
        if endpoint:
            url = endpoint
        elif scheme == "s3":  # the standard library's client's host (obstore's differs by region only)
            region = options.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            url = f"https://{bucket}.s3.{region or 'us-east-1'}.amazonaws.com"
        elif scheme == "gs":
            url = "https://storage.googleapis.com"
        else:
            return Server(f"{scheme}://{bucket}", bucket)
    found = server_of(url, options.get("proxy_url"))
    return found if found is not None else Server(url, url)


#: The servers (:attr:`Server.key`) that answered a request of this process (any HTTP answer,
#: an error status too); inherited by forked processes, and passed on to others with a
#: location that has answered (:meth:`~.location.Location.__getstate__`).
_ANSWERED: set[str] = set()


def answered(server: Server | str | None) -> bool:
    """Whether ``server`` (a :class:`Server` or its key) answered a request of this process: a
    failure to connect to it is then a server restarting, retried for the whole
    ``retry_deadline``; before, a wrong endpoint, failing after ``first_contact_deadline``."""
    key = server.key if isinstance(server, Server) else server
    return key is not None and key in _ANSWERED


def mark_answered(server: Server | str | None) -> None:
    """Remember that ``server`` (a :class:`Server` or its key) answered (see :func:`answered`)."""
    key = server.key if isinstance(server, Server) else server
    if key is not None and key not in _ANSWERED:
        _ANSWERED.add(key)


def forget_answers() -> None:
    """Forget every server that answered (tests; a process that wants first contacts again)."""
    _ANSWERED.clear()


#: How each client words a failure to connect, as :func:`connect_failure`'s kinds.
_CONNECT_KINDS = {
    "refused": "the connection was refused (nothing listens there?)",
    "timeout": "the connect timed out",
    "dns": "the host name could not be resolved (the resolver did not answer)",
    "unreachable": "there is no route to it (the network is unreachable)",
    "connect": "the connection failed",
}
_UNREACHABLE = {
    getattr(errno, n) for n in ("ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "EHOSTDOWN") if hasattr(errno, n)
}
#: obstore (reqwest, hyper): ``ConnectError("tcp connect error", 127.0.0.1:9, Os { ..., kind:
#: ConnectionRefused, ... })``, ``ConnectError("dns error", ...)``; older versions in one line
#: (``error trying to connect: tcp connect error: Connection refused``).
_OBSTORE_CONNECT = re.compile(r'ConnectError\(\s*"([^"]*)"|error trying to connect', re.I)
_OBSTORE_ADDRESS = re.compile(r'"tcp connect error",\s*([^\s,]+),')


def _os_kind(e: BaseException) -> str | None:
    """The kind of an operating system's error of a connect (None: not one of a connect)."""
    if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
        return "refused"
    if isinstance(e, socket.gaierror):
        return "dns"
    if isinstance(e, (TimeoutError, socket.timeout, asyncio.TimeoutError)):
        return "timeout"
    if getattr(e, "errno", None) in _UNREACHABLE:
        return "unreachable"
    return None


def connect_failure(e: BaseException) -> tuple[str, str | None] | None:
    """``(kind, address)`` when ``e`` says that no connection to the server (or its proxy) was
    made: ``kind`` is ``"refused"``, ``"timeout"`` (the connect's), ``"dns"`` (a resolver that
    did not answer: a name that does not exist is :func:`unresolved_host`'s), ``"unreachable"``
    or ``"connect"``; ``address`` is the ``host:port`` it names, or None. None for any other
    failure (an answer, a reset, a timeout waiting for an answer).

    Args:
        e: a failed request's error.

    >>> connect_failure(ConnectFailed("refused", "127.0.0.1:9"))
    ('refused', '127.0.0.1:9')
    >>> connect_failure(TimeoutError("timed out")) is None  # a connect's, or an answer's?
    True
    """
    import urllib.error

    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 8 and all(cur is not s for s in seen):
        seen.append(cur)
        module, name = type(cur).__module__, type(cur).__name__
        if isinstance(cur, ConnectFailed):
            return cur.kind, cur.address
        if isinstance(cur, urllib.error.URLError) and not isinstance(cur, urllib.error.HTTPError):
            # urllib wraps only what failed before the request was sent: the connect
            reason = cur.reason
            if isinstance(reason, BaseException):
                kind = _os_kind(reason)
                if kind is not None:
                    return kind, None
        elif isinstance(cur, ConnectionRefusedError):  # raised by a connect only
            return "refused", None
        elif module.startswith("aiohttp"):
            if name == "ConnectionTimeoutError":  # ClientTimeout's sock_connect
                return "timeout", None
            os_error = getattr(cur, "os_error", None)  # ClientConnectorError and its kinds
            if isinstance(os_error, OSError):
                host, port = getattr(cur, "host", None), getattr(cur, "port", None)
                return _os_kind(os_error) or "connect", (f"{host}:{port}" if host and port else None)
        elif module.startswith("botocore"):
            if name in ("ConnectTimeoutError",):
                return "timeout", None
            if name in ("EndpointConnectionError", "ProxyConnectionError"):
                inner = (getattr(cur, "kwargs", None) or {}).get("error")
                found = connect_failure(inner) if isinstance(inner, BaseException) else None
                return found or ("connect", None)
        elif module.startswith("obstore"):
            text = str(cur)
            m = _OBSTORE_CONNECT.search(text)
            if m is None:
                return None
            address = _OBSTORE_ADDRESS.search(text)
            where = address.group(1) if address else None
            if (m.group(1) or "").lower() == "dns error" or "Temporary failure in name resolution" in text:
                return "dns", where
            if re.search(r"ConnectionRefused|Connection refused", text):
                return "refused", where
            if re.search(r"kind: TimedOut|timed out|Elapsed", text):
                return "timeout", where
            if re.search(r"NetworkUnreachable|HostUnreachable|[Nn]o route to host|[Nn]etwork is unreachable", text):
                return "unreachable", where
            return "connect", where
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return None


def _answer_in(e: BaseException) -> bool:
    """Whether ``e`` comes of an answer of the server (an HTTP status, a missing object, a body
    cut short): it has answered, whatever a later request meets."""
    if isinstance(e, (FileNotFoundError, ObjectChangedError, ShortBody, LongBody)):
        return True
    if isinstance(e, PermissionError) and e.errno is None:  # a 401/403 (a connect's EACCES has an errno)
        return True
    if connect_failure(e) is not None:
        return False
    return _status(e) is not None or server_refusal(e) is not None


def _auth_error(e: BaseException) -> bool:
    return isinstance(e, PermissionError) or _status(e) in (401, 403)


def short_message(e: BaseException) -> str:
    """The error's type and the first line of its text (an HTTP status as ``HTTP 503``)."""
    status = getattr(e, "status", None)
    if type(e).__name__ == "_HTTPStatus" and isinstance(status, int):  # the URL is said already
        said = bytes(getattr(e, "body", b"") or b"").decode("utf-8", "replace").strip().splitlines()
        return f"HTTP {status}" + (f": {said[0][:300]}" if said else "")
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first[:300]}"


class _Rebuildable(Protocol):
    """What the retry bookkeeping needs of a location: building its clients again, and its
    settings (whose secrets its messages must not show)."""

    storage_options: dict

    def rebuild(self) -> None: ...


#: Attributes in which the errors of HTTP libraries keep the request or the answer (aiohttp's
#: ``request_info`` holds the request's headers and its ``_conn_key`` a proxy's credentials,
#: botocore's ``response`` the answer, ours ``body``): an error with any of them is never
#: chained to what mmloader raises.
_CARRIERS = ("request_info", "headers", "response", "request", "body", "history", "_conn_key")


class _Deadline:
    """Retry bookkeeping for one request: backoff, a deadline, one rebuild after an auth error.
    Every message it raises or logs is redacted (:func:`~.redaction.redact`). What it raises is
    chained (``__cause__``) only to an error that shows no credential however it is looked at
    (:meth:`_chainable`), and the clients call :meth:`next_delay` outside their ``except``
    blocks, so that ``__context__`` holds nothing either."""

    def __init__(self, policy: Policy, url: str, what: str, server: Server | None = None):
        self.policy, self.url, self.what = policy, redact_url(url), what
        #: where the request goes (:func:`location_server`, :func:`server_of`); else its URL's
        self.server = server if server is not None else server_of(url)
        self.start = time.monotonic()
        self.attempt = 0
        self.rebuilt = False

    def answered(self) -> None:
        """The request got an answer: its server is no longer a first contact (:func:`answered`)."""
        if self.server is not None:
            mark_answered(self.server)

    @staticmethod
    def _shown(text: str, location: _Rebuildable | None) -> str:
        options: Mapping | None = getattr(location, "storage_options", None)
        return redact(text, options)

    @classmethod
    def _chainable(cls, cause: BaseException, location: _Rebuildable | None) -> bool:
        """Whether ``cause`` may be chained to an error mmloader raises: neither it nor an error
        it is chained to keeps a request or an answer (:data:`_CARRIERS`: headers, bodies), and
        none's text or ``repr`` changes when redacted."""
        todo: list[BaseException] = [cause]
        seen: list[BaseException] = []
        while todo and len(seen) < 16:
            cur = todo.pop()
            if any(cur is s for s in seen):
                continue
            seen.append(cur)
            if any(getattr(cur, name, None) is not None for name in _CARRIERS):
                return False
            for text in (str(cur), repr(cur)):
                if cls._shown(text, location) != text:
                    return False
            todo += [c for c in (cur.__cause__, cur.__context__) if c is not None]
        return not todo

    def _fail(self, cls: type[Exception], text: str, cause: BaseException | None, location: _Rebuildable | None):
        """``cls`` with the message ``URL: text`` redacted, chained to ``cause`` where that shows
        no credential (:meth:`_chainable`), else to nothing."""
        error = cls(self._shown(f"{self.url}: {text}", location))
        if cause is not None and not self._chainable(cause, location):
            cause = None
        error.__cause__, error.__context__, error.__suppress_context__ = cause, None, True
        return error

    def _proxy(self, location: _Rebuildable | None) -> Proxy | None:
        """The proxy the request went through, if one applies to its URL (:mod:`.proxy`)."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https"):  # s3://, gs://: the client's endpoint, not known here
            return None
        options = getattr(location, "storage_options", None) or {}
        try:
            return proxy_for(parts.scheme == "https", parts.netloc, options.get("proxy_url"))
        except ValueError:
            return None

    def _through(self, location: _Rebuildable | None) -> str:
        """For a failure message: the proxy the requests went through (which may be what failed:
        down, or unable to reach the server, a 502), or nothing."""
        proxy = self._proxy(location)
        if proxy is None:
            return ""
        return f"; through the proxy {proxy.shown} (down, or unable to reach or resolve the host?)"

    def _unreachable(self, unreached: tuple[str, str | None], e: BaseException, elapsed: float, deadline: float) -> str:
        """The message of a host never heard from that could not be reached: which, why, what to
        check."""
        kind, address = unreached
        server = self.server
        proxy = server.proxy if server is not None else None
        target = server.address if server is not None else urlsplit(self.url).netloc
        if proxy is not None and (address is None or address == proxy.address) and kind != "dns":
            whom = f"the proxy {proxy.shown} (on the way to {target})"
        else:
            whom = address or target
        why = _CONNECT_KINDS.get(kind, _CONNECT_KINDS["connect"])
        if kind == "timeout":
            why += f" (connect_timeout={self.policy.connect_timeout:g} s)"
        if self.url.startswith("hf://"):
            check = "the Hub's endpoint (HF_ENDPOINT or storage_options['endpoint'])"
        elif self.url.startswith("s3://"):
            check = "the endpoint (storage_options['endpoint'], AWS_ENDPOINT_URL)"
        elif self.url.startswith(("http://", "https://")):
            check = "the URL's host and port"
        else:
            check = "the URL and the endpoint"
        if proxy is not None:
            check += f", the network, and that the proxy {proxy.shown} runs there"
        else:
            check += ", the network, and a proxy if one is needed"
        check += " (HTTPS_PROXY, HTTP_PROXY or storage_options['proxy_url'])"
        detail = e.detail if isinstance(e, ConnectFailed) and e.detail else short_message(e)
        return (
            f"{self.what} failed: cannot connect to {whom}: {why}; no answer from it yet in this process "
            f"({self.attempt + 1} attempts in {elapsed:.1f} s, first_contact_deadline={deadline:g} s): "
            f"check {check} ({detail})"
        )

    def next_delay(self, e: BaseException, location: _Rebuildable | None) -> float:
        """Seconds to wait before trying again, or raise the error for good. Called outside the
        ``except`` block that caught ``e`` (what is raised inside one has ``e`` as its
        ``__context__``, whatever it says). ``location`` is rebuilt once after an auth error;
        None for a caller that settles auth errors itself (the Hub's API calls)."""
        if self.server is not None and _answer_in(e):
            mark_answered(self.server)
        if getattr(e, "final", False):  # an error that already says what to do (a gated Hub repo)
            raise e
        if location is not None and _auth_error(e) and not self.rebuilt:
            self.rebuilt = True
            location.rebuild()  # credentials may have rotated: resolve them again
            return 0.0
        refusal = server_refusal(e)
        if refusal is not None:  # a missing bucket is not a missing object, and no retry cures it
            raise self._fail(RemoteError, f"{self.what} failed: {refusal}", None, location)
        untrusted = untrusted_certificate(e)
        if untrusted is not None:
            raise self._fail(
                RemoteError,
                f"{self.what} failed: the server's TLS certificate does not verify ({untrusted}); "
                "nothing is read from a server whose identity is not proven (a private CA: name its "
                "certificate in SSL_CERT_FILE)",
                None,
                location,
            )
        if proxy_auth_refused(e):
            raise self._fail(
                RemoteError,
                f"{self.what} failed: the proxy asks for credentials or refused them (HTTP 407): put the user "
                "name and password in the proxy's URL (HTTPS_PROXY, HTTP_PROXY or storage_options['proxy_url'])",
                None,
                location,
            )
        host = unresolved_host(e, self.url)
        if host is not None:  # a wrong URL or endpoint: waiting does not make the name exist
            detail = e.detail if isinstance(e, HostNotFound) else short_message(e)
            proxy = None if isinstance(e, HostNotFound) else self._proxy(location)
            whose = repr(host)
            if proxy is not None:  # the client's text does not say whose name it looked up
                whose += f" (or the proxy's, {urlsplit('//' + proxy.address).hostname!r})"
            raise self._fail(
                RemoteError,
                f"{self.what} failed: the host name {whose} does not resolve; check the URL or the endpoint ({detail})",
                None,
                location,
            )
        if isinstance(e, FileNotFoundError):
            raise FileNotFoundError(f"{self.url}: no such object") from None
        if isinstance(e, ObjectChangedError):
            raise e
        if type(e).__name__ == "PreconditionError" or _status(e) == 412:
            remedy = getattr(location, "changed_remedy", "open the dataset again")
            raise ObjectChangedError(
                f"{self.url}: the object changed since this dataset was opened (its ETag "
                f"no longer matches); reading on would mix two versions of the data: {remedy}"
            ) from None
        if _status(e) == 416:
            raise ObjectChangedError(
                f"{self.url}: {self.what}: the range lies beyond the object's end (HTTP 416): "
                "it was truncated or replaced since it was indexed"
            ) from None
        if type(e).__name__ == "NotSupportedError" and "range" in str(e).lower():
            raise self._fail(
                RemoteError,
                "the server does not support ranged reads (HTTP Range), which reading samples in place needs",
                e,
                location,
            )
        if not transient(e):
            raise self._fail(RemoteError, f"{self.what} failed: {short_message(e)}", e, location)
        elapsed = time.monotonic() - self.start
        deadline = self.policy.retry_deadline
        unreached = connect_failure(e)
        if unreached is not None and not answered(self.server):
            # a host never heard from: a wrong endpoint far more often than a server restarting
            deadline = min(deadline, self.policy.first_contact_deadline)
            if elapsed >= deadline:
                raise self._fail(HostUnreachable, self._unreachable(unreached, e, elapsed, deadline), e, location)
        if elapsed >= deadline:
            raise self._fail(
                RemoteUnavailableError,
                f"{self.what} kept failing for {elapsed:.0f} s ({self.attempt + 1} attempts; "
                f"retry_deadline={self.policy.retry_deadline:g} s); last error: {short_message(e)}"
                + self._through(location),
                e,
                location,
            )
        if self.attempt == 0 or self.attempt % 10 == 0:
            log.warning(
                "%s: %s failed (%s); retrying for up to %.0f s more",
                self.url,
                self.what,
                self._shown(short_message(e), location),
                deadline - elapsed,
            )
        asked = getattr(e, "retry_after", None)  # a 429/503's Retry-After: the server's own wait
        delay = self.policy.delay(self.attempt) if asked is None else max(float(asked), self.policy.delay(self.attempt))
        delay = min(delay, max(deadline - elapsed, 0.0))
        self.attempt += 1
        return delay
