"""Dataset URLs: which strings are URLs, their canonical scheme, joining and splitting names."""

from __future__ import annotations

import re
from typing import Any

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
    if "?" in url or "#" in url:
        raise ValueError(f"{url}: a dataset URL cannot hold '?' or '#' (a query or fragment); name the folder only")
    if scheme != "http" and "%" in url:
        raise ValueError(
            f"{url}: percent-escapes are not supported in {scheme}:// dataset URLs; write the key as "
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
        raise ValueError(f"{url}: unsupported URL scheme (supported: s3://, gs://, az://, http://, https://)")
    return SCHEMES[m.group(1).lower()]


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
