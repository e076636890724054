"""The retry policy (:class:`Policy`) and the per-request bookkeeping of backoff and deadline
(:class:`_Deadline`), whose messages and log lines go through :func:`~.redaction.redact`. Which
failures are retried is :mod:`.failures`' (what an error says), which hosts have answered
:mod:`.servers`' (the first-contact rule)."""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol
from urllib.parse import urlsplit

from .errors import (
    HostUnreachable,
    ObjectChangedError,
    RemoteError,
    RemoteUnavailableError,
)
from .failures import (
    _CONNECT_KINDS,
    _answer_in,
    _auth_error,
    _status,
    connect_failure,
    proxy_auth_refused,
    server_refusal,
    short_message,
    transient,
    unresolved_host,
    untrusted_certificate,
)
from .proxy import Proxy, proxy_for
from .redaction import redact, redact_url
from .servers import Server, answered, mark_answered, server_of

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
        detail = short_message(e)
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
        if location is not None and _auth_error(e):  # refused again after the client was rebuilt
            status = _status(e)
            raise self._fail(
                RemoteError,
                f"{self.what} failed: access denied"
                + (f" (HTTP {status})" if status else "")
                + f": check the credentials ({short_message(e)})",
                None,
                location,
            )
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
            detail = short_message(e)
            proxy = self._proxy(location)
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
                "the server does not support ranged reads (HTTP Range), which reading samples in place needs: "
                "serve the folder with a server that does, or download it and open the local copy",
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
