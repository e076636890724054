"""What mmloader shows of URLs and credentials: one rule for every message it prints, logs,
raises or stores.

* :func:`redact_url`: a URL with its credentials replaced by ``***`` — the password of its
  userinfo (``http://user:***@host/``; a bare user name, which may be a token, as ``***@``
  except in Azure's ``container@account`` form; one holding a raw ``/``, ``?`` or ``#`` too:
  :func:`userinfo_end`) and the values of query parameters that carry
  signatures or tokens (``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``,
  ``X-Goog-Signature``, an Azure SAS's ``sig``, ``token``, ``access_token``, ``api_key``,
  ``key``, ``password``...; names compared case-insensitively).
* :func:`redact_text`: every URL inside a message redacted so (a password holding a space,
  quote, bracket or ``|`` included), plus ``Authorization:`` and
  ``Bearer`` values and the request echoes of S3 error answers (``<StringToSign>``,
  ``<CanonicalRequest>``, ``<SignatureProvided>``).
* :func:`secret_values` and :func:`scrub`: the credentials this process knows — the secret
  ``storage_options`` (keys, tokens, SAS, passwords, ``Authorization`` headers) and the
  environment's (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AZURE_STORAGE_ACCOUNT_KEY``,
  ``AZURE_STORAGE_SAS_TOKEN``, the account key of ``AZURE_STORAGE_CONNECTION_STRING``,
  ``GOOGLE_SERVICE_ACCOUNT_KEY``, ``HF_TOKEN``, any ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``,
  ``*_KEY``, ``*_CREDENTIALS`` that is not the path of a file) — replaced wherever they appear
  in a message, e.g. a server's error body that echoes a request; and those a client resolved
  itself (an AWS profile's keys and token, :func:`remember_secrets`).
* :func:`redact`: all of the above, the one call for a message (redacting twice changes nothing
  more); :data:`LOG_FILTER` applies it to every record of the ``mmloader`` logger.

>>> redact_url("https://alice:pa55word@host:8080/ds?X-Amz-Signature=abc123&part=1")
'https://alice:***@host:8080/ds?X-Amz-Signature=***&part=1'
>>> redact("GET https://host/ds?sig=abc failed: the server said Bearer s3cr3t-t0ken-value", {})
'GET https://host/ds?sig=*** failed: the server said Bearer ***'
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
from typing import Iterable, Mapping

#: What a redacted credential is shown as.
REDACTED = "***"
#: Secret values shorter than this are not scrubbed from free text (they would mangle ordinary
#: words); inside URLs, userinfo and query credentials are redacted whatever their length.
MIN_SECRET_LENGTH = 8

#: Query parameter names whose values are credentials, lower-case (presigned S3 and GCS URLs,
#: Azure SAS tokens, OAuth and API tokens).
SECRET_PARAMS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "signature",
        "sig",
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "api_key",
        "apikey",
        "key",
        "code",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "pwd",
        "auth",
        "authorization",
    }
)
#: Words that make any parameter, option or variable name a credential's (``X-Ms-Token``,
#: ``session_token``, ``sas_key``...).
_SECRET_WORDS = re.compile(r"signature|token|secret|passw|credential|key$|sas|cookie|auth", re.I)
#: Environment variables read as credentials besides those :data:`_SECRET_WORDS` names.
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_CREDENTIALS",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)
_ENV_WORDS = re.compile(r"(?:TOKEN|SECRET|PASSWORD|PASSWD|_KEY|CREDENTIALS?|CONNECTION_STRING)$")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
#: Where a URL starts in free text (``scheme://``).
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: The characters a URL in free text goes on with ("|" is no URL character: the cache marker's
#: tag joins a URL and an endpoint with it).
_URL_CHARS = re.compile(r"[^\s'\"<>()\[\]{}|\\]*")
#: What ends a URL's authority (``scheme://AUTHORITY/...``), and in free text what ends it too.
_AUTHORITY_END = re.compile(r"[/?#]")
_AUTHORITY_END_IN_TEXT = re.compile(r"[/?#\s'\"<>()\[\]{}|\\]")
#: An authority without userinfo: a host name (letters, digits, ``. - _ ~ %``) or an ``[IPv6]``
#: address, and an optional port.
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]*\]|[A-Za-z0-9._~%-]*)(?::\d*)?")
#: What follows the ``@`` that ends a userinfo holding a ``/``, ``?``, ``#`` (or, in free text, a
#: space, quote, bracket or ``|``): a host, an optional port, then the end of the authority.
_HOST_AFTER_AT = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9._~%-]*)(?::\d+)?(?=$|[/?#\s\"'<>()\[\]{}|\\,;]|:(?=\s|$))"
)
_AZURE_SCHEMES = {"az", "azure", "abfs", "abfss"}
_AUTH_HEADER = re.compile(r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:([\w-]+)\s+)?([^\s\"',;()<>\[\]{}]+)")
_BEARER = re.compile(r"\bBearer\s+[A-Za-z0-9._~+/-]+=*")
_SIGNATURE = re.compile(r"\b(Signature=)[0-9a-fA-F]{16,}")
_CREDENTIAL = re.compile(r"(?i)\b(Credential\s*=\s*)[^\s,;\"'<>]+")  # a SigV4 scope: the access key ID first
_S3_ECHO = re.compile(
    r"<(StringToSign|StringToSignBytes|CanonicalRequest|CanonicalRequestBytes|SignatureProvided|AWSAccessKeyId)>"
    r".*?</\1>",
    re.S,
)


def _secret_name(name: str) -> bool:
    return name.lower() in SECRET_PARAMS or _SECRET_WORDS.search(name) is not None


def _redact_params(text: str) -> str:
    """``a=1&sig=x`` -> ``a=1&sig=***`` (separators and order kept; nothing re-encoded)."""
    out = []
    for pair in re.split(r"([&;])", text):
        name, eq, value = pair.partition("=")
        out.append(f"{name}={REDACTED}" if eq and value and _secret_name(name) else pair)
    return "".join(out)


def userinfo_end(rest: str, in_text: bool = False) -> int | None:
    """Where the userinfo of a URL ends: the index in ``rest`` (what follows ``scheme://``) of the
    ``@`` that ends it, or None when the URL has none.

    The userinfo is what precedes the last ``@`` of the authority (up to the first ``/``, ``?``
    or ``#``), so that an ``@`` in a key (``s3://bucket/k@y``) is not one. A password holding a
    raw ``/``, ``?`` or ``#`` (or, in free text, ``in_text``, a space, quote, bracket or ``|``)
    ends that authority early, leaving something no host looks like (``alice:ab`` of
    ``http://alice:ab/cd@host/``): then the userinfo runs to the first ``@`` after which a host
    (and port) ends the authority, on the same line, and never across another ``://``.

    Args:
        rest: the URL after its ``scheme://`` (in free text, up to the end of the line or text).
        in_text: ``rest`` is followed by free text (a message), not the end of the URL.

    >>> userinfo_end("alice:pw@host/ds"), userinfo_end("bucket/k@y"), userinfo_end("alice:ab/cd@host:9/x@y")
    (8, None, 11)
    """
    if "@" not in rest:
        return None
    m = (_AUTHORITY_END_IN_TEXT if in_text else _AUTHORITY_END).search(rest)
    authority = rest[: m.start()] if m else rest
    at = authority.rfind("@")
    if at >= 0 and _HOST_PORT.fullmatch(authority[at + 1 :]):
        return at
    if at < 0 and _HOST_PORT.fullmatch(authority.rstrip(".,;:!")):
        return None  # a host: an "@" further on is in the path
    line = rest.split("\n", 1)[0]
    for j, c in enumerate(line):
        if c != "@":
            continue
        if "://" in line[:j]:
            break
        if _HOST_AFTER_AT.match(line, j + 1):
            return j
    return at if at >= 0 else None


def redact_url(url: str) -> str:
    """``url`` with its credentials replaced by ``***``: a userinfo password (``user:***@``), a
    bare user name (``***@``: it may be a token; Azure's ``container@account`` is kept), and the
    values of query or fragment parameters that carry signatures or tokens. A password holding
    a raw ``/``, ``?`` or ``#`` is found too (:func:`userinfo_end`). Anything that is not a
    ``scheme://`` URL is returned as it is; redacting twice changes nothing more.

    Args:
        url: the URL to show.

    >>> redact_url("http://user:pw@127.0.0.1:9000/ds"), redact_url("https://ghp_x@host/r")
    ('http://user:***@127.0.0.1:9000/ds', 'https://***@host/r')
    >>> redact_url("https://acct.blob.core.windows.net/c/x?sv=2022-11-02&se=2030-01-01&sp=r&sig=AbC%2B")
    'https://acct.blob.core.windows.net/c/x?sv=2022-11-02&se=2030-01-01&sp=r&sig=***'
    >>> redact_url("abfs://container@account.dfs.core.windows.net/ds"), redact_url("data/ds")
    ('abfs://container@account.dfs.core.windows.net/ds', 'data/ds')
    >>> redact_url("http://alice:ab/cd?ef#gh@127.0.0.1:9/ds")
    'http://alice:***@127.0.0.1:9/ds'
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return url
    at = userinfo_end(rest)
    shown = ""
    if at is not None:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, _password = userinfo.partition(":")
        if colon and not _AUTHORITY_END_IN_TEXT.search(user):
            shown = f"{user}:{REDACTED}@"
        elif colon or scheme.lower() not in _AZURE_SCHEMES:
            shown = f"{REDACTED}@"
        else:
            shown = f"{userinfo}@"
    m = _AUTHORITY_END.search(rest)
    host, tail = (rest[: m.start()], rest[m.start() :]) if m else (rest, "")
    path, hash_, fragment = tail.partition("#")  # a fragment follows the query
    path, qmark, query = path.partition("?")
    query = _redact_params(query)
    fragment = _redact_params(fragment) if "=" in fragment else fragment
    return f"{scheme}://{shown}{host}{path}{qmark}{query}{hash_}{fragment}"


def _redact_urls(text: str) -> str:
    """Every ``scheme://`` URL of free text through :func:`redact_url`. A URL goes on to the
    first space, quote, bracket or ``|`` — or, where its userinfo holds one of those (a password
    with a space), past it to the ``@`` that ends the userinfo (:func:`userinfo_end`); the
    punctuation that ends a sentence (``.,;:!?``) is not part of it."""
    out: list[str] = []
    done = 0
    for m in _URL_START.finditer(text):
        start, after = m.start(), m.end()
        if start < done:
            continue  # inside the URL just redacted
        at = userinfo_end(text[after:], in_text=True)
        host_from = after if at is None else after + at + 1
        end = _URL_CHARS.match(text, host_from).end()  # type: ignore[union-attr]  # always matches
        while end > host_from and text[end - 1] in ".,;:!?":
            end -= 1
        out.append(text[done:start])
        out.append(redact_url(text[start:end]))
        done = end
    out.append(text[done:])
    return "".join(out)


def redact_text(text: str) -> str:
    """Every URL in ``text`` through :func:`redact_url`, and the credentials requests carry:
    ``Authorization:`` values, ``Bearer`` tokens, and the request echoes of S3 error answers.
    Redacting twice changes nothing more.

    Args:
        text: a message, log line or report.

    >>> redact_text("GET http://u:pw@h/x failed (Authorization: Basic dTpwdw==)")
    'GET http://u:***@h/x failed (Authorization: Basic ***)'
    >>> redact_text("failed on http://alice:pa ss(w|rd@host/ds: boom")
    'failed on http://alice:***@host/ds: boom'
    >>> redact_text("403: <Auth>AWS4-HMAC-SHA256 Credential=AKIA0EXAMPLE/20261207/us-east-1/s3/aws4_request, x</Auth>")
    '403: <Auth>AWS4-HMAC-SHA256 Credential=***, x</Auth>'
    >>> redact_text("<Code>InvalidAccessKeyId</Code><AWSAccessKeyId>AKIA0EXAMPLE</AWSAccessKeyId>")
    '<Code>InvalidAccessKeyId</Code><AWSAccessKeyId>***</AWSAccessKeyId>'
    """
    if "://" in text:
        text = _redact_urls(text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{REDACTED}", text)
    if "Bearer" in text:
        text = _BEARER.sub(f"Bearer {REDACTED}", text)
    if "Signature=" in text:  # an AWS SigV4 header's signature
        text = _SIGNATURE.sub(lambda m: m.group(1) + REDACTED, text)
    if "redential" in text or "REDENTIAL" in text:  # and its credential scope, which names the access key ID
        text = _CREDENTIAL.sub(lambda m: m.group(1) + REDACTED, text)
    if "<" in text:
        text = _S3_ECHO.sub(lambda m: f"<{m.group(1)}>{REDACTED}</{m.group(1)}>", text)
    return text


def _pieces(value: object) -> Iterable[str]:
    """A credential's value and the parts of it that may be shown alone: the token of
    ``Bearer T``/``Basic T`` (and a Basic header's password), the secret fields of a
    connection string (``AccountKey=...;SharedAccessSignature=...``)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return
    value = value.strip()
    yield value
    scheme, _, token = value.partition(" ")
    if token and scheme.lower() in ("bearer", "basic", "token"):
        yield token.strip()
        if scheme.lower() == "basic":
            try:
                _user, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                password = ""
            if password:
                yield password
    if ";" in value and "=" in value:  # a connection string
        for field in value.split(";"):
            name, eq, inner = field.partition("=")
            if eq and _secret_name(name):
                yield inner
    if value.startswith("?") or ("&" in value and "=" in value):  # a SAS token
        for pair in value.lstrip("?").split("&"):
            name, eq, inner = pair.partition("=")
            if eq and _secret_name(name):
                yield inner


#: Credentials this process resolved itself (botocore's chain: a profile's keys and session
#: token), scrubbed like those of ``storage_options`` and the environment (:func:`remember_secrets`).
_RESOLVED: set[str] = set()


def remember_secrets(*values: object) -> None:
    """Scrub ``values`` from every message from now on: credentials a client resolved itself
    (a profile's secret key and session token), which neither ``storage_options`` nor the
    environment hold.

    Args:
        values: the credentials (None and values shorter than :data:`MIN_SECRET_LENGTH` are skipped).
    """
    for value in values:
        for piece in _pieces(value):
            if len(piece) >= MIN_SECRET_LENGTH:
                _RESOLVED.add(piece)


def secret_values(storage_options: Mapping | None = None, environ: Mapping[str, str] | None = None) -> set[str]:
    """The credentials to scrub from messages: the secret ``storage_options`` (by name: keys,
    tokens, SAS, passwords, credentials; ``Authorization``-like ``default_headers``) and the
    environment's (:data:`SECRET_ENV`, and any variable named ``*_TOKEN``, ``*_SECRET``,
    ``*_PASSWORD``, ``*_KEY``, ``*_CREDENTIALS``, unless its value is the path of a file), each
    at least :data:`MIN_SECRET_LENGTH` long; and the credentials this process resolved itself
    (:func:`remember_secrets`).

    Args:
        storage_options: the client settings of a location (None: only the environment's).
        environ: the environment (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in (storage_options or {}).items():
        if isinstance(value, Mapping):  # default_headers
            for header, inner in value.items():
                if _secret_name(str(header)):
                    found.update(_pieces(inner))
        elif _secret_name(str(name)):
            found.update(_pieces(value))
    for name, value in environ.items():
        # a variable naming a credentials file (GOOGLE_APPLICATION_CREDENTIALS) shows its path:
        # the file's content is the secret, and an error about the file needs the path
        if (name in SECRET_ENV or _ENV_WORDS.search(name)) and not (os.path.isabs(value) and os.path.isfile(value)):
            found.update(_pieces(value))
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH} | _RESOLVED


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (longest first, so a
    token inside a longer credential does not leave the rest of it behind).

    Args:
        text: a message.
        secrets: the values to remove (see :func:`secret_values`).
    """
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(text: str, storage_options: Mapping | None = None) -> str:
    """The one rule for any text mmloader shows: :func:`redact_text`, then the known secrets
    (:func:`secret_values` of ``storage_options`` and the environment) scrubbed.

    Args:
        text: a message, log line or report.
        storage_options: the client settings whose secrets to scrub too.
    """
    return scrub(redact_text(text), secret_values(storage_options))


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record's message through :func:`redact`: whatever a
    module of mmloader logs, no credential reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's to report
            return True
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, ()
        return True


#: The filter on the ``mmloader`` logger (installed when this module is imported).
LOG_FILTER = RedactingFilter()
if not any(isinstance(f, RedactingFilter) for f in logging.getLogger("mmloader").filters):
    logging.getLogger("mmloader").addFilter(LOG_FILTER)
