"""What every client does (:class:`Client`), and the retry loop the blocking clients share
(:class:`_Client`). :class:`~.location.Location` picks one client per process and purpose and
calls only these methods on it."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable, Protocol, runtime_checkable

from .retry import Policy, _Deadline
from .runtime import _background
from .servers import Server, location_server

#: Client settings (obstore's ``client_options``) every client accepts in ``storage_options``;
#: the fsspec client drops them (its own settings come from the policy).
_CLIENT_OPTION_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "timeout",
    "connect_timeout",
    "user_agent",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "http1_only",
    "http2_only",
    "proxy_url",
    "default_headers",
    "read_timeout",
}


@runtime_checkable
class LocationLike(Protocol):
    """What a client uses of its :class:`~.location.Location` (declared here, not imported, so
    that the clients and the location that builds them do not import each other)."""

    url: str
    scheme: str
    storage_options: dict
    policy: Policy
    pins: dict[str, str]

    def name_url(self, name: str) -> str:
        """The URL of ``name`` inside the folder."""
        ...

    def rebuild(self) -> None:
        """Forget this process's clients (credentials are resolved again)."""
        ...

    def _checked_etag(self, name: str, etag: str | None) -> None:
        """Compare an answer's ETag with the pin of ``name`` (pinning it on the first answer)."""
        ...


@runtime_checkable
class Client(Protocol):
    """The requests of one process to one :class:`~.location.Location`. Names are relative to
    the location's folder; every request is retried under the location's policy, and a pinned
    name (``location.pins``) is read only as its pinned version."""

    location: LocationLike

    def url(self, name: str) -> str:
        """The full URL of ``name``, as error messages name it."""
        ...

    def get(self, name: str) -> bytes:
        """The whole object ``name``."""
        ...

    def get_many(self, names: list[str]) -> list[bytes]:
        """Several whole objects, concurrently, in the order of ``names``."""
        ...

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        """``[(name, start, end), ...]`` -> the bytes of each range (each exactly ``end - start``)."""
        ...

    def start_range(self, name: str, start: int, end: int) -> concurrent.futures.Future:
        """Bytes ``[start, end)`` of ``name`` fetched in the background: a future of them."""
        ...

    def start_ranges(self, requests: list[tuple[str, int, int]]) -> concurrent.futures.Future:
        """:meth:`get_ranges` started in the background: a future of the list."""
        ...

    def head(self, name: str) -> tuple[int | None, str | None]:
        """(size, ETag) of ``name``; (None, None) when there is no such object."""
        ...

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(name, size) of every object under ``prefix``."""
        ...

    def versions(self) -> dict[str, str]:
        """name -> ETag of every object under the folder (empty where listings cannot say)."""
        ...

    def put_file(self, name: str, local: str) -> None:
        """Upload the local file ``local`` as ``name``."""
        ...

    def put_bytes(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``."""
        ...

    def delete(self, name: str) -> None:
        """Delete ``name``; a missing object is not an error."""
        ...


class _Client:
    """What the clients share: URLs for messages, and the blocking retry loop."""

    location: LocationLike
    get_ranges: Callable[[list[tuple[str, int, int]]], list]  # each client defines it
    _contact: Server | None = None

    def url(self, name: str) -> str:
        return self.location.name_url(name)

    @property
    def _server(self) -> Server:
        """Where the requests go (:func:`~.servers.location_server`): whether it has answered
        decides how long a failure to connect is retried."""
        if self._contact is None:
            self._contact = location_server(self.location)
        return self._contact

    def _rebuild(self) -> None:
        """Build the client again (credentials resolved again after an authentication error)."""

    def start_ranges(self, requests: list[tuple[str, int, int]]) -> concurrent.futures.Future:
        # the blocking clients run the whole batch on a background thread; obstore overrides
        # this with one task on its event loop
        return _background().submit(self.get_ranges, list(requests))

    def _retry(self, what: str, name: str, fn):
        """``fn()``, retried under the location's policy (see :class:`_Deadline`)."""
        deadline = _Deadline(self.location.policy, self.url(name), what, self._server)
        while True:
            try:
                result = fn()
            except Exception as e:
                failed = e
            else:
                deadline.answered()
                return result
            # here, not in the except block: what next_delay raises would have the client's
            # error, which may hold the request's headers, as its __context__
            rebuilt = deadline.rebuilt
            delay = deadline.next_delay(failed, self.location)
            del failed
            if deadline.rebuilt and not rebuilt:
                self._rebuild()
            time.sleep(delay)
