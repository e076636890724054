"""The HTTP proxy a request of the standard-library client goes through, by the rules curl,
requests and urllib follow: ``storage_options["proxy_url"]``, else ``HTTPS_PROXY`` (for
``https://``) or ``HTTP_PROXY`` (for ``http://``), else ``ALL_PROXY``, unless ``NO_PROXY`` names
the host. HTTPS goes through a ``CONNECT`` tunnel (the proxy sees only the host name); plain HTTP
asks the proxy for the absolute URL."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import os
import re
import socket
import ssl
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from .errors import RemoteError, _HTTPStatus
from .redaction import redact_url, remember_secrets


class ProxyRefused(RemoteError):
    """The proxy refused the request itself (HTTP 407: its credentials; 403: its rules); no
    retry cures it (``final``)."""

    final = True


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: ``address`` (``host:port``), its URL with credentials redacted (``shown``,
    for messages), the credentials its URL holds, and the URL itself."""

    address: str
    shown: str
    #: (user, password) from its URL, or None
    credentials: tuple[str, str] | None = field(default=None, repr=False)
    url: str = field(default="", repr=False)

    @property
    def authorization(self) -> str | None:
        """The ``Proxy-Authorization`` header its credentials make (Basic), or None."""
        if self.credentials is None:
            return None
        return "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()


def parse_proxy(url: str) -> Proxy:
    """A proxy URL (``http://[user:password@]host[:port]``; a bare ``host:port`` is taken as
    ``http://``) as a :class:`Proxy`, or a ValueError naming what is wrong.

    Args:
        url: the proxy's URL.

    >>> parse_proxy("proxy.corp:3128").address
    'proxy.corp:3128'
    >>> parse_proxy("http://u:p@10.0.0.1").shown
    'http://u:***@10.0.0.1'
    """
    if "://" not in url:
        url = "http://" + url
    parts, shown = urlsplit(url), redact_url(url)
    if parts.scheme != "http":
        raise ValueError(
            f"proxy {shown}: only http:// proxies are supported (HTTPS still reaches the server "
            "end to end, through a CONNECT tunnel); not a proxy spoken to over TLS or SOCKS"
        )
    try:
        host, port = parts.hostname, 80 if parts.port is None else parts.port
    except ValueError:
        raise ValueError(
            f"proxy {shown}: the port is not a number (a password holding '/', '?', '#' or '@' must be "
            "percent-encoded: %2F, %3F, %23, %40)"
        ) from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"proxy {shown}: no host, or a port out of range")
    credentials = None
    if parts.username is not None:
        credentials = (unquote(parts.username), unquote(parts.password or ""))
        remember_secrets(credentials[1])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Proxy(address, shown, credentials, url)


def environment_proxies() -> dict[str, str]:
    """The proxy variables as curl reads them: ``https``, ``http``, ``all`` and ``no`` from
    ``https_proxy`` / ``HTTPS_PROXY`` and so on, the lowercase one first (an empty one, set,
    means none)."""
    found = {}
    for kind in ("https", "http", "all", "no"):
        lower, upper = f"{kind}_proxy", f"{kind.upper()}_PROXY"
        value = os.environ[lower] if lower in os.environ else os.environ.get(upper, "")
        if value.strip():
            found[kind] = value.strip()
    return found


def bypassed(host: str, no_proxy: str, secure: bool = True) -> bool:
    """Whether ``NO_PROXY`` (``no_proxy``) names ``host``: ``*``; a name, which matches it and its
    subdomains (``corp.net``, ``.corp.net``, ``*.corp.net``); an address or a CIDR range, IPv4 or
    IPv6 (``10.0.0.0/8``, ``::1``); any of these with ``:PORT``, which then must match too.

    Args:
        host: the server, as ``host[:port]`` (``[v6]:port``).
        no_proxy: the comma-separated list.
        secure: whether the request is HTTPS (the port when ``host`` names none).

    >>> bypassed("data.corp.net:443", "localhost,.corp.net")
    True
    >>> bypassed("[::1]:9000", "::1"), bypassed("10.1.2.3", "10.0.0.0/8"), bypassed("a.org:80", "a.org:8080")
    (True, True, False)
    """
    parts = urlsplit("//" + host)
    name = (parts.hostname or host).lower()
    try:
        port = parts.port or (443 if secure else 80)
    except ValueError:
        return False
    for entry in no_proxy.replace(" ", "").lower().split(","):
        if not entry:
            continue
        if entry == "*":
            return True
        wanted, wanted_port = entry, None
        if entry.startswith("["):  # [v6]:port
            wanted, _, rest = entry[1:].partition("]")
            wanted_port = rest[1:] or None
        elif entry.count(":") == 1:  # name:port or v4:port (a bare v6 address has more colons)
            wanted, wanted_port = entry.split(":")
        if wanted_port is not None and wanted_port != str(port):
            continue
        try:
            if ipaddress.ip_address(name) in ipaddress.ip_network(wanted, strict=False):
                return True
            continue
        except ValueError:
            pass  # a name, not an address
        wanted = wanted.removeprefix("*.").lstrip(".")
        if wanted and (name == wanted or name.endswith("." + wanted)):
            return True
    return False


def _for_scheme(proxies: dict[str, str], secure: bool) -> str | None:
    """The environment's proxy for HTTPS (or plain HTTP) requests: its own variable, else ``all``."""
    return proxies.get("https" if secure else "http") or proxies.get("all")


def proxy_for(secure: bool, host: str, proxy_url: str | None = None) -> Proxy | None:
    """The proxy a request to ``host`` (``host[:port]``) goes through, or None for a direct
    connection: ``proxy_url``, else the environment's (:func:`environment_proxies`) unless
    ``NO_PROXY`` names the host (:func:`bypassed`).

    Args:
        secure: whether the request is HTTPS.
        host: the server, as ``host[:port]``.
        proxy_url: ``storage_options["proxy_url"]``, which wins over the environment.
    """
    if proxy_url:
        return parse_proxy(proxy_url)
    proxies = environment_proxies()
    chosen = _for_scheme(proxies, secure)
    if not chosen or bypassed(host, proxies.get("no", ""), secure):
        return None
    return parse_proxy(chosen)


def obstore_options(secure: bool, host: str, proxy_url: str | None = None) -> dict[str, str]:
    """obstore's ``proxy_url``/``proxy_excludes`` client options that make it take the route
    :func:`proxy_for` chooses (left alone, its HTTP library reads the variables by rules of its
    own: no ``*`` or ``:PORT`` in ``NO_PROXY``, the uppercase variable first).

    Args:
        secure: whether the requests are HTTPS.
        host: the server, as ``host[:port]``.
        proxy_url: ``storage_options["proxy_url"]``.
    """
    proxy = proxy_for(secure, host, proxy_url)
    if proxy is not None:
        return {"proxy_url": proxy.url}
    proxies = environment_proxies()
    environment = _for_scheme(proxies, secure)
    if not any(k in proxies for k in ("https", "http", "all")):
        return {}  # no proxy anywhere: obstore finds none either
    # Direct to this host, though the environment names a proxy: giving obstore a proxy that
    # excludes the host is the one way its options say so (another host, reached by a
    # redirect, goes through the environment's proxy, as it would have).
    try:
        fallback = parse_proxy(environment).url if environment else "http://127.0.0.1:9"
    except ValueError:
        fallback = "http://127.0.0.1:9"  # unusable (SOCKS, ...): never used for this host anyway
    return {"proxy_url": fallback, "proxy_excludes": urlsplit("//" + host).hostname or host}


class _ConnectTimeout:
    """A connection whose connect (TCP, a proxy's ``CONNECT``, TLS) may take ``connect_timeout``
    seconds, and each read afterwards ``timeout``: a host that does not accept connections is
    given up on as soon as obstore gives up on it, a slow answer is waited for."""

    timeout: float | None
    sock: socket.socket | None

    def __init__(self, *args, connect_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]  # http.client's connection
        self.connect_timeout = connect_timeout

    def connect(self) -> None:
        full = self.timeout
        if self.connect_timeout is not None:
            self.timeout = self.connect_timeout if full is None else min(full, self.connect_timeout)
        try:
            super().connect()  # type: ignore[misc]  # http.client's connection
        finally:
            self.timeout = full
        if self.sock is not None:
            self.sock.settimeout(full)


class TimedHTTPConnection(_ConnectTimeout, http.client.HTTPConnection):
    """``http.client.HTTPConnection`` with a connect timeout of its own (``connect_timeout=``)."""


class TimedHTTPSConnection(_ConnectTimeout, http.client.HTTPSConnection):
    """``http.client.HTTPSConnection`` with a connect timeout of its own (``connect_timeout=``)."""


def connection(
    secure: bool,
    host: str,
    timeout: float,
    proxy: Proxy | None,
    verify: bool = True,
    connect_timeout: float | None = None,
) -> http.client.HTTPConnection:
    """A connection for requests to ``host``: direct, tunnelled through ``proxy`` (HTTPS), or
    to ``proxy`` itself (plain HTTP: the request names the absolute URL, see :func:`target`).

    Args:
        secure: whether the requests are HTTPS.
        host: the server, as ``host[:port]``.
        timeout: seconds a read (and, without ``connect_timeout``, the connect) may take.
        proxy: the proxy, or None.
        verify: whether an HTTPS server's certificate is verified (``allow_invalid_certificates``
            turns it off).
        connect_timeout: seconds the connect may take (TCP, a proxy's tunnel, TLS).
    """
    conn: http.client.HTTPConnection
    address = host if proxy is None else proxy.address
    if secure:
        context = ssl.create_default_context() if verify else ssl._create_unverified_context()
        conn = TimedHTTPSConnection(address, timeout=timeout, context=context, connect_timeout=connect_timeout)
    else:
        conn = TimedHTTPConnection(address, timeout=timeout, connect_timeout=connect_timeout)
    if proxy is None:
        return conn
    if secure:
        conn.set_tunnel(host, headers={"Proxy-Authorization": proxy.authorization} if proxy.authorization else None)
    return conn


def target(
    secure: bool, host: str, path: str, proxy: Proxy | None, headers: dict[str, str]
) -> tuple[str, dict[str, str]]:
    """The request target and headers for ``path`` on ``host``: unchanged, except for plain HTTP
    through a proxy (the absolute URL, and the proxy's credentials).

    Args:
        secure: whether the request is HTTPS.
        host: the server, as ``host[:port]``.
        path: the origin-form target (``/path?query``).
        proxy: the proxy, or None.
        headers: the request's headers.
    """
    if proxy is None or secure:
        return path, headers
    if proxy.authorization:
        headers = {**headers, "Proxy-Authorization": proxy.authorization}
    return f"http://{host}{path}", headers


_TUNNEL_STATUS = re.compile(r"Tunnel connection failed: (\d{3})")


def tunnel_failure(e: BaseException, proxy: Proxy | None, url: str) -> Exception | None:
    """What to raise for a ``CONNECT`` the proxy refused (``e`` from ``http.client``): a
    :class:`ProxyRefused` for 407/403, an ``_HTTPStatus`` (retried when 5xx) for another status;
    None when ``e`` is no tunnel failure.

    Args:
        e: the error of the request.
        proxy: the proxy the request went through.
        url: the URL asked for, for messages.
    """
    m = _TUNNEL_STATUS.search(str(e)) if proxy is not None and isinstance(e, OSError) else None
    if m is None or proxy is None:
        return None
    status = int(m.group(1))
    return refusal(status, proxy, url, tunnel=True) or _HTTPStatus(status, f"{url} (through the proxy {proxy.shown})")


def refusal(status: int, proxy: Proxy | None, url: str, tunnel: bool = False) -> ProxyRefused | None:
    """A :class:`ProxyRefused` when a request through ``proxy`` got 407 (or 403 to a ``CONNECT``,
    which only the proxy answers); else None.

    Args:
        status: the HTTP status.
        proxy: the proxy, or None.
        url: the URL asked for.
        tunnel: whether the status answered a ``CONNECT``.
    """
    if proxy is None:
        return None
    if status == 407:
        said = (
            "refused the credentials in its URL"
            if proxy.authorization
            else "asks for credentials (http://USER:PASSWORD@host:port)"
        )
        return ProxyRefused(f"{url}: the proxy {proxy.shown} {said} (HTTP 407)")
    if status == 403 and tunnel:
        return ProxyRefused(f"{url}: the proxy {proxy.shown} refuses to connect to this host (HTTP 403)")
    return None
