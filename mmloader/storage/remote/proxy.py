"""Which HTTP proxy a request goes through: for messages that name it, and for obstore, whose HTTP
library reads the variables by rules of its own (:func:`obstore_options`; ``huggingface_hub``
routes its API calls itself), by the rules curl follows:
``storage_options["proxy_url"]``, else ``HTTPS_PROXY`` (for ``https://``) or ``HTTP_PROXY`` (for
``http://``), else ``ALL_PROXY``, unless ``NO_PROXY`` names the host."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from .redaction import redact_url, remember_secrets


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: ``address`` (``host:port``), its URL with credentials redacted (``shown``,
    for messages), the credentials its URL holds, and the URL itself."""

    address: str
    shown: str
    #: (user, password) from its URL, or None
    credentials: tuple[str, str] | None = field(default=None, repr=False)
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
