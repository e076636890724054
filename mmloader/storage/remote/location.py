"""Object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``): URLs, clients, retries.

One :class:`Location` per dataset URL: it pickles as ``(url, storage_options, policy)`` — never
a client, never credentials from the environment — and builds its client lazily, in the
process that makes the request.

**Clients.** Requests go through `obstore <https://developmentseed.org/obstore>`_ (Rust:
S3/GCS/Azure/HTTP in one package, requests run without the GIL; measured at a fraction of s3fs's
CPU per ranged GET: README "Dependencies"). obstore's runtime does not survive ``fork()``: a
child forked from a process that has used it hangs on its first request. So a process records
that it started obstore, and a process forked from one that did reads through the standard
library's HTTP client instead (:class:`_SimpleClient`: plain HTTP, or S3 signed with SigV4 from
static credentials; fsspec where that does not apply) — never a hang. The few small reads of
opening a dataset (manifest, offset indexes) also go through the standard library's client
while this process has not started obstore itself: it starts in milliseconds, and DataLoader
workers forked after opening a dataset still get obstore for the data.

**Credentials** come from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_NAME``, ...) or ``storage_options``, and are re-resolved: a client is
rebuilt when those variables change and after an authentication error, and the clients refresh
temporary credentials themselves.

**Retries.** Timeouts, connection errors and resets, 5xx, 408/429/503 and short bodies are
retried with exponential backoff and full jitter until ``retry_deadline`` seconds have passed
without success; then :class:`RemoteUnavailableError` names the URL and the last error. A
missing object is :class:`FileNotFoundError` at once, other 4xx answers are not retried; a
missing bucket, an invalid bucket name or refused access is a :class:`RemoteError` at once that
names what the server said (``no such bucket 'b' (the server says NoSuchBucket: ...)``).
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..errors import MMLoaderError

log = logging.getLogger("mmloader")

SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az",
           "abfss": "az", "http": "http", "https": "http"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")

#: Environment variables whose change means "build the client again" (rotated credentials).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                  "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
                  "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                  "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING")


class RemoteError(MMLoaderError):
    """A request to object storage failed for good (not retried, or out of retries)."""


class RemoteUnavailableError(RemoteError):
    """Object storage did not answer successfully within the retry deadline."""


class ObjectChangedError(RemoteError):
    """An object is no longer the version this dataset was opened with (replaced or rewritten):
    reading on would mix two versions of the data, so it is never retried or skipped."""


class LongBody(OSError):
    """A response had more bytes than asked for: the server does not honour the request."""


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
        raise ValueError(f"{url}: percent-escapes are not supported in {scheme}:// dataset URLs; write the key as "
                         "it is (spaces and other characters are fine)")


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


# -- retry policy --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """How requests behave: ``retry_deadline`` (s) bounds how long a failing request is retried
    (a server that is gone pauses the reader that long, then the error names the URL);
    ``request_timeout`` (s) bounds one request; ``max_in_flight`` requests run at once per
    process; backoff doubles from ``backoff`` up to ``max_backoff`` with full jitter."""
    retry_deadline: float = 120.0
    request_timeout: float = 30.0
    connect_timeout: float = 5.0
    max_in_flight: int = 64
    backoff: float = 0.1
    max_backoff: float = 5.0

    @classmethod
    def from_env(cls, **overrides: Any) -> "Policy":
        env = {"retry_deadline": "MMLOADER_RETRY_DEADLINE", "request_timeout": "MMLOADER_REQUEST_TIMEOUT"}
        values = {}
        for name, var in env.items():
            if os.environ.get(var):
                values[name] = float(os.environ[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def __post_init__(self) -> None:
        for name, low, strict in (("retry_deadline", 0, False), ("request_timeout", 0, True),
                                  ("connect_timeout", 0, True), ("backoff", 0, False), ("max_backoff", 0, False)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < low or (strict and value == low) or value != value:
                raise ValueError(f"{name}={value!r}: expected a number of seconds {'>' if strict else '>='} {low}")
        if not isinstance(self.max_in_flight, int) or isinstance(self.max_in_flight, bool) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight!r}: expected an integer >= 1")

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** attempt))


_STATUS = re.compile(r"status(?: code)?:? *(\d{3})", re.I)


def _status(e: BaseException) -> int | None:
    for attr in ("status", "status_code", "code"):
        v = getattr(e, attr, None)
        if isinstance(v, int) and 100 <= v < 600:
            return v
    m = _STATUS.search(str(e))
    return int(m.group(1)) if m else None


def transient(e: BaseException) -> bool:
    """Whether a failed request may succeed when repeated: timeouts, connection errors and
    resets, short bodies, 5xx and 408/429; not a missing object, a refused permission or
    another 4xx."""
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError, ObjectChangedError, LongBody,
                      ValueError)):
        return False
    if isinstance(e, ShortBody):
        return True
    if type(e).__module__.startswith("obstore") and type(e).__name__ in _OBSTORE_PERMANENT:
        return False
    status = _status(e)
    if status is not None:
        return (status >= 500 and status not in (501, 505)) or status in (408, 429)
    if isinstance(e, PermissionError):
        return False
    return isinstance(e, (OSError, asyncio.TimeoutError, TimeoutError, ConnectionError, EOFError)) \
        or type(e).__module__.startswith(("obstore", "aiohttp", "botocore", "aiobotocore", "urllib3", "http"))


#: obstore errors that repeating the request cannot cure (a server without Range support, a
#: failed precondition, a bad path or configuration, refused credentials).
_OBSTORE_PERMANENT = {"NotSupportedError", "PreconditionError", "NotModifiedError", "InvalidPathError",
                      "AlreadyExistsError", "UnknownConfigurationKeyError", "PermissionDeniedError",
                      "UnauthenticatedError", "JoinError"}


#: S3 error codes (the ``<Code>`` of an error answer) that no retry can cure, as said to a user.
S3_REFUSALS = {"NoSuchBucket": "no such bucket", "InvalidBucketName": "invalid bucket name",
               "AccessDenied": "access denied", "AllAccessDisabled": "access denied (all access disabled)",
               "InvalidAccessKeyId": "access denied (the access key ID is unknown to the server)",
               "SignatureDoesNotMatch": "access denied (the secret key does not match the access key ID)",
               "AccountProblem": "access denied (a problem with the account)",
               "PermanentRedirect": "the bucket is at another endpoint or in another region",
               "AuthorizationHeaderMalformed": "the request's region does not match the bucket's"}
_S3_CODE = re.compile(r"<Code>\s*(\w+)\s*</Code>|An error occurred \((\w+)\)")


def server_refusal(e: BaseException) -> str | None:
    """What an S3 error answer inside ``e`` says, when it is one of :data:`S3_REFUSALS`:
    ``"no such bucket 'b' (NoSuchBucket: The specified bucket does not exist)"``; else None.
    Read from the answer's XML (obstore and the plain-HTTP client keep it in the error's text)
    or from botocore's parsed ``response``."""
    text = str(e) + "\n" + bytes(getattr(e, "body", b"") or b"").decode("utf-8", "replace")
    response = getattr(e, "response", None)
    code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
    if not code:
        m = _S3_CODE.search(text)
        code = (m.group(1) or m.group(2)) if m else None
    if code not in S3_REFUSALS:
        return None
    what = S3_REFUSALS[code]
    bucket = re.search(r"<BucketName>([^<]*)</BucketName>", text)
    if bucket:
        what += f" {bucket.group(1)!r}"
    message = re.search(r"<Message>([^<]*)</Message>", text)
    if message is None and isinstance(response, dict):
        detail = (response.get("Error") or {}).get("Message")
    else:
        detail = message.group(1) if message else None
    return f"{what} (the server says {code}" + (f": {detail.strip()})" if detail else ")")


def _auth_error(e: BaseException) -> bool:
    return isinstance(e, PermissionError) or _status(e) in (401, 403)


class ShortBody(OSError):
    """A response had fewer bytes than asked for (a body cut short in transit)."""


def short_message(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first[:300]}"


class _Deadline:
    """Retry bookkeeping for one request: backoff, a deadline, one rebuild after an auth error."""

    def __init__(self, policy: Policy, url: str, what: str):
        self.policy, self.url, self.what = policy, url, what
        self.start = time.monotonic()
        self.attempt = 0
        self.rebuilt = False

    def next_delay(self, e: BaseException, location: "Location") -> float:
        """Seconds to wait before trying again, or raise the error for good."""
        if _auth_error(e) and not self.rebuilt:
            self.rebuilt = True
            location.rebuild()  # credentials may have rotated: resolve them again
            return 0.0
        refusal = server_refusal(e)
        if refusal is not None:  # a missing bucket is not a missing object, and no retry cures it
            raise RemoteError(f"{self.url}: {self.what} failed: {refusal}") from None
        if isinstance(e, FileNotFoundError):
            raise FileNotFoundError(f"{self.url}: no such object") from None
        if isinstance(e, ObjectChangedError):
            raise e
        if type(e).__name__ == "PreconditionError" or _status(e) == 412:
            raise ObjectChangedError(f"{self.url}: the object changed since this dataset was opened (its ETag "
                                     "no longer matches); reading on would mix two versions of the data: open "
                                     "the dataset again") from None
        if _status(e) == 416:
            raise ObjectChangedError(f"{self.url}: {self.what}: the range lies beyond the object's end (HTTP 416): "
                                     "it was truncated or replaced since it was indexed") from None
        if type(e).__name__ == "NotSupportedError" and "range" in str(e).lower():
            raise RemoteError(f"{self.url}: the server does not support ranged reads (HTTP Range), which "
                              "reading samples in place needs") from e
        if not transient(e):
            raise RemoteError(f"{self.url}: {self.what} failed: {short_message(e)}") from e
        elapsed = time.monotonic() - self.start
        if elapsed >= self.policy.retry_deadline:
            raise RemoteUnavailableError(
                f"{self.url}: {self.what} kept failing for {elapsed:.0f} s ({self.attempt + 1} attempts; "
                f"retry_deadline={self.policy.retry_deadline:g} s); last error: {short_message(e)}") from e
        if self.attempt == 0 or self.attempt % 10 == 0:
            log.warning("%s: %s failed (%s); retrying for up to %.0f s more", self.url, self.what,
                        short_message(e), self.policy.retry_deadline - elapsed)
        delay = min(self.policy.delay(self.attempt), max(self.policy.retry_deadline - elapsed, 0.0))
        self.attempt += 1
        return delay


# -- which client a process may use --------------------------------------------------------------
_OBSTORE_PID: int | None = None  # the process that started obstore's runtime (inherited by fork)
_OBSTORE_LOCK = threading.Lock()


def obstore_usable() -> bool:
    """obstore works in this process: installed, not disabled (``MMLOADER_REMOTE_CLIENT=fsspec``),
    and its runtime was not started by a process this one was forked from."""
    if os.environ.get("MMLOADER_REMOTE_CLIENT", "").lower() == "fsspec":
        return False
    if _OBSTORE_PID not in (None, os.getpid()):
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def obstore_started_here() -> bool:
    return _OBSTORE_PID == os.getpid()


def _mark_obstore() -> None:
    global _OBSTORE_PID
    if _OBSTORE_PID != os.getpid():
        with _OBSTORE_LOCK:
            _OBSTORE_PID = os.getpid()


def fsspec_usable() -> bool:
    try:
        import fsspec  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("MMLOADER_REMOTE_CLIENT", "").lower() != "obstore"


# An event loop thread per process for obstore's async API: many requests in flight from any
# thread, the GIL released while they run.
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    hit = _LOOP
    if hit is None or hit[0] != os.getpid():
        with _LOOP_LOCK:
            hit = _LOOP
            if hit is None or hit[0] != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mmloader-remote", daemon=True).start()
                hit = _LOOP = (os.getpid(), loop)
                atexit.register(_settle_at_exit)
    return hit[1]


def _settle_at_exit(timeout: float = 10.0) -> None:
    """Wait (a bounded time) for requests still in flight, e.g. read-ahead chunks, before the
    interpreter finalizes: obstore's threads hand each answer to the loop by calling into Python,
    and one arriving during finalization aborts the process (SIGABRT at exit)."""
    hit = _LOOP
    if hit is None or hit[0] != os.getpid() or not hit[1].is_running():
        return

    async def settle() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
    try:
        asyncio.run_coroutine_threadsafe(settle(), hit[1]).result(timeout + 1)
    except Exception:  # at exit: nothing more to do
        pass


def run(coro, timeout: float | None = None):
    """Run a coroutine on this process's request loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, event_loop()).result(timeout)


# -- locations -----------------------------------------------------------------------------------
_OBSTORE_CONFIG_KEYS = {"s3": {"endpoint", "region", "access_key_id", "secret_access_key", "session_token",
                               "skip_signature", "virtual_hosted_style_request", "request_payer", "token",
                               "default_region", "imdsv1_fallback", "unsigned_payload", "checksum_algorithm",
                               "conditional_put", "s3_express", "bucket"},
                        "gs": {"service_account", "service_account_key", "application_credentials", "bucket"},
                        "az": {"account_name", "account_key", "sas_key", "token", "use_emulator", "endpoint",
                               "container_name", "client_id", "client_secret", "tenant_id", "use_fabric_endpoint",
                               "bearer_token", "skip_signature"},
                        "http": set()}
_CLIENT_OPTION_KEYS = {"allow_http", "allow_invalid_certificates", "timeout", "connect_timeout", "user_agent",
                       "pool_idle_timeout", "pool_max_idle_per_host", "http1_only", "http2_only", "proxy_url",
                       "default_headers", "read_timeout"}


@dataclass
class Location:
    """A folder on object storage: ``url`` plus ``storage_options`` (client settings such as
    ``endpoint``, ``region``, ``access_key_id``, ``skip_signature``, ``allow_http``).

    >>> loc = Location("s3://bucket/ds/"); loc.url, loc.scheme
    ('s3://bucket/ds', 's3')
    """
    url: str
    storage_options: dict = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy.from_env)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.scheme = scheme_of(self.url)
        check_url(self.url, self.scheme)
        self.storage_options = dict(self.storage_options or {})
        self._clients: dict[str, tuple[int, tuple, Any]] = {}
        self._lock = threading.Lock()
        #: name -> ETag this location's reads must match (see :meth:`pin`).
        self.pins: dict[str, str] = {}

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options, "policy": self.policy, "pins": self.pins}

    def __setstate__(self, state: dict) -> None:
        self.url, self.storage_options, self.policy = state["url"], state["storage_options"], state["policy"]
        self.__post_init__()
        self.pins = dict(state.get("pins") or {})

    def pin(self, name: str, etag: str | None) -> None:
        """Read ``name`` only as the version ``etag`` from now on: requests carry ``If-Match``
        and each answer's ETag is compared, so a replaced object is :class:`ObjectChangedError`,
        never a mixture of versions. Pins travel with the location to worker processes."""
        if etag:
            self.pins.setdefault(name, etag)

    def _checked_etag(self, name: str, etag: str | None) -> None:
        """Compare an answer's ETag with the pin (pinning it if this is the first answer)."""
        if not etag:
            return
        pinned = self.pins.setdefault(name, etag)
        if pinned != etag:
            raise ObjectChangedError(f"{self.name_url(name)}: the object changed since this dataset was opened "
                                     f"(ETag {etag} instead of {pinned}); reading on would mix two versions of "
                                     "the data: open the dataset again")

    def identity(self) -> str:
        """The URL plus the endpoint that serves it: two endpoints may hold the same bucket name."""
        opts = self.storage_options
        endpoint = opts.get("endpoint") or opts.get("endpoint_url") or ""
        if not endpoint and self.scheme == "s3":
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        return f"{self.url}|{endpoint}"

    def versions(self, purpose: str = "meta") -> dict[str, str]:
        """name -> ETag of every object under this folder, from listings (empty where the store
        cannot list, as plain HTTP servers cannot)."""
        if self.scheme == "http":
            return {}
        return self.client(purpose).versions()

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    def child(self, name: str) -> "Location":
        return Location(join(self.url, name), self.storage_options, self.policy)

    def name_url(self, name: str) -> str:
        return join(self.url, name) if name else self.url

    # -- clients ---------------------------------------------------------------------------------
    def _env_key(self) -> tuple:
        return tuple(os.environ.get(k) for k in CREDENTIAL_ENV)

    def rebuild(self) -> None:
        with self._lock:
            self._clients.clear()

    def client(self, purpose: str = "data") -> "_Client":
        """This process's client. ``purpose="meta"`` (small reads while opening a dataset) prefers
        the fork-safe client while this process has not started obstore itself."""
        simple = _SimpleClient.usable(self)
        forced = os.environ.get("MMLOADER_REMOTE_CLIENT", "").lower()
        if forced in ("fsspec", "simple"):  # for testing the fallbacks, or working around a client bug
            kind = "simple" if forced == "simple" and simple else "fsspec"
        elif obstore_usable() and (purpose != "meta" or obstore_started_here() or not simple):
            kind = "obstore"
        else:
            kind = "simple" if simple else "fsspec"
        if kind == "fsspec" and not fsspec_usable():
            if _OBSTORE_PID not in (None, os.getpid()):
                raise RemoteError(
                    f"{self.url}: this process was forked from one that used obstore, whose runtime does not "
                    "survive fork(); install fsspec (pip install 'mmloader[remote]') or start worker "
                    "processes with multiprocessing_context='spawn'")
            raise RemoteError(f"{self.url}: reading object storage needs obstore or fsspec: "
                              "pip install 'mmloader[remote]'")
        pid, env = os.getpid(), self._env_key()
        hit = self._clients.get(kind)
        if hit is None or hit[0] != pid or hit[1] != env:
            with self._lock:
                hit = self._clients.get(kind)
                if hit is None or hit[0] != pid or hit[1] != env:
                    made = {"obstore": _ObstoreClient, "simple": _SimpleClient, "fsspec": _FsspecClient}[kind](self)
                    hit = self._clients[kind] = (pid, env, made)
        return hit[2]

    # -- requests (each retried under the policy) --------------------------------------------------
    def get(self, name: str, purpose: str = "data") -> bytes:
        """The whole object ``name`` (relative to this folder)."""
        return self.client(purpose).get(name)

    def get_ranges(self, requests: Sequence[tuple[str, int, int]], purpose: str = "data") -> list:
        """``[(name, start, end), ...]`` -> the bytes of each range, fetched concurrently. Each
        answer is checked to have exactly ``end - start`` bytes (a short body is retried)."""
        if not requests:
            return []
        return self.client(purpose).get_ranges(list(requests))

    def start_ranges(self, requests: Sequence[tuple[str, int, int]], purpose: str = "data"):
        """:meth:`get_ranges` started in the background: a ``concurrent.futures.Future`` of the list."""
        client = self.client(purpose)
        if isinstance(client, _ObstoreClient):
            return client.start_ranges(list(requests))
        return _background().submit(client.get_ranges, list(requests))

    def start_range(self, name: str, start: int, end: int, purpose: str = "data"):
        """Start fetching bytes ``[start, end)`` of ``name`` in the background: a
        ``concurrent.futures.Future`` of them."""
        return self.client(purpose).start_range(name, start, end)

    def get_many(self, names: Sequence[str], purpose: str = "data") -> list[bytes]:
        """Several whole objects, concurrently."""
        return self.client(purpose).get_many(list(names))

    def size(self, name: str, purpose: str = "data") -> int | None:
        """The object's size in bytes, or None if there is no such object."""
        return self.client(purpose).head(name)[0]

    def head(self, name: str, purpose: str = "data") -> tuple[int | None, str | None]:
        """(size, etag) of the object, (None, None) if there is none."""
        return self.client(purpose).head(name)

    def exists(self, name: str, purpose: str = "data") -> bool:
        return self.head(name, purpose)[0] is not None

    def list(self, prefix: str = "", purpose: str = "data") -> list[tuple[str, int]]:
        """(name relative to this folder, size) of every object under ``prefix``."""
        return self.client(purpose).list(prefix)

    def put_file(self, name: str, local: str | os.PathLike, purpose: str = "data") -> None:
        self.client(purpose).put_file(name, str(local))

    def put_bytes(self, name: str, data: bytes, purpose: str = "data") -> None:
        self.client(purpose).put_bytes(name, data)

    def delete(self, name: str, purpose: str = "data") -> None:
        self.client(purpose).delete(name)

    def download(self, name: str, fd: int, size: int, progress: Callable[[int], None] | None = None,
                 chunk: int = 16 << 20, purpose: str = "data") -> None:
        """Write object ``name`` (``size`` bytes) into the open file ``fd`` by concurrent ranged
        reads of ``chunk`` bytes (each retried on its own: a reset costs one chunk, not the file)."""
        parts = [(name, a, min(a + chunk, size)) for a in range(0, size, chunk)]
        client = self.client(purpose)
        for i in range(0, len(parts), 8):  # at most 8 chunks (128 MiB) in memory at once
            group = parts[i:i + 8]
            for (_n, a, b), data in zip(group, client.get_ranges(group)):
                view = memoryview(data)
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], a + done)
                if progress is not None:
                    progress(b - a)


class _Client:
    location: Location

    def url(self, name: str) -> str:
        return self.location.name_url(name)

    def _rebuild(self) -> None:
        """Build the client again (credentials resolved again after an authentication error)."""

    def _retry(self, what: str, name: str, fn):
        """``fn()``, retried under the location's policy (see :class:`_Deadline`)."""
        deadline = _Deadline(self.location.policy, self.url(name), what)
        while True:
            try:
                return fn()
            except Exception as e:
                rebuilt = deadline.rebuilt
                delay = deadline.next_delay(e, self.location)
                if deadline.rebuilt and not rebuilt:
                    self._rebuild()
                time.sleep(delay)


def _check_length(data, want: int, url: str, start: int, object_size: int | None = None) -> None:
    if len(data) == want:
        return
    if object_size is not None and start + want > object_size:
        raise ObjectChangedError(f"{url}: the object holds {object_size} bytes, but the dataset's index needs bytes "
                                 f"up to {start + want}: it was truncated or replaced since it was indexed")
    if len(data) > want:
        raise LongBody(f"{url}: the server sent {len(data)} bytes for a range of {want} at offset {start}: it does "
                       "not answer ranged reads correctly")
    raise ShortBody(f"{url}: got {len(data)} of {want} bytes at offset {start}")


class _ObstoreClient(_Client):
    """obstore: requests on a shared event loop thread, ``max_in_flight`` at once, GIL-free."""

    def __init__(self, location: Location):
        import obstore
        self.location, self.obstore = location, obstore
        self._sem: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._build()

    def _build(self) -> None:
        from obstore.store import from_url
        location = self.location
        _mark_obstore()
        opts = dict(location.storage_options)
        policy = location.policy
        client_options = {"timeout": f"{policy.request_timeout}s", "connect_timeout": f"{policy.connect_timeout}s",
                          **{k: opts.pop(k) for k in list(opts) if k in _CLIENT_OPTION_KEYS}}
        for k in ("timeout", "connect_timeout", "read_timeout", "pool_idle_timeout"):
            if isinstance(client_options.get(k), (int, float)):
                client_options[k] = f"{client_options[k]}s"
        url = location.url
        if location.scheme == "s3":
            endpoint = opts.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint and endpoint.startswith("http://"):
                client_options.setdefault("allow_http", True)
            if endpoint and "virtual_hosted_style_request" not in opts:
                opts["virtual_hosted_style_request"] = False
            if not (opts.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
                opts["region"] = "us-east-1"
        elif location.scheme == "http":
            if url.startswith("http://"):
                client_options.setdefault("allow_http", True)
        retry = {"max_retries": 0}  # mmloader retries (backoff + deadline) around every request
        if location.scheme == "http":
            self.store = from_url(url, client_options=client_options, retry_config=retry)
        else:
            unknown = set(opts) - _OBSTORE_CONFIG_KEYS[location.scheme]
            if unknown:
                raise ValueError(f"{url}: unknown storage_options {sorted(unknown)} for {location.scheme}:// "
                                 f"(known: {sorted(_OBSTORE_CONFIG_KEYS[location.scheme] | _CLIENT_OPTION_KEYS)})")
            self.store = from_url(url, config=opts or None, client_options=client_options, retry_config=retry)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem[0] is not loop:
            self._sem = (loop, asyncio.Semaphore(self.location.policy.max_in_flight))
        return self._sem[1]

    async def _retrying(self, what: str, name: str, make):
        deadline = _Deadline(self.location.policy, self.url(name), what)
        while True:
            try:
                async with self._semaphore():
                    return await asyncio.wait_for(make(), self.location.policy.request_timeout + 5)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # classified: retried, or raised naming the URL
                rebuilt = deadline.rebuilt
                delay = deadline.next_delay(e, self.location)
                if deadline.rebuilt and not rebuilt:
                    self._rebuild()
            await asyncio.sleep(delay)

    def _options(self, name: str, **options) -> dict:
        pinned = self.location.pins.get(name)
        return {**options, "if_match": pinned} if pinned else options

    async def _range(self, name: str, start: int, end: int):
        async def once():
            result = await self.obstore.get_async(self.store, name, options=self._options(name, range=(start, end)))
            meta = result.meta
            self.location._checked_etag(name, meta.get("e_tag"))
            data = await result.bytes_async()
            _check_length(data, end - start, self.url(name), start, meta.get("size"))
            return data
        return await self._retrying(f"GET bytes {start}-{end - 1}", name, once)

    async def _whole(self, name: str):
        async def once():
            result = await self.obstore.get_async(self.store, name, options=self._options(name))
            meta = result.meta
            self.location._checked_etag(name, meta.get("e_tag"))
            data = await result.bytes_async()
            if meta.get("size") is not None:
                _check_length(data, meta["size"], self.url(name), 0)
            return data
        return await self._retrying("GET", name, once)

    def versions(self) -> dict[str, str]:
        return {name: etag for name, _size, etag in self._listing("") if etag}

    def get(self, name: str) -> bytes:
        return bytes(run(self._whole(name)))

    def get_many(self, names: list[str]) -> list[bytes]:
        async def all_():
            return await asyncio.gather(*(self._whole(n) for n in names))
        return [bytes(b) for b in run(all_())]

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        async def all_():
            return await asyncio.gather(*(self._range(n, a, b) for n, a, b in requests))
        return run(all_())

    def start_range(self, name: str, start: int, end: int):
        return asyncio.run_coroutine_threadsafe(self._range(name, start, end), event_loop())

    def start_ranges(self, requests: list[tuple[str, int, int]]):
        async def all_():
            return await asyncio.gather(*(self._range(n, a, b) for n, a, b in requests))
        return asyncio.run_coroutine_threadsafe(all_(), event_loop())

    def head(self, name: str) -> tuple[int | None, str | None]:
        async def once():
            try:
                meta = await self.obstore.head_async(self.store, name)
            except FileNotFoundError:
                return None, None
            return int(meta["size"]), meta.get("e_tag")
        return run(self._retrying("HEAD", name, once))

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return [(name, size) for name, size, _etag in self._listing(prefix)]

    def _listing(self, prefix: str) -> list[tuple[str, int, str | None]]:
        def once():
            return [(m["path"], int(m["size"]), m.get("e_tag"))
                    for batch in self.obstore.list(self.store, prefix or None) for m in batch]
        return self._retry("LIST", prefix, once)

    def _rebuild(self) -> None:
        self._build()  # credentials resolved again

    def put_file(self, name: str, local: str) -> None:
        from pathlib import Path
        size = os.path.getsize(local)

        async def once():
            await self.obstore.put_async(self.store, name, Path(local), use_multipart=size > 64 << 20,
                                         chunk_size=16 << 20, max_concurrency=8)
        run(self._retrying("PUT", name, once))

    def put_bytes(self, name: str, data: bytes) -> None:
        async def once():
            await self.obstore.put_async(self.store, name, data)
        run(self._retrying("PUT", name, once))

    def delete(self, name: str) -> None:
        async def once():
            try:
                await self.obstore.delete_async(self.store, name)
            except FileNotFoundError:
                pass
        run(self._retrying("DELETE", name, once))


class _HTTPStatus(OSError):
    def __init__(self, status: int, url: str, body: bytes = b""):
        super().__init__(f"{url}: HTTP status {status}: {body[:200].decode('utf-8', 'replace')}")
        self.status, self.body = status, body[:4096]


def static_s3_credentials(options: dict) -> tuple[str, str, str | None] | None | bool:
    """(key, secret, token) from ``storage_options`` or the environment; True for unsigned
    requests (``skip_signature``); None when credentials come from elsewhere (profiles,
    instance metadata, ...), which only the full clients resolve."""
    if str(options.get("skip_signature", os.environ.get("AWS_SKIP_SIGNATURE", ""))).lower() in ("true", "1"):
        return True
    key = options.get("access_key_id") or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = options.get("secret_access_key") or os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return key, secret, options.get("session_token") or os.environ.get("AWS_SESSION_TOKEN")
    return _botocore_credentials()


_BOTO: tuple[float, Any] = (0.0, None)


def _botocore_credentials() -> tuple[str, str, str | None] | None:
    """Credentials from botocore's chain (profiles, SSO, instance or container roles) when it is
    installed; asked again every 5 minutes (temporary credentials expire)."""
    global _BOTO
    if time.monotonic() - _BOTO[0] < 300:
        return _BOTO[1]
    try:
        import botocore.session
        creds = botocore.session.get_session().get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        value = (frozen.access_key, frozen.secret_key, frozen.token) if frozen and frozen.access_key else None
    except Exception:  # not installed, or no credentials anywhere
        value = None
    _BOTO = (time.monotonic(), value)
    return value


def sigv4_headers(method: str, host: str, path: str, region: str, creds: tuple[str, str, str | None],
                  now: float | None = None, query: str = "") -> dict[str, str]:
    """AWS Signature Version 4 headers for a body-less S3 request (``path`` already quoted).

    >>> h = sigv4_headers("GET", "127.0.0.1:9000", "/b/k", "us-east-1", ("AK", "SK", None), now=0)
    >>> h["Authorization"].split(", ")[0], h["x-amz-date"]
    ('AWS4-HMAC-SHA256 Credential=AK/19700101/us-east-1/s3/aws4_request', '19700101T000000Z')
    """
    import hashlib
    import hmac
    key, secret, token = creds
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    date = amz_date[:8]
    payload = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload}
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    canonical = "\n".join([method, path, query, "".join(f"{k}:{headers[k]}\n" for k in names), ";".join(names), payload])
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in headers.items() if k != "host"}
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={';'.join(names)}, "
                            f"Signature={signature}")
    return out


class _SimpleClient(_Client):
    """The standard library's HTTP client (+ SigV4 for S3 with static credentials): starts in
    milliseconds and survives fork. Used to open datasets (a few small reads) and where obstore
    cannot run (a process forked from one that started it)."""

    def __init__(self, location: Location):
        from urllib.parse import quote, urlsplit
        self.location = location
        self._quote = quote
        self._local = threading.local()
        opts = location.storage_options
        if location.scheme == "http":
            parts = urlsplit(location.url)
            self.secure, self.host = parts.scheme == "https", parts.netloc
            self.prefix = parts.path.rstrip("/")
            self.creds = True
        else:
            bucket, _, prefix = location.url.split("://", 1)[1].partition("/")
            self.creds = static_s3_credentials(opts)
            self.region = opts.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") \
                or "us-east-1"
            endpoint = opts.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                parts = urlsplit(endpoint)
                self.secure, self.host = parts.scheme == "https", parts.netloc
                self.bucket_path = parts.path.rstrip("/") + "/" + bucket
                self.prefix = self.bucket_path + ("/" + prefix if prefix else "")
            else:
                self.secure, self.host = True, f"{bucket}.s3.{self.region}.amazonaws.com"
                self.bucket_path = "/"
                self.prefix = "/" + prefix if prefix else ""
            self.prefix = self.prefix.rstrip("/")
            self.key_prefix = prefix.strip("/")

    @staticmethod
    def usable(location: Location) -> bool:
        return location.scheme == "http" or (location.scheme == "s3" and
                                             static_s3_credentials(location.storage_options) is not None)

    def _conn(self):
        import http.client
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            cls = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
            c = self._local.conn = cls(self.host, timeout=self.location.policy.request_timeout)
            self._local.pid = os.getpid()
        return c

    def _request(self, method: str, name: str, headers: dict | None = None, query: dict | None = None,
                 path: str | None = None) -> tuple[int, dict, bytes]:
        if path is None:
            path = self._quote(f"{self.prefix}/{name}" if name else self.prefix or "/", safe="/~")
        canonical_query = "&".join(f"{self._quote(k, safe='-_.~')}={self._quote(v, safe='-_.~')}"
                                   for k, v in sorted((query or {}).items()))
        hdrs = dict(headers or {})
        if self.location.scheme == "s3" and self.creds is not True:
            hdrs.update(sigv4_headers(method, self.host, path, self.region, self.creds, query=canonical_query))
        target = f"{path}?{canonical_query}" if canonical_query else path
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._conn()
            try:
                conn.request(method, target, headers=hdrs)
                resp = conn.getresponse()
                body = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
            except (ConnectionError, OSError) as e:
                conn.close()
                self._local.conn = None
                import http.client
                if attempt or not isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError,
                                                 ConnectionResetError)):
                    raise
        raise AssertionError("unreachable")

    def _check(self, status: int, body: bytes, name: str) -> None:
        if status >= 300 and server_refusal(_HTTPStatus(status, self.url(name), body)):
            raise _HTTPStatus(status, self.url(name), body)  # named by _Deadline (no such bucket, ...)
        if status == 404:
            raise FileNotFoundError(f"{self.url(name)}: no such object")
        if status in (401, 403):
            raise PermissionError(f"{self.url(name)}: access denied (HTTP {status})")
        if status == 416:
            raise ObjectChangedError(f"{self.url(name)}: the range asked for lies beyond the object's end (HTTP 416): "
                                     "it was truncated or replaced since it was indexed")
        if status >= 300:
            raise _HTTPStatus(status, self.url(name), body)

    def _rebuild(self) -> None:
        self.__init__(self.location)  # type: ignore[misc]  # credentials read again

    def _pinned(self, name: str, headers: dict) -> dict:
        pinned = self.location.pins.get(name)
        return {**headers, "If-Match": pinned} if pinned else headers

    def get(self, name: str) -> bytes:
        def once():
            status, headers, body = self._request("GET", name, self._pinned(name, {}))
            self._check(status, body, name)
            self.location._checked_etag(name, headers.get("etag"))
            if "content-length" in headers:
                _check_length(body, int(headers["content-length"]), self.url(name), 0)
            return body
        return self._retry("GET", name, once)

    def _range(self, name: str, start: int, end: int) -> bytes:
        def once():
            status, headers, body = self._request("GET", name,
                                                  self._pinned(name, {"Range": f"bytes={start}-{end - 1}"}))
            self._check(status, body, name)
            self.location._checked_etag(name, headers.get("etag"))
            total = None
            if status == 206 and "/" in headers.get("content-range", ""):
                tail = headers["content-range"].rsplit("/", 1)[1]
                total = int(tail) if tail.isdigit() else None
            elif status == 200:  # the server ignored Range: cut the range out
                total = len(body)
                body = body[start:end]
            _check_length(body, end - start, self.url(name), start, total)
            return body
        return self._retry(f"GET bytes {start}-{end - 1}", name, once)

    def versions(self) -> dict[str, str]:
        """S3 ListObjectsV2 under the prefix: name -> ETag. Here, not through obstore: the
        opening process must not start obstore's runtime (forked workers could not use it)."""
        if self.location.scheme != "s3":
            return {}
        import xml.etree.ElementTree as ET
        base = self.key_prefix + "/" if self.key_prefix else ""
        out: dict[str, str] = {}
        token = None
        while True:
            query = {"list-type": "2", "prefix": base, **({"continuation-token": token} if token else {})}

            def once(query=query):
                status, _headers, body = self._request("GET", "", query=query, path=self._quote(self.bucket_path,
                                                                                                safe="/~"))
                self._check(status, body, "")
                return body
            root = ET.fromstring(self._retry("LIST", "", once))
            ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            for item in root.iter(f"{ns}Contents"):
                key, etag = item.findtext(f"{ns}Key"), item.findtext(f"{ns}ETag")
                if key and etag and key.startswith(base):
                    out[key[len(base):]] = etag
            token = root.findtext(f"{ns}NextContinuationToken")
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return out

    def get_many(self, names: list[str]) -> list[bytes]:
        if len(names) == 1:
            return [self.get(names[0])]
        return list(_background().map(self.get, names))

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        if len(requests) == 1:
            return [self._range(*requests[0])]
        return list(_background().map(lambda r: self._range(*r), requests))

    def start_range(self, name: str, start: int, end: int):
        return _background().submit(self._range, name, start, end)

    def head(self, name: str) -> tuple[int | None, str | None]:
        def once():
            status, headers, body = self._request("HEAD", name)
            if status == 404:
                return None, None
            self._check(status, body, name)
            return int(headers["content-length"]), headers.get("etag")
        return self._retry("HEAD", name, once)

    def _full(self) -> "_Client":
        return _ObstoreClient(self.location) if obstore_usable() else _FsspecClient(self.location)

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return self._full().list(prefix)

    def put_file(self, name: str, local: str) -> None:
        self._full().put_file(name, local)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._full().put_bytes(name, data)

    def delete(self, name: str) -> None:
        self._full().delete(name)


class _FsspecClient(_Client):
    """fsspec (s3fs, gcsfs, adlfs, HTTP): fork-safe; the fallback where obstore cannot run."""

    PROTOCOL = {"s3": "s3", "gs": "gcs", "az": "az", "http": "http"}

    def __init__(self, location: Location):
        self.location = location
        self._build()

    def _build(self) -> None:
        import fsspec
        location = self.location
        opts = dict(location.storage_options)
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if location.scheme == "s3":
            client_kwargs = {}
            endpoint = opts.pop("endpoint", None) or os.environ.get("AWS_ENDPOINT_URL_S3") \
                or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                kwargs["endpoint_url"] = endpoint
            region = opts.pop("region", None) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            client_kwargs["region_name"] = region or "us-east-1"
            if "access_key_id" in opts:
                kwargs["key"] = opts.pop("access_key_id")
            if "secret_access_key" in opts:
                kwargs["secret"] = opts.pop("secret_access_key")
            if "session_token" in opts:
                kwargs["token"] = opts.pop("session_token")
            if str(opts.pop("skip_signature", "")).lower() in ("true", "1"):
                kwargs["anon"] = True
            kwargs["client_kwargs"] = client_kwargs
            kwargs["config_kwargs"] = {"connect_timeout": location.policy.connect_timeout,
                                       "read_timeout": location.policy.request_timeout,
                                       "retries": {"max_attempts": 1}}
        for k in list(opts):
            if k in _CLIENT_OPTION_KEYS:
                opts.pop(k)
        kwargs.update(opts)
        self.fs = fsspec.filesystem(self.PROTOCOL[location.scheme], **kwargs)
        if location.scheme == "http":
            self.base = location.url
        else:
            self.base = location.url.split("://", 1)[1]

    def _path(self, name: str) -> str:
        return join(self.base, name) if name else self.base

    def _rebuild(self) -> None:
        self._build()  # credentials resolved again

    def get(self, name: str) -> bytes:
        return self._retry("GET", name, lambda: self.fs.cat_file(self._path(name)))

    def get_many(self, names: list[str]) -> list[bytes]:
        return [self.get(n) for n in names] if len(names) < 2 else self._ranges_or_whole(
            [(n, None, None) for n in names])

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        return self._ranges_or_whole(requests)

    def start_range(self, name: str, start: int, end: int):
        return _background().submit(lambda: self._ranges_or_whole([(name, start, end)])[0])

    def _ranges_or_whole(self, requests) -> list:
        out: list = [None] * len(requests)
        todo = list(range(len(requests)))
        deadlines: dict[int, _Deadline] = {}
        while todo:
            paths = [self._path(requests[i][0]) for i in todo]
            starts = [requests[i][1] for i in todo]
            ends = [requests[i][2] for i in todo]
            results = self.fs.cat_ranges(paths, starts, ends, on_error="return")
            again, delay = [], 0.0
            for i, r in zip(todo, results):
                name, a, b = requests[i]
                if not isinstance(r, BaseException) and a is not None and len(r) != b - a:
                    r = ShortBody(f"{self.url(name)}: got {len(r)} of {b - a} bytes at offset {a}")
                if isinstance(r, BaseException):
                    d = deadlines.setdefault(i, _Deadline(self.location.policy, self.url(name),
                                                          "GET" if a is None else f"GET bytes {a}-{b - 1}"))
                    delay = max(delay, d.next_delay(r, self.location))
                    again.append(i)
                else:
                    out[i] = r
            todo = again
            if todo:
                time.sleep(delay)
        return out

    def head(self, name: str) -> tuple[int | None, str | None]:
        def once():
            try:
                info = self.fs.info(self._path(name))
            except FileNotFoundError:
                return None, None
            etag = info.get("ETag") or info.get("etag")
            return (int(info["size"]) if info.get("size") is not None else None), etag
        return self._retry("HEAD", name, once)

    def versions(self) -> dict[str, str]:
        return {}  # fsspec's listings do not say the same thing across backends: no pins (README)

    def list(self, prefix: str) -> list[tuple[str, int]]:
        def once():
            base = self._path("")
            found = self.fs.find(self._path(prefix) if prefix else base, detail=True)
            return [(p[len(base):].lstrip("/"), int(i.get("size") or 0)) for p, i in found.items()]
        return self._retry("LIST", prefix, once)

    def put_file(self, name: str, local: str) -> None:
        self._retry("PUT", name, lambda: self.fs.put_file(local, self._path(name)))

    def put_bytes(self, name: str, data: bytes) -> None:
        self._retry("PUT", name, lambda: self.fs.pipe_file(self._path(name), data))

    def delete(self, name: str) -> None:
        def once():
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                pass
        self._retry("DELETE", name, once)


_POOL: tuple[int, Any] | None = None


def _background():
    """A small per-process thread pool for background requests of the fsspec client."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        import concurrent.futures
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="mmloader-fetch"))
    return _POOL[1]


def coalesce(ranges: Iterable[tuple[int, int]], gap: int) -> list[tuple[int, int, list[int]]]:
    """Merge ``(start, end)`` ranges whose gap is at most ``gap`` bytes into larger ones:
    ``[(start, end, [indices of the ranges inside]), ...]`` in file order.

    >>> coalesce([(0, 10), (12, 20), (100, 110), (15, 18)], gap=4)
    [(0, 20, [0, 1, 3]), (100, 110, [2])]
    """
    items = sorted(((a, b, i) for i, (a, b) in enumerate(ranges)), key=lambda t: t[0])
    out: list[tuple[int, int, list[int]]] = []
    for a, b, i in items:
        if out and a - out[-1][1] <= gap:
            s, e, members = out[-1]
            out[-1] = (s, max(e, b), members + [i])
        else:
            out.append((a, b, [i]))
    return out
