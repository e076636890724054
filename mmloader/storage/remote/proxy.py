"""The HTTP proxy a request of the standard-library client goes through, by the rules curl,
requests and urllib follow: ``storage_options["proxy_url"]``, else ``HTTPS_PROXY`` (for
``https://``) or ``HTTP_PROXY`` (for ``http://``), else ``ALL_PROXY``, unless ``NO_PROXY`` names
the host. HTTPS goes through a ``CONNECT`` tunnel (the proxy sees only the host name); plain HTTP
asks the proxy for the absolute URL."""

from __future__ import annotations

import base64
import http.client
import re
import urllib.request
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
    for messages), the ``Proxy-Authorization`` its URL's credentials make, and the URL itself."""

    address: str
    shown: str
    authorization: str | None = field(default=None, repr=False)
    url: str = field(default="", repr=False)


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
        host, port = parts.hostname, parts.port or 80
    except ValueError:
        raise ValueError(f"proxy {shown}: the port is not a number") from None
    if not host:
        raise ValueError(f"proxy {shown}: no host")
    authorization = None
    if parts.username is not None:
        user, password = unquote(parts.username), unquote(parts.password or "")
        remember_secrets([password] if password else [])
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Proxy(address, shown, authorization, url)


def proxy_for(secure: bool, host: str, proxy_url: str | None = None) -> Proxy | None:
    """The proxy a request to ``host`` (``host[:port]``) goes through, or None for a direct
    connection.

    Args:
        secure: whether the request is HTTPS.
        host: the server, as ``host[:port]``.
        proxy_url: ``storage_options["proxy_url"]``, which wins over the environment.
    """
    if proxy_url:
        return parse_proxy(proxy_url)
    proxies = urllib.request.getproxies_environment()
    if not proxies or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    chosen = proxies.get("https" if secure else "http") or proxies.get("all")
    return parse_proxy(chosen) if chosen else None


def connection(secure: bool, host: str, timeout: float, proxy: Proxy | None) -> http.client.HTTPConnection:
    """A connection for requests to ``host``: direct, tunnelled through ``proxy`` (HTTPS), or
    to ``proxy`` itself (plain HTTP: the request names the absolute URL, see :func:`target`).

    Args:
        secure: whether the requests are HTTPS.
        host: the server, as ``host[:port]``.
        timeout: seconds a connect or read may take.
        proxy: the proxy, or None.
    """
    cls = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    if proxy is None:
        return cls(host, timeout=timeout)
    conn = cls(proxy.address, timeout=timeout)
    if secure:
        conn.set_tunnel(host, headers={"Proxy-Authorization": proxy.authorization} if proxy.authorization else None)
    return conn


def target(secure: bool, host: str, path: str, proxy: Proxy | None, headers: dict) -> tuple[str, dict]:
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
