"""The fsspec client (s3fs, gcsfs, adlfs, HTTP): fork-safe, the fallback where obstore cannot
run and the standard-library client does not apply (GCS, Azure, credentials only botocore
resolves)."""

from __future__ import annotations

import os
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from .client import _CLIENT_OPTION_KEYS, LocationLike, _Client
from .errors import ShortBody
from .proxy import proxy_for
from .retry import _Deadline
from .runtime import _background
from .servers import mark_answered
from .sigv4 import _botocore_credentials
from .urls import endpoint_of, join


class _FsspecClient(_Client):
    """fsspec (s3fs, gcsfs, adlfs, HTTP): fork-safe; the fallback where obstore cannot run."""

    PROTOCOL = {"s3": "s3", "gs": "gcs", "az": "az", "http": "http"}

    def __init__(self, location: LocationLike):
        self.location = location
        self._build()

    def _build(self) -> None:
        import fsspec

        location = self.location
        opts = dict(location.storage_options)
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if location.scheme == "s3":
            client_kwargs = {}
            endpoint, _where = endpoint_of("s3", opts)
            opts.pop("endpoint", None)
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
            elif "key" not in kwargs and not os.environ.get("AWS_ACCESS_KEY_ID"):
                _botocore_credentials()  # s3fs resolves the same ones: what it finds is scrubbed from messages
            kwargs["client_kwargs"] = client_kwargs
            kwargs["config_kwargs"] = {
                "connect_timeout": location.policy.connect_timeout,
                "read_timeout": location.policy.request_timeout,
                "retries": {"max_attempts": 1},
            }
        headers = opts.get("default_headers")  # storage_options["headers"] joined it (Location)
        if location.scheme == "http" and headers:
            kwargs["headers"] = dict(headers)  # sent with every request, as obstore does
        if location.scheme == "http":
            # the proxy the other clients choose (proxy.proxy_for), given per request: aiohttp's
            # trust_env would read its own rules, and ~/.netrc's credentials for any host
            parts = urlsplit(location.url)
            proxy = proxy_for(parts.scheme == "https", parts.netloc.rpartition("@")[2], opts.get("proxy_url"))
            if str(opts.get("allow_invalid_certificates", "")).lower() in ("true", "1"):
                kwargs["ssl"] = False  # as obstore and the standard library's client: unchecked
            elif parts.scheme == "https":
                # made now, so that SSL_CERT_FILE is read as the other clients read it (aiohttp's
                # default context is made once, when aiohttp is imported)
                kwargs["ssl"] = ssl.create_default_context()
            import aiohttp

            # aiohttp's default timeouts (300 s in all), but a connect may take connect_timeout, as
            # with the other clients (not aiohttp's 30 s per attempt)
            kwargs["client_kwargs"] = {
                "timeout": aiohttp.ClientTimeout(total=300, sock_connect=location.policy.connect_timeout)
            }
            if proxy is not None:
                kwargs["proxy"] = f"http://{proxy.address}"
                if proxy.authorization and parts.scheme == "https":
                    kwargs["proxy_headers"] = {"Proxy-Authorization": proxy.authorization}  # the CONNECT's
                elif proxy.authorization:
                    # plain HTTP: every request, redirects' too, goes to the proxy, which takes
                    # the header off (aiohttp sends proxy_headers only with a CONNECT)
                    kwargs["headers"] = {**kwargs.get("headers", {}), "Proxy-Authorization": proxy.authorization}
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
        return (
            [self.get(n) for n in names] if len(names) < 2 else self._ranges_or_whole([(n, None, None) for n in names])
        )

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
            if any(not isinstance(r, BaseException) for r in results):
                mark_answered(self._server)
            for i, r in zip(todo, results):
                name, a, b = requests[i]
                if not isinstance(r, BaseException) and a is not None and len(r) != b - a:
                    r = ShortBody(f"{self.url(name)}: got {len(r)} of {b - a} bytes at offset {a}")
                if isinstance(r, BaseException):
                    d = deadlines.setdefault(
                        i,
                        _Deadline(
                            self.location.policy,
                            self.url(name),
                            "GET" if a is None else f"GET bytes {a}-{b - 1}",
                            self._server,
                        ),
                    )
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
            return [(p[len(base) :].lstrip("/"), int(i.get("size") or 0)) for p, i in found.items()]

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
