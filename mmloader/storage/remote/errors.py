"""The errors of object-storage requests: those callers catch (:class:`RemoteError` and its
kinds), and the bodies and statuses the retry policy classifies."""

from __future__ import annotations

from ...errors import MMLoaderError


class RemoteError(MMLoaderError):
    """A request to object storage failed for good (not retried, or out of retries)."""


class RemoteUnavailableError(RemoteError):
    """Object storage did not answer successfully within the retry deadline."""


class HostUnreachable(RemoteUnavailableError):
    """A host that has not answered this process yet could not be reached (the connection
    refused, its name not resolved, the connect timed out) within ``first_contact_deadline``: a
    wrong endpoint, a server not started, a network or proxy in the way. The message names the
    host, the reason and what to check. A host that answered once is retried for the whole
    ``retry_deadline`` instead (a server restarting)."""


class ObjectChangedError(RemoteError):
    """An object is no longer the version this dataset was opened with (replaced or rewritten):
    reading on would mix two versions of the data, so it is never retried or skipped."""


class LongBody(OSError):
    """A response had more bytes than asked for: the server does not honour the request."""


class ShortBody(OSError):
    """A response had fewer bytes than asked for (a body cut short in transit)."""


class HostNotFound(OSError):
    """The host name of a request does not resolve (DNS answered that there is no such host):
    the URL or endpoint is wrong, and no retry cures it. ``host`` names it."""

    def __init__(self, host: str, detail: str = ""):
        super().__init__(f"the host name {host!r} does not resolve" + (f" ({detail})" if detail else ""))
        self.host, self.detail = host, detail


class ConnectFailed(OSError):
    """The standard library's client could not connect: ``kind`` is ``"refused"``, ``"timeout"``,
    ``"dns"`` (a resolver that did not answer), ``"unreachable"`` or ``"connect"``; ``address``
    is the ``host:port`` it connected to (a proxy's, when one is used). Raised before any byte
    of the request was sent; retried (:mod:`.retry` bounds how long while the host has never
    answered)."""

    def __init__(self, kind: str, address: str, detail: str = ""):
        super().__init__(f"cannot connect to {address} ({kind})" + (f": {detail}" if detail else ""))
        self.kind, self.address, self.detail = kind, address, detail


class _HTTPStatus(OSError):
    """A non-success HTTP answer of the standard-library client; ``body`` (its first 4 KiB) is
    kept so that :func:`~.failures.server_refusal` can read the S3 error code in it."""

    def __init__(self, status: int, url: str, body: bytes = b"", retry_after: float | None = None):
        said = body[:200].decode("utf-8", "replace").strip()
        super().__init__(f"{url}: HTTP status {status}" + (f": {said}" if said else ""))
        self.status, self.body = status, body[:4096]
        #: seconds the server asked to wait before trying again (``Retry-After``), if it said
        self.retry_after = retry_after
