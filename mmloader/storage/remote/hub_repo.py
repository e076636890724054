"""What names a Hub dataset and who may read it: ``hf://`` URLs (:class:`HubPath`), the endpoint,
the token, and a repository at one commit (:class:`HubRepo`, what a location holds). Apart from
:mod:`.hub_api` (the requests) and :mod:`.hub` (opening): plain values, no request made here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, unquote

from .redaction import remember_secrets

DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class HubPath:
    """The parts of an ``hf://`` URL.

    Args:
        repo_id: ``ORG/NAME``.
        revision: the branch, tag or commit as written (``main`` when none is given).
        path: the folder inside the repository (``""`` for its root).
        repo_type: ``datasets`` (the only kind mmloader reads).
    """

    repo_id: str
    revision: str
    path: str
    repo_type: str = "datasets"

    @property
    def url(self) -> str:
        """The URL as written, with the revision it names."""
        rev = "" if self.revision == "main" else "@" + quote(self.revision, safe="")
        return f"hf://{self.repo_type}/{self.repo_id}{rev}" + (f"/{self.path}" if self.path else "")


def parse_hub_url(url: str) -> HubPath:
    """Split ``hf://datasets/ORG/NAME[@REVISION]/path``; a ValueError names what is wrong.

    A revision holding a slash is percent-encoded, as ``huggingface_hub`` writes it
    (``@refs%2Fconvert%2Fparquet``).

    Args:
        url: the ``hf://`` URL.

    >>> parse_hub_url("hf://datasets/org/name@v1.0/data/train")
    HubPath(repo_id='org/name', revision='v1.0', path='data/train', repo_type='datasets')
    """
    rest = url.split("://", 1)[1].strip("/")
    # huggingface_hub also takes the special refs unencoded: @refs/convert/parquet, @refs/pr/1
    special = re.match(r"^([^/]+/[^/]+/[^/@]+@)(refs/(?:convert|pr)/[^/]+)(/.*)?$", rest)
    if special:
        rest = special.group(1) + quote(special.group(2), safe="") + (special.group(3) or "")
    parts = rest.split("/")
    if parts[0] != "datasets":
        raise ValueError(
            f"{url}: mmloader reads dataset repositories: write hf://datasets/ORG/NAME[@REVISION]/path "
            f"(models and spaces hold no datasets)"
        )
    if len(parts) < 3 or not parts[1] or not parts[2]:
        raise ValueError(f"{url}: expected hf://datasets/ORG/NAME[@REVISION]/path (the repository's ORG/NAME)")
    name, _, revision = parts[2].partition("@")
    if "@" in parts[2] and not revision:
        raise ValueError(f"{url}: an empty revision after '@': name a branch, tag or commit, or leave out '@'")
    return HubPath(f"{parts[1]}/{name}", unquote(revision) or "main", "/".join(p for p in parts[3:] if p))


def hub_endpoint(storage_options: Mapping | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The Hub's endpoint: ``storage_options["endpoint"]``, ``$HF_ENDPOINT`` or huggingface.co.

    Args:
        storage_options: the location's options.
        environ: the environment (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    endpoint = (storage_options or {}).get("endpoint") or environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return str(endpoint).rstrip("/")


def hub_token(storage_options: Mapping | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token to send: ``storage_options["token"]`` (``False``: none), ``$HF_TOKEN``
    (or the older ``$HUGGING_FACE_HUB_TOKEN``), else the file ``hf auth login`` wrote.

    Args:
        storage_options: the location's options.
        environ: the environment (default ``os.environ``).
    """
    return _token_and_source(storage_options, environ)[0]


def token_file(environ: Mapping[str, str] | None = None) -> str:
    """Where ``hf auth login`` saves the token: ``$HF_TOKEN_PATH``, else ``$HF_HOME/token``."""
    environ = os.environ if environ is None else environ
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")


def _checked_token(token: Any, where: str) -> str:
    """A token as sent: a string without surrounding blanks or control characters (a header
    cannot hold them); what is wrong is said without showing it."""
    if not isinstance(token, str):
        raise TypeError(f"the Hub token ({where}) must be a string, not {type(token).__name__}")
    token = token.strip()
    remember_secrets(token)  # never shown in a message
    if not token or any(ord(c) < 32 or ord(c) == 127 for c in token):
        raise ValueError(f"the Hub token ({where}) is empty or holds a control character (a line break?)")
    return token


def _token_and_source(
    storage_options: Mapping | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """(the token, where it came from) — see :func:`hub_token`."""
    environ = os.environ if environ is None else environ
    given = (storage_options or {}).get("token")
    if given is False:
        return None, "no token (storage_options['token'] is False)"
    if given is not None and given is not True:
        return _checked_token(given, "storage_options['token']"), "storage_options['token']"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if environ.get(var, "").strip():
            return _checked_token(environ[var], var), var
    path = token_file(environ)
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read()
    except OSError:
        token = ""
    if not token.strip():
        if given is True:
            raise ValueError(
                f"storage_options['token'] is True (the saved login), but there is none: run `hf auth login` "
                f"or set HF_TOKEN (looked for {path})"
            )
        return None, "no token"
    return _checked_token(token, path), f"the token file {path}"


@dataclass(frozen=True)
class HubRepo:
    """A Hub dataset folder resolved to one commit: what a :class:`~.location.Location` holds.

    Args:
        where: the parsed URL.
        endpoint: the Hub's endpoint.
        sha: the commit the revision named when the dataset was opened.
        token: a token given in ``storage_options`` (None: looked up in each process).
        use_token: False when ``storage_options["token"]`` is ``False``.
        proxy_url: ``storage_options["proxy_url"]`` (else the environment's proxy, if any).
    """

    where: HubPath
    endpoint: str
    sha: str
    token: str | None = field(default=None, repr=False)
    use_token: bool = True
    proxy_url: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        remember_secrets(self.token)  # never shown (a worker that unpickles it: Location.__setstate__)

    @property
    def folder_url(self) -> str:
        """The HTTPS folder the files are read from: the resolve endpoint at the commit. The path
        stays as written: the client percent-encodes what it requests, once."""
        base = f"{self.endpoint}/{self.where.repo_type}/{self.where.repo_id}/resolve/{self.sha}"
        return base + (f"/{self.where.path}" if self.where.path else "")

    @property
    def shown(self) -> str:
        """The URL, pinned to the commit, as messages name it."""
        return HubPath(self.where.repo_id, self.sha, self.where.path, self.where.repo_type).url

    def bearer(self) -> str | None:
        """The token this process sends (looked up here unless one was given)."""
        return self.bearer_and_source()[0]

    def bearer_and_source(self) -> tuple[str | None, str]:
        """(the token this process sends, where it came from), for messages about it."""
        if not self.use_token:
            return None, "no token (storage_options['token'] is False)"
        if self.token:
            return self.token, "storage_options['token']"
        return _token_and_source()
