"""A folder on object storage (:class:`Location`): the one object the stores hold. It pickles
without a client or credentials from the environment and builds, per process, the client that
process may use."""

from __future__ import annotations

import base64
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

from ...errors import MMLoaderError
from .errors import ObjectChangedError, RemoteError
from .failures import _auth_error, short_message
from .hub import HUB_OPTION_KEYS, HubRepo, check_repo, list_files, open_hub
from .obstore_client import _CLIENT_OPTION_KEYS, _OBSTORE_CONFIG_KEYS, _ObstoreClient
from .redaction import redact, redact_url, remember_secrets
from .retry import Policy
from .runtime import check_not_inherited
from .servers import answered, location_server, mark_answered
from .urls import check_endpoint, check_url, endpoint_of, join, lower_scheme, scheme_of, split_userinfo

T = TypeVar("T")
Client = _ObstoreClient

#: Environment variables whose change means "build the client again" (rotated credentials).
CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
)


@dataclass
class Location:
    """A folder on object storage: ``url`` plus ``storage_options`` (client settings such as
    ``endpoint``, ``region``, ``access_key_id``, ``skip_signature``, ``allow_http``,
    ``default_headers``).

    The credentials of an ``http(s)://user:password@host/`` URL are taken out of it: they become
    the ``Authorization: Basic`` header every client sends (``storage_options["default_headers"]``),
    and ``url`` — what every message, cache key and ``repr`` shows — holds none. Other schemes
    take credentials from ``storage_options`` or the environment, never from the URL (refused).

    >>> loc = Location("s3://bucket/ds/"); loc.url, loc.scheme
    ('s3://bucket/ds', 's3')
    >>> loc = Location("https://alice:pa55@host/ds"); loc.url, loc.storage_options
    ('https://host/ds', {'default_headers': {'Authorization': 'Basic YWxpY2U6cGE1NQ=='}})
    """

    url: str
    storage_options: dict = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy.from_env)

    def __post_init__(self) -> None:
        self.url = lower_scheme(self.url.rstrip("/"))
        self.scheme = scheme_of(self.url)
        #: what to do when an object changed under this dataset (a local index built from the
        #: earlier version must be built again)
        self.changed_remedy = getattr(self, "changed_remedy", "open the dataset again")
        self.storage_options = dict(self.storage_options or {})
        #: The Hub repository at one commit (``hf://`` URLs; see :mod:`.hub`), else None.
        self.hub: HubRepo | None = getattr(self, "hub", None)
        if self.scheme == "hf":
            # a misspelt option fails before any request (the Hub may be slow to answer)
            accepted = HUB_OPTION_KEYS
            unknown = sorted(str(k) for k in self.storage_options if k not in accepted)
            if unknown:
                raise ValueError(
                    f"{self.url}: unknown storage_options {unknown} for hf:// URLs (accepted: {', '.join(sorted(accepted))})"
                )
            # resolved here, once, in the process that opens the dataset: the revision becomes
            # its commit, and the location an HTTPS folder at that commit (workers get that)
            self.hub, self.storage_options = open_hub(self.url, self.storage_options, self.policy)
            self.url, self.scheme = self.hub.folder_url, "http"
        self._take_bearer()
        self._take_userinfo()
        check_url(self.url, self.scheme)
        self._check_options()
        self._check_endpoint()
        self._clients: dict[str, tuple[int, tuple, Any]] = {}
        self._lock = threading.Lock()
        #: name -> ETag this location's reads must match (see :meth:`pin`).
        self.pins: dict[str, str] = {}

    def _take_bearer(self) -> None:
        """``storage_options["token"]`` of an ``http(s)://`` URL: the ``Authorization: Bearer``
        header every client sends (a Hub location sends its token itself: :mod:`.hub`)."""
        if self.scheme != "http" or "token" not in self.storage_options:
            return
        token = self.storage_options.pop("token")
        if not isinstance(token, str) or not token:
            raise ValueError(f"{redact_url(self.url)}: storage_options['token'] must be a non-empty string")
        self._add_authorization(f"Bearer {token}", "storage_options['token']")

    def _take_userinfo(self) -> None:
        """An HTTP URL's ``user:password@`` into an ``Authorization: Basic`` header; refused
        elsewhere (S3, GCS and Azure credentials are not URL userinfo). Azure's
        ``container@account`` form, which holds no password, is a name and stays."""
        bare, user, password = split_userinfo(self.url)
        if user is None or (self.scheme == "az" and password is None):
            return
        shown = redact_url(self.url)
        if self.scheme != "http":
            raise ValueError(
                f"{shown}: {self.scheme}:// URLs cannot hold credentials: give them as storage_options "
                "(e.g. access_key_id and secret_access_key) or in the environment (AWS_ACCESS_KEY_ID, ...)"
            )
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        self._add_authorization(f"Basic {token}", "credentials in the URL")
        self.url = bare

    def _add_authorization(self, value: str, given_as: str) -> None:
        """``value`` as the Authorization header every client sends; refused when one is
        already there (credentials given twice: which should win is not for us to guess)."""
        headers = dict(self.storage_options.get("default_headers") or {})
        if any(str(k).lower() == "authorization" for k in headers):
            raise ValueError(
                f"{redact_url(self.url)}: {given_as} and an Authorization header already given "
                "(storage_options['token'] or ['default_headers']): give credentials once"
            )
        headers["Authorization"] = value
        self.storage_options["default_headers"] = headers

    def _check_options(self) -> None:
        """``storage_options`` the client takes, or a ValueError listing them: obstore's settings
        for the scheme (:data:`~.obstore_client._OBSTORE_CONFIG_KEYS`), its client settings
        (:data:`~.obstore_client._CLIENT_OPTION_KEYS`), and ``headers`` (fsspec's spelling), which
        joins ``default_headers``, sent with every request. A key the client does not read
        (``heders``) would otherwise be ignored, silently."""
        opts = self.storage_options
        accepted = _OBSTORE_CONFIG_KEYS[self.scheme] | _CLIENT_OPTION_KEYS | {"headers"}
        unknown = sorted(str(k) for k in opts if k not in accepted)
        if unknown:
            raise ValueError(
                f"{redact_url(self.url)}: unknown storage_options {unknown} for {self.scheme}:// URLs "
                f"(accepted: {', '.join(sorted(accepted))})"
            )
        for key in ("headers", "default_headers"):
            if key in opts and not isinstance(opts[key], Mapping):
                raise ValueError(
                    f"{redact_url(self.url)}: storage_options[{key!r}] is a {type(opts[key]).__name__}: "
                    "expected a mapping of header names to values"
                )
        if "headers" in opts:
            headers = dict(opts.get("default_headers") or {})
            for name, value in opts.pop("headers").items():
                if any(str(name).lower() == str(other).lower() for other in headers):
                    raise ValueError(
                        f"{redact_url(self.url)}: the header {name!r} is given twice (storage_options['headers'], "
                        "and ['default_headers'] or the URL's credentials): give it once"
                    )
                headers[name] = value
            opts["default_headers"] = headers

    def _check_endpoint(self) -> None:
        """A port that is no number, or an endpoint holding credentials, fails here, naming it
        (redacted), not as a request retried until the deadline: the URL's port, and the
        endpoint's wherever it was given (``storage_options`` or, for S3, ``AWS_ENDPOINT_URL``)."""
        from urllib.parse import urlsplit

        if self.scheme == "http":  # s3://bucket, gs://bucket: no port
            try:
                urlsplit(self.url).port  # noqa: B018  (parsing the port is the check)
            except ValueError as e:
                raise ValueError(f"URL {redact_url(self.url)}: invalid port ({e})") from None
        endpoint, where = endpoint_of(self.scheme, self.storage_options)
        if endpoint:
            check_endpoint(endpoint, where)

    def __getstate__(self) -> dict:
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "policy": self.policy,
            "pins": self.pins,
            "hub": self.hub,
            "changed_remedy": self.changed_remedy,
            # a worker's failure to connect to a server that answered here is a server restarting
            # (retried for the whole retry_deadline), not a wrong endpoint
            "answered": answered(location_server(self)),
        }

    def __setstate__(self, state: dict) -> None:
        self.url, self.storage_options, self.policy = state["url"], state["storage_options"], state["policy"]
        self.hub = state.get("hub")
        self.changed_remedy = state.get("changed_remedy", "open the dataset again")
        if self.hub is not None:
            remember_secrets(self.hub.token)  # a worker's messages scrub it too
        self.__post_init__()
        self.pins = dict(state.get("pins") or {})
        if state.get("answered"):
            mark_answered(location_server(self))

    def pin(self, name: str, etag: str | None) -> None:
        """Read ``name`` only as the version ``etag`` from now on: requests carry ``If-Match``
        and each answer's ETag is compared, so a replaced object is :class:`ObjectChangedError`,
        never a mixture of versions. Pins travel with the location to worker processes. A Hub
        location needs none: it reads one commit, whose files never change (and the CDN it is
        redirected to answers with ETags of its own)."""
        if etag and self.hub is None:
            self.pins.setdefault(name, etag)

    def _checked_etag(self, name: str, etag: str | None) -> None:
        """Compare an answer's ETag with the pin (pinning it if this is the first answer)."""
        if not etag or self.hub is not None:
            return
        pinned = self.pins.setdefault(name, etag)
        if pinned != etag:
            raise ObjectChangedError(
                f"{self.name_url(name)}: the object changed since this dataset was opened "
                f"(ETag {etag} instead of {pinned}); reading on would mix two versions of "
                f"the data: {self.changed_remedy}"
            )

    def identity(self) -> str:
        """The URL plus the endpoint that serves it: two endpoints may hold the same bucket name."""
        return f"{self.url}|{endpoint_of(self.scheme, self.storage_options)[0] or ''}"

    def versions(self, purpose: str = "meta") -> dict[str, str]:
        """name -> ETag of every object under this folder, from listings (empty where the store
        cannot list, as plain HTTP servers cannot)."""
        if self.scheme == "http":
            return {}
        return self.client(purpose).versions()

    @property
    def shown(self) -> str:
        """The folder as messages name it: the URL, or for the Hub ``hf://...@COMMIT/path``."""
        return self.hub.shown if self.hub is not None else self.url

    def __repr__(self) -> str:
        return f"Location({self.shown!r})"

    def child(self, name: str) -> "Location":
        child = Location.__new__(Location)
        child.__setstate__({**self.__getstate__(), "url": join(self.url, name), "pins": {}})
        if self.hub is not None:  # the same commit, one folder down
            from dataclasses import replace

            where = replace(self.hub.where, path="/".join(p for p in (self.hub.where.path, name.strip("/")) if p))
            child.hub = replace(self.hub, where=where)
        return child

    def name_url(self, name: str) -> str:
        """The URL of ``name`` as messages name it (the Hub: ``hf://...@COMMIT/path/name``)."""
        return join(self.shown, name) if name else self.shown

    # -- clients ---------------------------------------------------------------------------------
    def _env_key(self) -> tuple:
        return tuple(os.environ.get(k) for k in CREDENTIAL_ENV)

    def rebuild(self) -> None:
        with self._lock:
            self._clients.clear()

    def client(self, purpose: str = "data") -> Client:
        """This process's client (built again when the credential variables change). ``purpose``
        is kept for callers that name what they read; every read goes through obstore."""
        check_not_inherited(self.url)
        pid, env = os.getpid(), self._env_key()
        hit = self._clients.get("obstore")
        if hit is None or hit[0] != pid or hit[1] != env:
            with self._lock:
                hit = self._clients.get("obstore")
                if hit is None or hit[0] != pid or hit[1] != env:
                    if hit is None or hit[1] != env:
                        self._check_endpoint()  # AWS_ENDPOINT_URL may have changed since
                    hit = self._clients["obstore"] = (pid, env, self._build())
        return hit[2]

    def _build(self) -> Client:
        """A new client. One that cannot be built (obstore refusing a credential file, an option
        of the wrong type) is an error naming the URL, redacted, raised outside the ``except``
        block: the library's error, which may quote the credential, is chained to nothing."""
        try:
            import obstore  # noqa: F401
        except ImportError:
            raise RemoteError(
                f"{self.url}: reading object storage needs obstore: pip install 'mmloader[remote]'"
            ) from None
        try:
            return _ObstoreClient(self)
        except MMLoaderError:
            raise
        except Exception as e:
            failed: tuple[type[Exception], str] = (
                ValueError if isinstance(e, (ValueError, TypeError)) else RemoteError,
                short_message(e),
            )
        cls, detail = failed
        raise cls(redact(f"{self.url}: cannot set up the obstore client: {detail}", self.storage_options))

    def _said(self, request: Callable[[], T]) -> T:
        """``request()``; on a Hub location, a read refused or not found is said as the Hub's
        API says it (the repository gone, access lost), the files' client seeing a bare status."""
        if self.hub is None:
            return request()
        try:
            return request()
        except (FileNotFoundError, RemoteError) as e:
            failed = e
        refused = _auth_error(failed) or bool(re.search(r"Unauthenticated|PermissionDenied|\b40[13]\b", str(failed)))
        if isinstance(failed, FileNotFoundError) or refused:  # an answer: not an outage, a fork refusal...
            check_repo(self.hub, self.policy, refused)  # raises what is wrong with the repository, if anything
        raise failed

    # -- requests (each retried under the policy) --------------------------------------------------
    def get(self, name: str, purpose: str = "data") -> bytes:
        """The whole object ``name`` (relative to this folder)."""
        return self._said(lambda: self.client(purpose).get(name))

    def get_ranges(self, requests: Sequence[tuple[str, int, int]], purpose: str = "data") -> list:
        """``[(name, start, end), ...]`` -> the bytes of each range, fetched concurrently. Each
        answer is checked to have exactly ``end - start`` bytes (a short body is retried)."""
        if not requests:
            return []
        return self._said(lambda: self.client(purpose).get_ranges(list(requests)))

    def start_ranges(self, requests: Sequence[tuple[str, int, int]], purpose: str = "data"):
        """:meth:`get_ranges` started in the background: a ``concurrent.futures.Future`` of the list."""
        return self.client(purpose).start_ranges(list(requests))

    def start_range(self, name: str, start: int, end: int, purpose: str = "data"):
        """Start fetching bytes ``[start, end)`` of ``name`` in the background: a
        ``concurrent.futures.Future`` of them."""
        return self.client(purpose).start_range(name, start, end)

    def get_many(self, names: Sequence[str], purpose: str = "data") -> list[bytes]:
        """Several whole objects, concurrently."""
        return self._said(lambda: self.client(purpose).get_many(list(names)))

    def size(self, name: str, purpose: str = "data") -> int | None:
        """The object's size in bytes, or None if there is no such object."""
        return self.head(name, purpose)[0]

    def head(self, name: str, purpose: str = "data") -> tuple[int | None, str | None]:
        """(size, etag) of the object, (None, None) if there is none."""
        return self._said(lambda: self.client(purpose).head(name))

    def exists(self, name: str, purpose: str = "data") -> bool:
        return self.head(name, purpose)[0] is not None

    def list(self, prefix: str = "", purpose: str = "data") -> list[tuple[str, int]]:
        """(name relative to this folder, size) of every object under ``prefix``."""
        if self.hub is not None:  # the Hub's tree API, at the pinned commit
            return list_files(self.hub, prefix, self.policy)
        return self.client(purpose).list(prefix)

    def check_writable(self) -> None:
        """Raise where this location cannot be written (a Hub dataset), saying what to do instead."""
        if self.hub is not None:
            raise RemoteError(
                f"{self.hub.shown}: mmloader reads Hub datasets, it does not write them: write the dataset "
                "to a local folder and upload it (`hf upload ORG/NAME FOLDER --repo-type dataset`)"
            )

    def put_file(self, name: str, local: str | os.PathLike, purpose: str = "data") -> None:
        self.check_writable()
        self.client(purpose).put_file(name, str(local))

    def put_bytes(self, name: str, data: bytes, purpose: str = "data") -> None:
        self.check_writable()
        self.client(purpose).put_bytes(name, data)

    def delete(self, name: str, purpose: str = "data") -> None:
        self.check_writable()
        self.client(purpose).delete(name)

    def download(
        self,
        name: str,
        fd: int,
        size: int,
        progress: Callable[[int], None] | None = None,
        chunk: int = 16 << 20,
        purpose: str = "data",
    ) -> None:
        """Write object ``name`` (``size`` bytes) into the open file ``fd`` by concurrent ranged
        reads of ``chunk`` bytes (each retried on its own: a reset costs one chunk, not the file)."""
        parts = [(name, a, min(a + chunk, size)) for a in range(0, size, chunk)]
        client = self.client(purpose)
        if len(parts) <= 1:  # one request: a whole GET, which a server without Range serves too
            data = memoryview(client.get(name)) if size else memoryview(b"")
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            if progress is not None:
                progress(size)
            return
        for i in range(0, len(parts), 8):  # at most 8 chunks (128 MiB) in memory at once
            group = parts[i : i + 8]
            for (_n, a, b), data in zip(group, client.get_ranges(group)):
                view = memoryview(data)
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], a + done)
                if progress is not None:
                    progress(b - a)
