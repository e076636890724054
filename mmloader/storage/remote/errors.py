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
