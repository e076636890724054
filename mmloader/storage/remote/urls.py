"""Dataset URLs: which strings are URLs, their canonical scheme, their userinfo, joining and
splitting names."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from .redaction import redact_url

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
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def check_url(url: str, scheme: str | None = None) -> None:
    """Refuse what would name different objects for readers and writers: a query or fragment,
    and percent-escapes in object-store keys (the key would be the escape for one client and
    the decoded text for another).

    >>> check_url("s3://b/ds?x")
    Traceback (most recent call last):
    ValueError: s3://b/ds?x: a dataset URL cannot hold '?' or '#' (a query or fragment); name the folder only
    """
    scheme = scheme or scheme_of(url)
    if "?" in url or "#" in url:  # the message shows no signature or token the query held
        raise ValueError(
            f"{redact_url(url)}: a dataset URL cannot hold '?' or '#' (a query or fragment); name the folder only"
        )
    if scheme != "http" and "%" in url:
        raise ValueError(
            f"{redact_url(url)}: percent-escapes are not supported in {scheme}:// dataset URLs; write the key as "
            "it is (spaces and other characters are fine)"
        )


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
            f"{redact_url(url)}: unsupported URL scheme (supported: s3://, gs://, az://, http://, https://)"
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
