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

This module opens a Hub folder (the revision resolved, the files listed); :mod:`.hub_repo` holds
what names it (URL, endpoint, token, :class:`~.hub_repo.HubRepo`), :mod:`.hub_api` the requests.
"""

from __future__ import annotations

import os
import re
import threading
from urllib.parse import quote, urlsplit

from .hub_api import HubError, hub_api
from .hub_repo import HubRepo, _checked_token, _token_and_source, hub_endpoint, parse_hub_url
from .retry import Policy
from .urls import check_endpoint

#: ``storage_options`` an ``hf://`` URL takes (its requests go through the standard library's
#: client, which reads no other client setting).
HUB_OPTION_KEYS = {"token", "endpoint", "headers", "default_headers", "proxy_url"}


def list_files(repo: HubRepo, prefix: str, policy: Policy) -> list[tuple[str, int]]:
    """(name relative to ``repo``'s folder, size) of every file under ``prefix``, from the tree API
    (paginated by its ``Link`` header)."""
    # As object stores list: every name starting with prefix, so the folder above it is listed
    # ("data-00" lists the folder and keeps data-00*; "index.json" finds the file)
    prefix = prefix.lstrip("/")
    folder = "/".join(p for p in (repo.where.path, prefix.rpartition("/")[0]) if p)
    url = (
        f"{repo.endpoint}/api/{repo.where.repo_type}/{repo.where.repo_id}/tree/{repo.sha}"
        + (f"/{quote(folder)}" if folder else "")
        + "?recursive=true"
    )
    cut = len(repo.where.path) + 1 if repo.where.path else 0
    out: list[tuple[str, int]] = []
    next_url: str | None = url
    while next_url:
        try:
            entries, headers = hub_api(next_url, repo, policy, "list files")
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


def _next_link(header: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header (the Hub's pagination), or None."""
    for part in header.split(","):
        if 'rel="next"' in part and "<" in part:
            return part[part.index("<") + 1 : part.index(">")]
    return None


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
