"""Dataset URLs: which strings are URLs, their canonical scheme, their userinfo, joining and
splitting names."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

from .redaction import redact_url, userinfo_end

SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "azure": "az",
    "abfs": "az",
    "abfss": "az",
    "http": "http",
    "https": "http",
    "hf": "hf",
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
_AUTHORITY_CUT = re.compile(r"[/?#]")


def check_url(url: str, scheme: str | None = None) -> None:
    """Refuse what would name different objects for readers and writers: a query or fragment,
    and percent-escapes in object-store keys (the key would be the escape for one client and
    the decoded text for another); and credentials holding a raw ``/``, ``?`` or ``#``, which no
    client would read as credentials (the message shows them redacted).

    >>> check_url("s3://b/ds?x")
    Traceback (most recent call last):
    ValueError: s3://b/ds?x: a dataset URL cannot hold '?' or '#' (a query or fragment); name the folder only
    """
    scheme = scheme or scheme_of(url)
    rest = url.partition("://")[2]
    at = userinfo_end(rest)
    if at is not None and _AUTHORITY_CUT.search(rest[:at]):
        if scheme != "http":
            raise ValueError(
                f"{redact_url(url)}: {scheme}:// URLs cannot hold credentials: give them as storage_options "
                "(e.g. access_key_id and secret_access_key) or in the environment (AWS_ACCESS_KEY_ID, ...)"
            )
        raise ValueError(
            f"{redact_url(url)}: the password (or token) in this URL holds a '/', '?' or '#', which end a "
            "URL's host part: percent-encode it (%2F, %3F, %23), or give it as storage_options['headers']"
        )
    if "?" in url or "#" in url:  # the message shows no signature or token the query held
        raise ValueError(
            f"{redact_url(url)}: a dataset URL cannot hold '?' or '#' (a query or fragment); name the folder only"
        )
    if scheme not in ("http", "hf") and "%" in url:
        raise ValueError(
            f"{redact_url(url)}: percent-escapes are not supported in {scheme}:// dataset URLs; write the key as "
            "it is (spaces and other characters are fine)"
        )


#: The environment variables naming the endpoint of ``s3://`` requests, the first set winning.
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def endpoint_of(scheme: str, options: Mapping, environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(the endpoint URL a location's requests go to, where it was given): ``storage_options``'
    ``endpoint``, else for ``s3://`` the environment's
    (:data:`S3_ENDPOINT_ENV`); ``(None, "")`` when none is given. Every client and every check
    takes it from here, so an endpoint is the same wherever it was given.

    Args:
        scheme: the location's canonical scheme (``s3``, ``gs``, ``az``, ``http``).
        options: its ``storage_options``.
        environ: the environment (default ``os.environ``).

    >>> endpoint_of("s3", {"endpoint": "http://127.0.0.1:9000"}, {})
    ('http://127.0.0.1:9000', "storage_options['endpoint']")
    >>> endpoint_of("s3", {}, {"AWS_ENDPOINT_URL": "http://minio:9000"})
    ('http://minio:9000', 'AWS_ENDPOINT_URL')
    """
    environ = os.environ if environ is None else environ
    if options.get("endpoint"):
        return str(options["endpoint"]), "storage_options['endpoint']"
    if scheme == "s3":
        for var in S3_ENDPOINT_ENV:
            if environ.get(var):
                return environ[var], var
    return None, ""


def check_endpoint(endpoint: str, where: str) -> None:
    """Refuse at once an endpoint that cannot work, naming it redacted (never as requests retried
    until the deadline): one holding credentials (give those as ``storage_options`` or in the
    environment), one whose port is no number.

    Args:
        endpoint: the endpoint URL.
        where: where it was given (``storage_options['endpoint']``, ``AWS_ENDPOINT_URL``).

    >>> check_endpoint("http://minio:pa55word@127.0.0.1:9000", "AWS_ENDPOINT_URL")
    Traceback (most recent call last):
    ValueError: endpoint http://minio:***@127.0.0.1:9000 (AWS_ENDPOINT_URL): an endpoint cannot hold credentials: give them as storage_options (access_key_id, secret_access_key) or in the environment
    """
    if "://" not in endpoint:
        return
    shown = f"endpoint {redact_url(endpoint)} ({where})"
    if userinfo_end(endpoint.partition("://")[2]) is not None:
        raise ValueError(
            f"{shown}: an endpoint cannot hold credentials: give them as storage_options "
            "(access_key_id, secret_access_key) or in the environment"
        )
    try:
        urlsplit(endpoint).port  # noqa: B018  (parsing the port is the check)
    except ValueError as e:
        raise ValueError(f"{shown}: invalid port ({e})") from None


def lower_scheme(url: str) -> str:
    """``url`` with its scheme in lower case (``HTTP://host/`` is ``http://host/``: schemes are
    case-insensitive, and the clients compare them as written).

    >>> lower_scheme("HTTPS://Host/DS"), lower_scheme("data/DS")
    ('https://Host/DS', 'data/DS')
    """
    m = _URL.match(url)
    return m.group(1).lower() + url[len(m.group(1)) :] if m else url


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path.

    >>> is_url("s3://bucket/ds/"), is_url("data/shapes.lmdb"), is_url("https://host/ds")
    (True, False, True)
    """
    return isinstance(path, str) and _URL.match(path) is not None


def scheme_of(url: str) -> str:
    """The canonical scheme (``s3``, ``gs``, ``az`` or ``http``) of a URL; ValueError if unsupported.

    >>> scheme_of("gcs://b/x"), scheme_of("https://h/x")
    ('gs', 'http')
    """
    m = _URL.match(url)
    if not m or m.group(1).lower() not in SCHEMES:
        raise ValueError(
            f"{redact_url(url)}: unsupported URL scheme (supported: s3://, gs://, az://, http://, https://, hf://)"
        )
    return SCHEMES[m.group(1).lower()]


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(``url`` without its userinfo, the user, the password), the userinfo's percent-escapes
    decoded; ``(url, None, None)`` when it has none. The userinfo is what precedes the last ``@``
    of the authority (the part before the first ``/``, ``?`` or ``#``), so an ``@`` in a key is
    not one.

    Args:
        url: a ``scheme://`` URL.

    >>> split_userinfo("https://al%40ice:pa55@host:8080/ds/a@b")
    ('https://host:8080/ds/a@b', 'al@ice', 'pa55')
    >>> split_userinfo("https://token@host/ds"), split_userinfo("s3://bucket/k@y")
    (('https://host/ds', 'token', None), ('s3://bucket/k@y', None, None))
    """
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if not sep or "@" not in authority:
        return url, None, None
    userinfo, _, host = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return f"{scheme}://{host}{rest[len(authority) :]}", unquote(user), unquote(password) if colon else None


def join(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, one slash between each.

    >>> join("s3://b/ds/", "index.json"), join("s3://b/ds", "a", "b.tar")
    ('s3://b/ds/index.json', 's3://b/ds/a/b.tar')
    """
    out = url.rstrip("/")
    for n in names:
        out += "/" + n.lstrip("/")
    return out


def parent_and_name(url: str) -> tuple[str, str]:
    """(``url`` of the folder, last part).

    >>> parent_and_name("s3://b/ds/index.json")
    ('s3://b/ds', 'index.json')
    """
    head, _, tail = url.rstrip("/").rpartition("/")
    return head, tail
