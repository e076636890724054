"""What a failed request's error says: whether a retry may cure it (:func:`transient`), a refusal
to name at once (:func:`server_refusal`, :func:`unresolved_host`, a certificate, a proxy's 407), a
failure to connect (:func:`connect_failure`), or an answer. Apart from :mod:`.retry`, which acts on
it: these read each client's errors and hold no state."""

from __future__ import annotations

import asyncio
import errno
import re
import socket
import ssl
from urllib.parse import urlsplit

from .errors import LongBody, ObjectChangedError, ShortBody


def _next(e: BaseException) -> BaseException | None:
    """The error ``e`` was raised from: its cause, its context, or the error it wraps as its
    argument (httpcore's ``ConnectError(ConnectionRefusedError(...))``, raised from nothing)."""
    inner = e.args[0] if e.args and isinstance(e.args[0], BaseException) else None
    return e.__cause__ or (None if e.__suppress_context__ else e.__context__) or inner


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
    if type(e).__module__.startswith("httpx"):  # the Hub's API calls: the network's failures only
        return type(e).__name__ in _HTTPX_TRANSIENT
    return isinstance(e, (OSError, asyncio.TimeoutError, TimeoutError, ConnectionError, EOFError)) or type(
        e
    ).__module__.startswith(("obstore", "urllib3", "http"))


#: httpx's errors (huggingface_hub's client) that a retry may cure: connects, reads, timeouts.
_HTTPX_TRANSIENT = {
    "ConnectError",
    "ConnectTimeout",
    "ReadError",
    "ReadTimeout",
    "WriteError",
    "WriteTimeout",
    "PoolTimeout",
    "RemoteProtocolError",
    "NetworkError",
    "TimeoutException",
    "ProxyError",
}


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
        if isinstance(cur, socket.gaierror):
            return _host_in(str(e), url) if cur.errno != _EAI_AGAIN else None
        cur = _next(cur)
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
    if _status(e) == 407 or (type(e).__name__ == "ProxyError" and "407" in str(e)):  # (httpx's: a tunnel refused)
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
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 8 and all(cur is not s for s in seen):  # httpx wraps it twice
        seen.append(cur)
        reason = getattr(cur, "reason", None)
        for found in (cur, reason):
            if isinstance(found, ssl.SSLCertVerificationError):
                return getattr(found, "verify_message", None) or str(found)
        cur = _next(cur)
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

    >>> connect_failure(OSError("no connection")) is None
    True
    >>> connect_failure(TimeoutError("timed out")) is None  # a connect's, or an answer's?
    True
    """
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 8 and all(cur is not s for s in seen):
        seen.append(cur)
        module, name = type(cur).__module__, type(cur).__name__
        if isinstance(cur, ConnectionRefusedError):  # raised by a connect only
            return "refused", None
        if module.startswith("httpx") and name in ("ConnectTimeout", "ProxyError"):  # the Hub's API calls
            return ("timeout" if name == "ConnectTimeout" else "connect"), None
        if module.startswith("obstore"):
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
        cur = _next(cur)
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
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first[:300]}"
