"""The server a request goes to (:class:`Server`, :func:`server_of`, :func:`location_server`)
and which servers have answered this process (:func:`answered`): state a failure to connect is
judged by, apart from :mod:`.failures` (what an error says) and :mod:`.retry` (what is done)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .proxy import Proxy, proxy_for
from .urls import endpoint_of


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
        elif scheme == "s3":  # AWS's host for the bucket (what a first contact is counted against)
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
