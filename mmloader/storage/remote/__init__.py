"""Object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``): URLs, the client,
retries.

One :class:`Location` per dataset URL: it pickles as ``(url, storage_options, policy)`` — never
a client, never credentials from the environment — and builds its client lazily, in the
process that makes the request.

**The client** is `obstore <https://developmentseed.org/obstore>`_ (Rust: S3/GCS/Azure/HTTP in
one package, requests without the GIL, proxies from ``HTTPS_PROXY``/``NO_PROXY`` or
``proxy_url``). Its runtime does not survive ``fork()``: a process forked from one that started
it is refused with the remedy, never left to hang, and ``mmloader.loader`` starts worker
processes with ``spawn`` when they read object storage this process has read. The Hub's API
(``hf://``: the revision, the file tree) is asked through ``huggingface_hub``
(:mod:`.hub`); its files are read by obstore like any HTTPS folder.

**Credentials** come from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_NAME``, ...) or
``storage_options``, and are re-resolved: a client is rebuilt when those variables change and
after an authentication error. An AWS profile, which obstore does not read, reaches it through
its ``Boto3CredentialProvider``. An ``http(s)://user:password@host/`` URL's credentials become an
``Authorization: Basic`` header and leave the URL; other schemes refuse credentials in the URL,
and every scheme refuses ``storage_options`` the client does not read.

**What is shown.** Every message, log line, progress bar and ``repr`` names a URL without its
credentials, and no secret of ``storage_options`` or the environment (:mod:`.redaction`).

**Retries.** Timeouts, connection errors and resets, 5xx, 408/429 and short bodies are retried
with exponential backoff and full jitter until ``retry_deadline`` seconds have passed without
success; then :class:`RemoteUnavailableError` names the URL and the last error. A missing object
is :class:`FileNotFoundError` at once; a missing bucket, refused access, a certificate that does
not verify or a host name that does not resolve is a :class:`RemoteError` at once that says so.
A host that has not answered this process yet and cannot be connected to is retried for
``first_contact_deadline`` seconds only: then :class:`HostUnreachable` names the host, the
reason and what to check (:mod:`.retry`, :mod:`.failures`, :mod:`.servers`).
"""

from __future__ import annotations

from .errors import (
    HostUnreachable,
    LongBody,
    ObjectChangedError,
    RemoteError,
    RemoteUnavailableError,
    ShortBody,
)
from .failures import (
    _OBSTORE_PERMANENT,
    S3_REFUSALS,
    _auth_error,
    _status,
    connect_failure,
    server_refusal,
    short_message,
    transient,
    unresolved_host,
)
from .location import CREDENTIAL_ENV, Client, Location
from .obstore_client import _CLIENT_OPTION_KEYS, _OBSTORE_CONFIG_KEYS, _ObstoreClient
from .ranges import _check_length, coalesce
from .redaction import redact, redact_text, redact_url, remember_secrets, scrub, secret_values, userinfo_end
from .retry import Policy, _Deadline
from .runtime import (
    _mark_obstore,
    _settle_at_exit,
    check_not_inherited,
    event_loop,
    obstore_inherited,
    obstore_started_here,
    run,
)
from .servers import Server, answered, forget_answers, location_server, mark_answered, server_of
from .urls import (
    SCHEMES,
    check_endpoint,
    check_url,
    endpoint_of,
    is_url,
    join,
    lower_scheme,
    parent_and_name,
    scheme_of,
    split_userinfo,
)

__all__ = [
    "CREDENTIAL_ENV",
    "Client",
    "HostUnreachable",
    "Location",
    "LongBody",
    "ObjectChangedError",
    "Policy",
    "RemoteError",
    "RemoteUnavailableError",
    "S3_REFUSALS",
    "SCHEMES",
    "ShortBody",
    "check_endpoint",
    "check_url",
    "coalesce",
    "endpoint_of",
    "event_loop",
    "is_url",
    "join",
    "lower_scheme",
    "check_not_inherited",
    "obstore_inherited",
    "obstore_started_here",
    "parent_and_name",
    "redact",
    "redact_text",
    "redact_url",
    "remember_secrets",
    "run",
    "scheme_of",
    "scrub",
    "secret_values",
    "server_refusal",
    "short_message",
    "split_userinfo",
    "transient",
    "unresolved_host",
    "userinfo_end",
]
