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
temporary credentials themselves. S3 credentials of an AWS profile, which obstore does not read,
are resolved by botocore and given to it (:func:`~.sigv4.profile_credentials`). An
``http(s)://user:password@host/`` URL's credentials become an ``Authorization: Basic`` header
(``storage_options["default_headers"]``, which every client sends, as it sends
``storage_options["headers"]``) and leave the URL; other schemes refuse credentials in the URL,
and every scheme refuses ``storage_options`` no client reads. The endpoint is checked wherever
it is given (``storage_options``, ``AWS_ENDPOINT_URL``): credentials in it, or a port that is no
number, are refused at once.

**What is shown.** Every message, log line, progress bar and ``repr`` names a URL without its
credentials, and no secret of ``storage_options`` or the environment: :mod:`.redaction` holds the
one rule (:func:`redact_url`, :func:`redact`), :class:`_Deadline` applies it to what it raises and
logs, and a filter on the ``mmloader`` logger to every record.

**Retries.** Timeouts, connection errors and resets, 5xx, 408/429/503 and short bodies are
retried with exponential backoff and full jitter until ``retry_deadline`` seconds have passed
without success; then :class:`RemoteUnavailableError` names the URL and the last error. A
missing object is :class:`FileNotFoundError` at once, other 4xx answers are not retried (401 and
403 after one rebuild of the client: rotated credentials are read again); a missing bucket, an
invalid bucket name or refused access is a :class:`RemoteError` at once that names what the server
said (``no such bucket 'b' (the server says NoSuchBucket: ...)``), and so is a host name that does
not resolve (``the host name 'h' does not resolve``). A failure to connect (refused, a resolver
that does not answer, a connect timed out) to a host that has not answered this process yet is
retried for ``first_contact_deadline`` seconds only (default 5): then :class:`HostUnreachable`
names the host, the reason and what to check; once a host has answered (any HTTP answer), a
failure to connect to it is a server restarting, retried for the whole ``retry_deadline``.


**Where things live.** :mod:`.urls` (URL helpers), :mod:`.redaction` (what is shown),
:mod:`.errors`, :mod:`.failures` (which failures are retried), :mod:`.servers` (which hosts answered),
:mod:`.retry` (the policy, deadlines),
:mod:`.runtime` (which client a process may use, the event loop, background threads), :mod:`.location` (:class:`Location`), :mod:`.client` (the
:class:`Client` protocol every client implements), one module per client
(:mod:`.obstore_client`, :mod:`.simple_client`, :mod:`.fsspec_client`), :mod:`.sigv4` (S3
signing for the standard-library client) and :mod:`.ranges` (coalescing, length checks). This
module re-exports their names: ``from mmloader.storage.remote import Location`` works as before.
"""

from __future__ import annotations

from .client import _CLIENT_OPTION_KEYS, Client, _Client
from .errors import (
    ConnectFailed,
    HostNotFound,
    HostUnreachable,
    LongBody,
    ObjectChangedError,
    RemoteError,
    RemoteUnavailableError,
    ShortBody,
    _HTTPStatus,
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
from .fsspec_client import _FsspecClient
from .location import CREDENTIAL_ENV, Location
from .obstore_client import _OBSTORE_CONFIG_KEYS, _ObstoreClient
from .ranges import _check_length, coalesce
from .redaction import redact, redact_text, redact_url, remember_secrets, scrub, secret_values, userinfo_end
from .retry import Policy, _Deadline
from .runtime import (
    _background,
    _mark_obstore,
    _settle_at_exit,
    event_loop,
    fsspec_usable,
    obstore_inherited,
    obstore_started_here,
    obstore_usable,
    run,
)
from .servers import Server, answered, forget_answers, location_server, mark_answered, server_of
from .sigv4 import _botocore_credentials, sigv4_headers, static_s3_credentials
from .simple_client import _SimpleClient
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
    "HostNotFound",
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
    "fsspec_usable",
    "is_url",
    "join",
    "lower_scheme",
    "obstore_inherited",
    "obstore_started_here",
    "obstore_usable",
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
    "sigv4_headers",
    "split_userinfo",
    "static_s3_credentials",
    "transient",
    "unresolved_host",
    "userinfo_end",
]
