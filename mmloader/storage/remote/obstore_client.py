"""The client: obstore (Rust: S3/GCS/Azure/HTTP in one package, requests without the GIL, proxies
from the environment or ``proxy_url``). Its runtime does not survive ``fork()``: a process forked
from one that started it is refused (:func:`~.runtime.check_not_inherited`), never left to hang."""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

from .proxy import obstore_options
from .ranges import _check_length
from .redaction import remember_secrets
from .retry import _Deadline
from .runtime import _mark_obstore, event_loop, run
from .servers import Server, location_server
from .urls import endpoint_of

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

#: Client settings (obstore's ``client_options``) accepted in ``storage_options``.
_CLIENT_OPTION_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "timeout",
    "connect_timeout",
    "user_agent",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "http1_only",
    "http2_only",
    "proxy_url",
    "proxy_excludes",
    "proxy_ca_certificate",
    "default_headers",
    "read_timeout",
}
#: obstore's settings per scheme, accepted in ``storage_options``.
_OBSTORE_CONFIG_KEYS = {
    "s3": {
        "endpoint",
        "region",
        "access_key_id",
        "secret_access_key",
        "session_token",
        "skip_signature",
        "virtual_hosted_style_request",
        "request_payer",
        "token",
        "default_region",
        "imdsv1_fallback",
        "unsigned_payload",
        "checksum_algorithm",
        "conditional_put",
        "s3_express",
        "bucket",
    },
    "gs": {"service_account", "service_account_key", "application_credentials", "bucket"},
    "az": {
        "account_name",
        "account_key",
        "sas_key",
        "token",
        "use_emulator",
        "endpoint",
        "container_name",
        "client_id",
        "client_secret",
        "tenant_id",
        "use_fabric_endpoint",
        "bearer_token",
        "skip_signature",
    },
    "http": set(),
}


class LocationLike(Protocol):
    """What the client uses of its :class:`~.location.Location` (declared here, not imported, so
    that the client and the location that builds it do not import each other)."""

    url: str
    scheme: str
    storage_options: dict
    policy: Any
    pins: dict[str, str]

    def name_url(self, name: str) -> str: ...

    def rebuild(self) -> None: ...

    def _checked_etag(self, name: str, etag: str | None) -> None: ...


class _ObstoreClient:
    """The requests of one process to one location: on a shared event loop thread,
    ``max_in_flight`` at once, GIL-free. Names are relative to the location's folder; every
    request is retried under the location's policy (:class:`~.retry._Deadline`), and a pinned
    name (``location.pins``) is read only as its pinned version (``If-Match``)."""

    _contact: Server | None = None

    def url(self, name: str) -> str:
        """The full URL of ``name``, as error messages name it."""
        return self.location.name_url(name)

    @property
    def _server(self) -> Server:
        """Where the requests go: whether it has answered decides how long a failure to connect
        is retried (:mod:`.servers`)."""
        if self._contact is None:
            self._contact = location_server(self.location)
        return self._contact

    def _retry(self, what: str, name: str, fn):
        """``fn()`` (blocking), retried under the location's policy."""
        deadline = _Deadline(self.location.policy, self.url(name), what, self._server)
        while True:
            try:
                result = fn()
            except Exception as e:
                failed = e
            else:
                deadline.answered()
                return result
            # outside the except block: what next_delay raises would have the client's error,
            # which may hold the request's headers, as its __context__
            delay = self._next_delay(deadline, failed)
            del failed
            time.sleep(delay)

    def _next_delay(self, deadline: _Deadline, failed: BaseException) -> float:
        """The wait before trying again, or the error raised for good (:meth:`_Deadline.next_delay`);
        the client is built again once after an authentication error."""
        rebuilt = deadline.rebuilt
        delay = deadline.next_delay(failed, self.location)
        if deadline.rebuilt and not rebuilt:
            self._rebuild()
        return delay

    def __init__(self, location: LocationLike):
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
        client_options: dict[str, Any] = {
            "timeout": f"{policy.request_timeout}s",
            "connect_timeout": f"{policy.connect_timeout}s",
            **{k: opts.pop(k) for k in list(opts) if k in _CLIENT_OPTION_KEYS},
        }
        for k in ("timeout", "connect_timeout", "read_timeout", "pool_idle_timeout"):
            if isinstance(client_options.get(k), (int, float)):
                client_options[k] = f"{client_options[k]}s"
        url = location.url
        provider = None
        if location.scheme == "s3":
            endpoint, _where = endpoint_of("s3", opts)
            if endpoint and endpoint.lower().startswith("http://"):
                client_options.setdefault("allow_http", True)
            if endpoint and "virtual_hosted_style_request" not in opts:
                opts["virtual_hosted_style_request"] = False
            if not (opts.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
                opts["region"] = "us-east-1"
            provider = _profile_provider(opts)
        elif location.scheme == "http":
            if url.lower().startswith("http://"):
                client_options.setdefault("allow_http", True)
            parts = urlsplit(url)  # the route proxy.proxy_for takes (obstore's own reading differs)
            client_options.update(
                obstore_options(
                    parts.scheme == "https", parts.netloc.rpartition("@")[2], client_options.get("proxy_url")
                )
            )
            hub = getattr(location, "hub", None)
            token = hub.bearer() if hub is not None else None
            if token:  # looked up in this process: a token from the environment never travels
                client_options["default_headers"] = {
                    **client_options.get("default_headers", {}),
                    "Authorization": f"Bearer {token}",
                }
        retry: RetryConfig = {"max_retries": 0}  # mmloader retries (backoff + deadline) around every request
        if location.scheme == "http":
            self.store = from_url(url, client_options=cast("ClientConfig", client_options), retry_config=retry)
        else:
            unknown = set(opts) - _OBSTORE_CONFIG_KEYS[location.scheme]
            if unknown:
                raise ValueError(
                    f"{url}: unknown storage_options {sorted(unknown)} for {location.scheme}:// "
                    f"(known: {sorted(_OBSTORE_CONFIG_KEYS[location.scheme] | _CLIENT_OPTION_KEYS)})"
                )
            # opts are the user's storage_options, checked against the scheme's keys above: obstore
            # types config per scheme (S3Config, GCSConfig, AzureConfig), which a dict cannot name
            config = cast(Any, opts or None)
            extra: dict[str, Any] = {"credential_provider": provider} if location.scheme == "s3" and provider else {}
            self.store = from_url(
                url, config=config, client_options=cast("ClientConfig", client_options), retry_config=retry, **extra
            )

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem[0] is not loop:
            self._sem = (loop, asyncio.Semaphore(self.location.policy.max_in_flight))
        return self._sem[1]

    async def _retrying(self, what: str, name: str, make):
        deadline = _Deadline(self.location.policy, self.url(name), what, self._server)
        while True:
            try:
                async with self._semaphore():
                    result = await asyncio.wait_for(make(), self.location.policy.request_timeout + 5)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # classified: retried, or raised naming the URL
                failed = e
            else:
                deadline.answered()
                return result
            # outside the except block: what next_delay raises has no __context__ (obstore's
            # error may quote a server's answer echoing the request's credentials)
            delay = self._next_delay(deadline, failed)
            del failed
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

    def _listing(self, prefix: str) -> builtins.list[tuple[str, int, str | None]]:
        # builtins.list: in this class body ``list`` is the method above
        def once():
            return [
                (m["path"], int(m["size"]), m.get("e_tag"))
                for batch in self.obstore.list(self.store, prefix or None)
                for m in batch
            ]

        return self._retry("LIST", prefix, once)

    def _rebuild(self) -> None:
        self._build()  # credentials resolved again

    def put_file(self, name: str, local: str) -> None:
        from pathlib import Path

        size = os.path.getsize(local)

        async def once():
            await self.obstore.put_async(
                self.store, name, Path(local), use_multipart=size > 64 << 20, chunk_size=16 << 20, max_concurrency=8
            )

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


#: How botocore finds credentials that obstore finds by itself (the environment, an instance's or
#: a container's role, web identity); from anywhere else (a profile in the shared files, SSO, a
#: credential process, an assumed role) obstore asks botocore (:func:`_profile_provider`).
OBSTORE_RESOLVES = frozenset({"env", "iam-role", "container-role", "assume-role-with-web-identity"})


def _profile_provider(opts: dict):
    """obstore's ``Boto3CredentialProvider`` where botocore finds S3 credentials that obstore
    does not read (an AWS profile, SSO, a credential process); None where ``opts`` or the
    environment give them, requests are unsigned, or botocore is not installed. What it hands
    obstore is scrubbed from every message."""
    if str(opts.get("skip_signature", os.environ.get("AWS_SKIP_SIGNATURE", ""))).lower() in ("true", "1"):
        return None
    if opts.get("access_key_id") or opts.get("secret_access_key") or os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    session = boto3.Session()
    try:
        found = session.get_credentials()
    except Exception:  # a broken profile: obstore's own chain says what it finds
        return None
    if found is None or str(getattr(found, "method", "")) in OBSTORE_RESOLVES:
        return None

    class _Scrubbed(Boto3CredentialProvider):
        def __call__(self):
            creds = super().__call__()
            remember_secrets(creds.get("access_key_id"), creds.get("secret_access_key"), creds.get("token"))
            return creds

    frozen = found.get_frozen_credentials()
    remember_secrets(frozen.access_key, frozen.secret_key, frozen.token)
    return _Scrubbed(session)
