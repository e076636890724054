"""Hugging Face Hub datasets as folders: ``hf://datasets/ORG/NAME[@REVISION]/path/in/repo``.

A Hub URL is resolved once, where the dataset is opened: the revision (a branch, tag or commit,
``main`` by default) becomes the commit it names at that moment (the Hub's revision API), and
every later request — in this process or in workers, which receive the resolved location —
names that commit. Files of a commit never change, so a push to the branch mid-run cannot mix
two versions of the data. Within a process, every open of one revision gets the commit its first
open resolved (so two readers of one URL never read two commits); name a commit
(``@SHA``) or call :func:`forget_revisions` to read a newer one. Files are read through the
Hub's ``resolve`` endpoint with HTTP
``Range`` (the redirect to the Hub's CDN is followed, without the token); listings come from its
tree API. These are the endpoints ``huggingface_hub`` calls.

**Endpoint**: ``storage_options["endpoint"]``, else ``$HF_ENDPOINT`` (mirrors, tests), else
``https://huggingface.co``. **Token**: ``storage_options["token"]`` (``False``: send none), else
``$HF_TOKEN``, else the token ``hf auth login`` saved (``$HF_TOKEN_PATH``, else
``$HF_HOME/token``, default ``~/.cache/huggingface/token``). A token read from the environment
or that file is read again in each process and never travels in a pickle.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, unquote, urlsplit

from .errors import RemoteError, RemoteUnavailableError, _HTTPStatus
from .proxy import ProxyRefused, TimedHTTPConnection, TimedHTTPSConnection, proxy_for, tunnel_failure
from .proxy import refusal as proxy_refusal
from .redaction import redact, remember_secrets
from .retry import Policy, _Deadline, server_of, unresolved_host
from .urls import check_endpoint

DEFAULT_ENDPOINT = "https://huggingface.co"
#: ``storage_options`` an ``hf://`` URL takes (its requests go through the standard library's
#: client, which reads no other client setting).
HUB_OPTION_KEYS = {"token", "endpoint", "headers", "default_headers", "proxy_url"}


class HubError(RemoteError):
    """The Hub refused to serve a repository: missing, private, gated, or no such revision.
    Its message says what to do; no retry or new client cures it (``final``)."""

    final = True


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

    def list(self, prefix: str, policy: Policy) -> list[tuple[str, int]]:
        """(name relative to the folder, size) of every file under ``prefix``, from the tree API
        (paginated by its ``Link`` header)."""
        # As object stores list: every name starting with prefix, so the folder above it is listed
        # ("data-00" lists the folder and keeps data-00*; "index.json" finds the file)
        prefix = prefix.lstrip("/")
        folder = "/".join(p for p in (self.where.path, prefix.rpartition("/")[0]) if p)
        url = (
            f"{self.endpoint}/api/{self.where.repo_type}/{self.where.repo_id}/tree/{self.sha}"
            + (f"/{quote(folder)}" if folder else "")
            + "?recursive=true"
        )
        cut = len(self.where.path) + 1 if self.where.path else 0
        out: list[tuple[str, int]] = []
        next_url: str | None = url
        while next_url:
            try:
                entries, headers = hub_api(next_url, self, policy, "list files")
            except FileNotFoundError:
                return []  # no such folder: nothing under the prefix
            for entry in entries:
                if entry.get("type") == "file":
                    size = (entry.get("lfs") or {}).get("size", entry.get("size", 0))
                    name = entry["path"][cut:]
                    if name.startswith(prefix):
                        out.append((name, int(size)))
            next_url = _next_link(headers.get("link", ""))
        return sorted(out)


#: (endpoint, repo type, repo, revision) -> the commit this process resolved it to first
_RESOLVED: dict[tuple[str, str, str, str], str] = {}
_RESOLVED_LOCK = threading.Lock()


def forget_revisions() -> None:
    """Forget the commits this process resolved revisions to: the next open of ``main`` (or any
    branch or tag) asks the Hub again and may read a newer commit. Datasets already open keep
    theirs."""
    with _RESOLVED_LOCK:
        _RESOLVED.clear()


def open_hub(url: str, storage_options: dict, policy: Policy) -> tuple[HubRepo, dict]:
    """Resolve ``url``'s revision to its commit (one request to the revision API, the first time
    this process opens that revision: later opens get the same commit).

    Args:
        url: ``hf://datasets/ORG/NAME[@REVISION]/path``.
        storage_options: the location's options; ``token`` and ``endpoint`` are taken out.
        policy: the retry policy of the requests.

    Returns:
        The resolved repository and the remaining ``storage_options`` (the HTTP client's).
    """
    where = parse_hub_url(url)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise HubError(
            f"{where.url}: HF_HUB_OFFLINE is set, and mmloader reads Hub datasets over the network: unset it, "
            f"or download the dataset (`hf download {where.repo_id} --repo-type dataset --local-dir DIR`) and "
            "open the folder"
        )
    opts = dict(storage_options)
    given = opts.pop("token", None)
    endpoint = hub_endpoint({"endpoint": opts.pop("endpoint", None)})
    where_given = "storage_options['endpoint']" if storage_options.get("endpoint") else "HF_ENDPOINT"
    if not urlsplit(endpoint).scheme.startswith("http") or not urlsplit(endpoint).netloc:
        raise ValueError(f"{where.url}: the Hub endpoint {endpoint!r} ({where_given}) is not an http(s):// URL")
    check_endpoint(endpoint, where_given)
    if given is not None and given is not False and given is not True:
        given = _checked_token(given, "storage_options['token']")
    elif given is True:  # the saved login: it must exist, and each process reads it itself
        _token_and_source({"token": True})
        given = None
    headers = {**(opts.get("headers") or {}), **(opts.get("default_headers") or {})}
    if any(str(k).lower() == "authorization" for k in headers):
        raise ValueError(
            f"{where.url}: give the Hub token as storage_options['token'] (or HF_TOKEN), not as an Authorization "
            "header: the Hub's API calls send the token too"
        )
    proxy_url = opts.get("proxy_url")  # kept in opts too: the files' client goes through it
    probe = HubRepo(
        where, endpoint, where.revision, token=given or None, use_token=given is not False, proxy_url=proxy_url
    )
    memo = (endpoint, where.repo_type, where.repo_id, where.revision)
    with _RESOLVED_LOCK:
        sha = _RESOLVED.get(memo)
    if sha is None:
        info, _headers = hub_api(
            f"{endpoint}/api/{where.repo_type}/{where.repo_id}/revision/{quote(where.revision, safe='')}",
            probe,
            policy,
            "resolve the revision",
        )
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise HubError(f"{where.url}: the Hub's revision API gave no commit for {where.revision!r} ({endpoint})")
        with _RESOLVED_LOCK:
            sha = _RESOLVED.setdefault(memo, sha)
    return HubRepo(where, endpoint, sha, token=probe.token, use_token=probe.use_token, proxy_url=proxy_url), opts


def _next_link(header: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header (the Hub's pagination), or None."""
    for part in header.split(","):
        if 'rel="next"' in part and "<" in part:
            return part[part.index("<") + 1 : part.index(">")]
    return None


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (seconds or an HTTP date), or None.

    Args:
        headers: the answer's headers, names lower-case.
    """
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None


def refusal_message(
    status: int, headers: Mapping[str, str], repo: HubRepo, token_sent: bool, token_source: str = ""
) -> str | None:
    """What to tell the user of a 401/403/404 from the Hub (None: not a refusal of the repo).

    Args:
        status: the HTTP status.
        headers: the answer's headers, names lower-case (``x-error-code``, ``x-error-message``).
        repo: the repository asked for.
        token_sent: whether the request carried a token.
        token_source: where that token came from (``HF_TOKEN``, the token file, ...).
    """
    code = headers.get("x-error-code", "")
    said = headers.get("x-error-message", "")
    name = f"hf://{repo.where.repo_type}/{repo.where.repo_id}"
    page = f"{repo.endpoint}/{repo.where.repo_type}/{repo.where.repo_id}"
    how = "set HF_TOKEN or run `hf auth login` (mmloader.open also takes storage_options={'token': ...})"
    token = f"the token in use ({token_source})" if token_source else "the token in use"
    if code == "GatedRepo" or (status == 403 and "gated" in said.lower()):
        who = f"the account of {token}" if token_sent else "your account, then " + how
        return f"{name} is a gated dataset: accept its conditions at {page} with {who}"
    if code == "RevisionNotFound":
        if re.fullmatch(r"[0-9a-f]{40}", repo.sha) and repo.sha != repo.where.revision:
            return (
                f"{name}: the commit {repo.sha} this dataset was opened at no longer exists (its history was "
                "rewritten): open the dataset again"
            )
        hint = " (a revision holding '/' is written %2F: @refs%2Fpr%2F1)" if "/" not in repo.where.revision else ""
        if re.fullmatch(r"[0-9a-f]{40}", repo.where.revision):  # a commit named: one a local index was built at?
            hint += (
                "; if a local index (mmloader index ... -o DIR) was built at this commit, the history was "
                "rewritten since: build the index again"
            )
        return f"{name} has no revision {repo.where.revision!r} (a branch, tag or commit): check it at {page}{hint}"
    if status == 401 and token_sent and "credential" in said.lower():
        return f"{name}: the Hub refused {token} ({said}): run `hf auth login` again, or unset it"
    if code in ("RepoNotFound", "RepositoryNotFound") or status == 401:
        if token_sent:
            return (
                f"{name}: no such dataset repository on {repo.endpoint}, or {token} cannot read it "
                f"(a private repository of another account): check the name at {page}"
            )
        return (
            f"{name}: no such dataset repository on {repo.endpoint}, or it is private: check the name, and "
            f"for a private dataset {how}"
        )
    if status == 403:
        return f"{name}: the Hub refused access (HTTP 403{': ' + said if said else ''}); {how} with a token that may read it"
    return None  # a 404 without a code (a mirror, a proxy) or EntryNotFound: the file is missing


class _DropTokenOnOtherHost(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never carry the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            for name in list(new.headers):
                if name.lower() == "authorization":
                    del new.headers[name]
            new.unredirected_hdrs.pop("Authorization", None)
        if new is not None:  # a proxy's credentials go only where _ProxiedAsChosen sends them
            for name in list(new.headers):
                if name.lower() == "proxy-authorization":
                    del new.headers[name]
        return new


class _ProxiedAsChosen(urllib.request.BaseHandler):
    """Sends each request, a redirect's too, through the proxy :func:`~.proxy.proxy_for`
    chooses for its host: the API calls follow the files' rules (urllib's own handler reads
    ``NO_PROXY`` even over ``proxy_url``)."""

    handler_order = 100  # before the request is built, as urllib's ProxyHandler

    def __init__(self, proxy_url: str | None):
        self.proxy_url = proxy_url

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:  # noqa: D102 (urllib's hook)
        proxy = proxy_for(req.type == "https", req.host, self.proxy_url)
        if proxy is not None:
            req.set_proxy(proxy.address, "http")
            if proxy.authorization:  # not copied to a redirect's request (unredirected)
                req.add_unredirected_header("Proxy-Authorization", proxy.authorization)
        return req

    https_request = http_request


class _TimedHTTPHandler(urllib.request.HTTPHandler):
    """urllib's ``http://`` handler, its connect bounded by ``connect_timeout`` (the request's
    timeout bounds each read), as the files' client connects."""

    def __init__(self, connect_timeout: float):
        super().__init__()
        self.connect_timeout = connect_timeout

    def http_open(self, req):  # noqa: D102 (urllib's hook)
        return self.do_open(functools.partial(TimedHTTPConnection, connect_timeout=self.connect_timeout), req)


class _TimedHTTPSHandler(urllib.request.HTTPSHandler):
    """urllib's ``https://`` handler, its connect bounded by ``connect_timeout``."""

    def __init__(self, connect_timeout: float):
        super().__init__()
        self.connect_timeout = connect_timeout

    def https_open(self, req):  # noqa: D102 (urllib's hook)
        connect = functools.partial(TimedHTTPSConnection, connect_timeout=self.connect_timeout)
        return self.do_open(connect, req, context=self._context)


#: the largest API answer read (a tree listing page is far smaller)
MAX_API_BYTES = 256 << 20


def hub_api(url: str, repo: HubRepo, policy: Policy, what: str):
    """GET a Hub API ``url`` -> (parsed JSON, headers), retried under ``policy``: 429 and 503
    wait the server's ``Retry-After`` (at least the backoff), 5xx (not 501/505) and connection
    errors back off,
    the whole call ends within ``retry_deadline`` (a body that trickles in included); refusals
    are :class:`HubError` at once, a missing path :class:`FileNotFoundError`.

    Args:
        url: the API URL.
        repo: the repository (for its token and the messages).
        policy: the retry policy.
        what: what the request does, for messages.
    """
    token, source = repo.bearer_and_source()
    headers = {"Accept": "application/json", "User-Agent": "mmloader"}
    if token and urlsplit(url).netloc == urlsplit(repo.endpoint).netloc:  # a Link elsewhere: no token
        headers["Authorization"] = f"Bearer {token}"
    parts = urlsplit(url)
    proxy = proxy_for(parts.scheme == "https", parts.netloc, repo.proxy_url)  # for messages
    # ProxyHandler({}): none of urllib's proxy rules, only mmloader's (_ProxiedAsChosen)
    opener = urllib.request.build_opener(
        _DropTokenOnOtherHost,
        urllib.request.ProxyHandler({}),
        _ProxiedAsChosen(repo.proxy_url),
        _TimedHTTPHandler(policy.connect_timeout),
        _TimedHTTPSHandler(policy.connect_timeout),
    )
    deadline = _Deadline(policy, repo.where.url, what, server_of(url, repo.proxy_url))
    # A body that trickles in is cut off too: one request may not outlast the deadline.
    body_deadline = deadline.start + policy.retry_deadline + policy.request_timeout
    while True:
        failure: BaseException
        try:
            req = urllib.request.Request(url, headers=headers)
            with opener.open(req, timeout=policy.request_timeout) as resp:
                chunks, size = [], 0
                while chunk := resp.read1(1 << 16):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_API_BYTES or time.monotonic() > body_deadline:
                        raise RemoteUnavailableError(
                            f"{repo.where.url}: {what}: the answer from {repo.endpoint} came too slowly or was too "
                            f"large ({size:,} bytes after {time.monotonic() - deadline.start:.0f} s)"
                        )
                answer = {k.lower(): v for k, v in resp.headers.items()}
            deadline.answered()
            return json.loads(b"".join(chunks)), answer
        except urllib.error.HTTPError as e:
            deadline.answered()  # an error status is an answer: the host is there
            got = {k.lower(): v for k, v in (e.headers or {}).items()}
            status = e.code
            e.close()
            refusal = (
                refusal_message(status, got, repo, "Authorization" in headers, source)
                if status in (401, 403, 404)
                else None
            )
            if refusal:
                raise HubError(redact(refusal)) from None
            if status == 404:
                raise FileNotFoundError(f"{repo.shown}: no such file or folder ({what})") from None
            refused = proxy_refusal(status, proxy, repo.where.url)
            if refused is not None:
                raise refused from None
            if not (status == 429 or status >= 500):
                raise HubError(redact(f"{repo.where.url}: {what} failed: HTTP {status} from {repo.endpoint}")) from None
            # Only the status and the server's wait travel on: the error itself holds the answer.
            failure = _HTTPStatus(status, url, retry_after=retry_after(got) if status in (429, 503) else None)
        except json.JSONDecodeError:
            raise HubError(f"{repo.where.url}: {what}: {repo.endpoint} did not answer with JSON") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            tunnel = tunnel_failure(reason if isinstance(reason, BaseException) else e, proxy, repo.where.url)
            if isinstance(tunnel, ProxyRefused):
                raise tunnel from None
            host = unresolved_host(reason if isinstance(reason, BaseException) else e, url)
            if host is not None and proxy is not None:  # the name looked up was the proxy's
                raise HubError(
                    f"{repo.where.url}: the proxy's host name does not resolve: check {proxy.shown}"
                ) from None
            if host is not None:  # a typo in the endpoint: no wait cures it
                raise HubError(
                    f"{repo.where.url}: the Hub's host name {host!r} does not resolve: check HF_ENDPOINT or "
                    f"storage_options['endpoint'] ({repo.endpoint})"
                ) from None
            if isinstance(e, ValueError) and not isinstance(e, urllib.error.URLError):
                raise ValueError(redact(f"{repo.where.url}: {what}: {e}")) from None
            failure = tunnel or e
        # Outside the except blocks, so that what the deadline raises carries no context.
        time.sleep(deadline.next_delay(failure, None))
