"""The Hub's JSON API (revision, tree) over urllib: one GET retried under the policy, refusals
said as what to do (:class:`HubError`, :func:`refusal_message`), the token never sent to another
host. Apart from :mod:`.hub`, which says what to ask, since this is how any Hub answer is read."""

from __future__ import annotations

import functools
import http.client
import json
import re
import time
import urllib.error
import urllib.request
from typing import Mapping
from urllib.parse import urlsplit

from .errors import RemoteError, RemoteUnavailableError, _HTTPStatus
from .failures import unresolved_host
from .hub_repo import HubRepo
from .proxy import ProxyRefused, TimedHTTPConnection, TimedHTTPSConnection, proxy_for, tunnel_failure
from .proxy import refusal as proxy_refusal
from .redaction import redact
from .retry import Policy, _Deadline
from .servers import server_of


class HubError(RemoteError):
    """The Hub refused to serve a repository: missing, private, gated, or no such revision.
    Its message says what to do; no retry or new client cures it (``final``)."""

    final = True


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
