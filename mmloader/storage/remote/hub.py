"""Hugging Face Hub datasets as folders: ``hf://datasets/ORG/NAME[@REVISION]/path/in/repo``.

A Hub URL is resolved once, where the dataset is opened: the revision (a branch, tag or commit,
``main`` by default) becomes the commit it names at that moment, and every later request — in
this process or in workers, which receive the resolved location — names that commit. Files of a
commit never change, so a push to the branch mid-run cannot mix two versions of the data. Within
a process, every open of one revision gets the commit its first open resolved (so two readers of
one URL never read two commits); name a commit (``@SHA``) or call :func:`forget_revisions` to
read a newer one.

The Hub's API (the revision, the file tree) is asked through ``huggingface_hub`` (its HTTP
session, headers and error kinds), each call under mmloader's deadline; files are read like any
HTTPS folder, by obstore, from the Hub's ``resolve`` endpoint at the commit (ranged reads; the
redirect to the CDN is followed without the token).

**Endpoint**: ``storage_options["endpoint"]``, else ``$HF_ENDPOINT``, else
``https://huggingface.co``. **Token**: ``storage_options["token"]`` (``False``: send none), else
``$HF_TOKEN``, else the token ``hf auth login`` saved (``$HF_TOKEN_PATH``, else
``$HF_HOME/token``). A token read from the environment or that file is read again in each
process and never travels in a pickle. **Proxy**: the environment's (``HTTPS_PROXY``...), which
``huggingface_hub`` (when its session starts) and obstore both read.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar
from urllib.parse import quote, unquote, urlsplit

from .errors import RemoteError
from .failures import unresolved_host
from .redaction import redact, remember_secrets
from .retry import Policy, _Deadline
from .servers import server_of
from .urls import check_endpoint

DEFAULT_ENDPOINT = "https://huggingface.co"
#: ``storage_options`` an ``hf://`` URL takes.
HUB_OPTION_KEYS = {"token", "endpoint", "headers", "default_headers"}
T = TypeVar("T")


class HubError(RemoteError):
    """The Hub refused to serve a repository: missing, private, gated, or no such revision.
    Its message says what to do; no retry or new client cures it (``final``)."""

    final = True


@dataclass(frozen=True)
class HubPath:
    """The parts of an ``hf://`` URL: ``repo_id`` (``ORG/NAME``), ``revision`` (as written,
    ``main`` when none is given), ``path`` (the folder inside the repository) and ``repo_type``."""

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
    """Split ``hf://datasets/ORG/NAME[@REVISION]/path``; a ValueError names what is wrong. A
    revision holding a slash is percent-encoded, as ``huggingface_hub`` writes it
    (``@refs%2Fconvert%2Fparquet``); the special refs are also taken unencoded.

    >>> parse_hub_url("hf://datasets/org/name@v1.0/data/train")
    HubPath(repo_id='org/name', revision='v1.0', path='data/train', repo_type='datasets')
    """
    rest = url.split("://", 1)[1].strip("/")
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


def token_file(environ: Mapping[str, str] | None = None) -> str:
    """Where ``hf auth login`` saves the token: ``$HF_TOKEN_PATH``, else ``$HF_HOME/token``
    (read at each call: ``huggingface_hub`` fixes it when imported)."""
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


def _token_and_source(storage_options: Mapping | None = None) -> tuple[str | None, str]:
    """(the token to send, where it came from): ``storage_options["token"]`` (``False``: none,
    ``True``: the saved login, which must exist), ``$HF_TOKEN`` (or the older
    ``$HUGGING_FACE_HUB_TOKEN``), else the file ``hf auth login`` wrote."""
    given = (storage_options or {}).get("token")
    if given is False:
        return None, "no token (storage_options['token'] is False)"
    if given is not None and given is not True:
        return _checked_token(given, "storage_options['token']"), "storage_options['token']"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return _checked_token(os.environ[var], var), var
    path = token_file()
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


def hub_token(storage_options: Mapping | None = None) -> str | None:
    """The token this process sends (see :func:`_token_and_source`)."""
    return _token_and_source(storage_options)[0]


@dataclass(frozen=True)
class HubRepo:
    """A Hub dataset folder resolved to one commit: what a :class:`~.location.Location` holds.
    ``token`` is one given in ``storage_options`` (None: looked up in each process);
    ``use_token`` is False when ``storage_options["token"]`` is ``False``."""

    where: HubPath
    endpoint: str
    sha: str
    token: str | None = field(default=None, repr=False)
    use_token: bool = True

    def __post_init__(self) -> None:
        remember_secrets(self.token)  # never shown (a worker that unpickles it too)

    @property
    def folder_url(self) -> str:
        """The HTTPS folder the files are read from: the resolve endpoint at the commit."""
        base = f"{self.endpoint}/{self.where.repo_type}/{self.where.repo_id}/resolve/{self.sha}"
        return base + (f"/{self.where.path}" if self.where.path else "")

    @property
    def shown(self) -> str:
        """The URL, pinned to the commit, as messages name it."""
        return HubPath(self.where.repo_id, self.sha, self.where.path, self.where.repo_type).url

    def bearer_and_source(self) -> tuple[str | None, str]:
        """(the token this process sends, where it came from), for messages about it."""
        if not self.use_token:
            return None, "no token (storage_options['token'] is False)"
        if self.token:
            return self.token, "storage_options['token']"
        return _token_and_source()

    def bearer(self) -> str | None:
        return self.bearer_and_source()[0]


def refusal_message(status: int, headers: Mapping[str, str], repo: HubRepo, token_source: str | None) -> str | None:
    """What to tell the user of a 401/403/404 from the Hub (None: not a refusal of the repo).

    Args:
        status: the HTTP status.
        headers: the answer's headers, names lower-case (``x-error-code``, ``x-error-message``).
        repo: the repository asked for.
        token_source: where the token sent came from; None when none was sent.
    """
    code = headers.get("x-error-code", "")
    said = headers.get("x-error-message", "")
    name = f"hf://{repo.where.repo_type}/{repo.where.repo_id}"
    page = f"{repo.endpoint}/{repo.where.repo_type}/{repo.where.repo_id}"
    how = "set HF_TOKEN or run `hf auth login` (mmloader.open also takes storage_options={'token': ...})"
    token = f"the token in use ({token_source})" if token_source else "the token in use"
    if code == "GatedRepo" or (status == 403 and "gated" in said.lower()):
        who = f"the account of {token}" if token_source else "your account, then " + how
        return f"{name} is a gated dataset: accept its conditions at {page} with {who}"
    if code == "RevisionNotFound":
        if re.fullmatch(r"[0-9a-f]{40}", repo.sha) and repo.sha != repo.where.revision:
            return (
                f"{name}: the commit {repo.sha} this dataset was opened at no longer exists (its history was "
                "rewritten): open the dataset again"
            )
        hint = " (a revision holding '/' is written %2F: @refs%2Fpr%2F1)" if "/" not in repo.where.revision else ""
        if re.fullmatch(r"[0-9a-f]{40}", repo.where.revision):
            hint += (
                "; if a local index (mmloader index ... -o DIR) was built at this commit, the history was "
                "rewritten since: build the index again"
            )
        return f"{name} has no revision {repo.where.revision!r} (a branch, tag or commit): check it at {page}{hint}"
    if status == 401 and token_source and "credential" in said.lower():
        return f"{name}: the Hub refused {token} ({said}): run `hf auth login` again, or unset it"
    if code in ("RepoNotFound", "RepositoryNotFound") or status == 401:
        if token_source:
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


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (seconds or an HTTP date), or None."""
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


class _Throttled(OSError):
    """A 429 or 5xx of the Hub's API: its status and the wait it asked for, nothing of the answer."""

    def __init__(self, status: int, wait: float | None):
        super().__init__(f"HTTP status {status}")
        self.status, self.retry_after = status, wait


def hub_call(repo: HubRepo, policy: Policy, what: str, call: Callable[[Any, float], T]) -> T:
    """``call(api, timeout)`` with a ``huggingface_hub.HfApi`` for ``repo``, retried under
    ``policy``: 429 and 5xx wait at least the server's ``Retry-After``, connection failures back
    off (a Hub never heard from: ``first_contact_deadline``); a refusal is :class:`HubError` at
    once naming what to do, a missing path :class:`FileNotFoundError`."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise RemoteError(f"{repo.where.url}: hf:// URLs need huggingface_hub: pip install 'mmloader[hub]'") from None

    token, source = repo.bearer_and_source()
    api = HfApi(endpoint=repo.endpoint, token=token or False, library_name="mmloader")
    deadline = _Deadline(policy, repo.where.url, what, server_of(repo.endpoint))
    while True:
        failure: BaseException
        try:
            result = call(api, policy.request_timeout)
        except HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else None
            headers = {k.lower(): v for k, v in (e.response.headers.items() if e.response is not None else ())}
            refusal = (
                refusal_message(status, headers, repo, source if token else None) if status in (401, 403, 404) else None
            )
            if refusal:
                raise HubError(redact(refusal)) from None
            if status == 407:
                raise RemoteError(
                    f"{repo.where.url}: {what} failed: the proxy asks for credentials or refused them (HTTP 407): "
                    "put the user name and password in the proxy's URL (HTTPS_PROXY, HTTP_PROXY)"
                ) from None
            if status == 404:
                raise FileNotFoundError(f"{repo.shown}: no such file or folder ({what})") from None
            if status is None or not (status == 429 or status >= 500):
                raise HubError(redact(f"{repo.where.url}: {what} failed: HTTP {status} from {repo.endpoint}")) from None
            failure = _Throttled(status, retry_after(headers))
        except Exception as e:
            host = unresolved_host(e, repo.endpoint)
            if host is not None:  # a typo in the endpoint: no wait cures it
                raise HubError(
                    f"{repo.where.url}: the Hub's host name {host!r} does not resolve: check HF_ENDPOINT or "
                    f"storage_options['endpoint'] ({repo.endpoint})"
                ) from None
            failure = e
        else:
            deadline.answered()
            return result
        # Outside the except blocks, so that what the deadline raises carries no context.
        time.sleep(deadline.next_delay(failure, None))


def list_files(repo: HubRepo, prefix: str, policy: Policy) -> list[tuple[str, int]]:
    """(name relative to ``repo``'s folder, size) of every file under ``prefix``, from the tree
    API, listed as object stores list: every name starting with ``prefix``."""
    prefix = prefix.lstrip("/")
    folder = "/".join(p for p in (repo.where.path, prefix.rpartition("/")[0]) if p)
    cut = len(repo.where.path) + 1 if repo.where.path else 0

    url = f"{repo.endpoint}/api/datasets/{repo.where.repo_id}/tree/{repo.sha}" + (f"/{quote(folder)}" if folder else "")

    def tree(api, timeout):
        # the tree API page by page (its Link header), each request under the policy's timeout:
        # HfApi.list_repo_tree takes none and its session's default is none
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=api.token, library_name="mmloader")
        found, next_url, params = [], url, {"recursive": "true"}
        while next_url:
            answer = get_session().get(next_url, params=params, headers=headers, timeout=timeout)
            hf_raise_for_status(answer)
            found += [
                (e["path"], int((e.get("lfs") or {}).get("size", e.get("size", 0))))
                for e in answer.json()
                if e.get("type") == "file"
            ]
            next_url, params = answer.links.get("next", {}).get("url"), None
        return found

    try:
        files = hub_call(repo, policy, "list files", tree)
    except FileNotFoundError:
        return []  # no such folder: nothing under the prefix
    return sorted((path[cut:], size) for path, size in files if path[cut:].startswith(prefix))


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
    """Resolve ``url``'s revision to its commit (one API call, the first time this process opens
    that revision: later opens get the same commit). Returns the resolved repository and the
    remaining ``storage_options`` (``token`` and ``endpoint`` taken out: the files' client's)."""
    where = parse_hub_url(url)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise HubError(
            f"{where.url}: HF_HUB_OFFLINE is set, and mmloader reads Hub datasets over the network: unset it, "
            f"or download the dataset (`hf download {where.repo_id} --repo-type dataset --local-dir DIR`) and "
            "open the folder"
        )
    opts = dict(storage_options)
    given = opts.pop("token", None)
    given_endpoint = opts.pop("endpoint", None)
    endpoint = str(given_endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    where_given = "storage_options['endpoint']" if given_endpoint else "HF_ENDPOINT"
    if not urlsplit(endpoint).scheme.startswith("http") or not urlsplit(endpoint).netloc:
        raise ValueError(f"{where.url}: the Hub endpoint {endpoint!r} ({where_given}) is not an http(s):// URL")
    check_endpoint(endpoint, where_given)
    if given is True:  # the saved login: it must exist, and each process reads it itself
        _token_and_source({"token": True})
        given = None
    elif given is not None and given is not False:
        given = _checked_token(given, "storage_options['token']")
    headers = {**(opts.get("headers") or {}), **(opts.get("default_headers") or {})}
    if any(str(k).lower() == "authorization" for k in headers):
        raise ValueError(
            f"{where.url}: give the Hub token as storage_options['token'] (or HF_TOKEN), not as an Authorization "
            "header: the Hub's API calls send the token too"
        )
    probe = HubRepo(where, endpoint, where.revision, token=given or None, use_token=given is not False)
    memo = (endpoint, where.repo_type, where.repo_id, where.revision)
    with _RESOLVED_LOCK:
        sha = _RESOLVED.get(memo)
    if sha is None:
        info = hub_call(
            probe,
            policy,
            "resolve the revision",
            lambda api, timeout: api.repo_info(
                where.repo_id, repo_type="dataset", revision=where.revision, timeout=timeout
            ),
        )
        sha = getattr(info, "sha", None)
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise HubError(f"{where.url}: the Hub's revision API gave no commit for {where.revision!r} ({endpoint})")
        with _RESOLVED_LOCK:
            sha = _RESOLVED.setdefault(memo, sha)
    return HubRepo(where, endpoint, sha, token=probe.token, use_token=probe.use_token), opts


def check_repo(repo: HubRepo, policy: Policy, refused: bool) -> None:
    """Say what is wrong with ``repo`` after a file read failed (the files' client sees a bare
    status): a :class:`HubError` where the repository is gone, no longer readable, its commit
    rewritten away, or gated and the read ``refused``; nothing where the API finds no fault."""
    info = hub_call(
        repo,
        policy,
        "check the repository",
        lambda api, timeout: api.repo_info(repo.where.repo_id, repo_type="dataset", revision=repo.sha, timeout=timeout),
    )
    if refused and getattr(info, "gated", False):
        token, source = repo.bearer_and_source()
        said = refusal_message(403, {"x-error-code": "GatedRepo"}, repo, source if token else None)
        raise HubError(redact(str(said)))
