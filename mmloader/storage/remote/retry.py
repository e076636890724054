"""The retry policy: which failures are retried (:func:`transient`), which are named at once
(:func:`server_refusal`: a missing bucket, refused access; :func:`unresolved_host`: a host name
that does not resolve), and the per-request bookkeeping of backoff and deadline
(:class:`_Deadline`), whose messages and log lines go through :func:`~.redaction.redact`."""

from __future__ import annotations

import asyncio
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

from .errors import HostNotFound, LongBody, ObjectChangedError, RemoteError, RemoteUnavailableError, ShortBody
from .proxy import Proxy, proxy_for
from .redaction import redact, redact_url

log = logging.getLogger("mmloader")


@dataclass(frozen=True)
class Policy:
    """How requests behave: ``retry_deadline`` (s) bounds how long a failing request is retried
    (a server that is gone pauses the reader that long, then the error names the URL);
    ``request_timeout`` (s) bounds one request; ``max_in_flight`` requests run at once per
    process; backoff doubles from ``backoff`` up to ``max_backoff`` with full jitter."""

    retry_deadline: float = 120.0
    request_timeout: float = 30.0
    connect_timeout: float = 5.0
    max_in_flight: int = 64
    backoff: float = 0.1
    max_backoff: float = 5.0

    @classmethod
    def from_env(cls, **overrides: Any) -> "Policy":
        env = {"retry_deadline": "MMLOADER_RETRY_DEADLINE", "request_timeout": "MMLOADER_REQUEST_TIMEOUT"}
        values: dict[str, Any] = {}
        for name, var in env.items():
            if os.environ.get(var):
                values[name] = float(os.environ[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def __post_init__(self) -> None:
        for name, low, strict in (
            ("retry_deadline", 0, False),
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

    def __init__(self, policy: Policy, url: str, what: str):
        self.policy, self.url, self.what = policy, redact_url(url), what
        self.start = time.monotonic()
        self.attempt = 0
        self.rebuilt = False

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

    def next_delay(self, e: BaseException, location: _Rebuildable | None) -> float:
        """Seconds to wait before trying again, or raise the error for good. Called outside the
        ``except`` block that caught ``e`` (what is raised inside one has ``e`` as its
        ``__context__``, whatever it says). ``location`` is rebuilt once after an auth error;
        None for a caller that settles auth errors itself (the Hub's API calls)."""
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
        if elapsed >= self.policy.retry_deadline:
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
                self.policy.retry_deadline - elapsed,
            )
        asked = getattr(e, "retry_after", None)  # a 429/503's Retry-After: the server's own wait
        delay = self.policy.delay(self.attempt) if asked is None else max(float(asked), self.policy.delay(self.attempt))
        delay = min(delay, max(self.policy.retry_deadline - elapsed, 0.0))
        self.attempt += 1
        return delay
