"""What mmloader shows of URLs and credentials: one rule for every message it prints, logs,
raises or stores.

* :func:`redact_url`: a URL with its credentials replaced by ``***`` — the password of its
  userinfo (``http://user:***@host/``; a bare user name, which may be a token, as ``***@``
  except in Azure's ``container@account`` form) and the values of query parameters that carry
  signatures or tokens (``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``,
  ``X-Goog-Signature``, an Azure SAS's ``sig``, ``token``, ``access_token``, ``api_key``,
  ``key``, ``password``...; names compared case-insensitively).
* :func:`redact_text`: every URL inside a message redacted so, plus ``Authorization:`` and
  ``Bearer`` values and the request echoes of S3 error answers (``<StringToSign>``,
  ``<CanonicalRequest>``, ``<SignatureProvided>``).
* :func:`secret_values` and :func:`scrub`: the credentials this process knows — the secret
  ``storage_options`` (keys, tokens, SAS, passwords, ``Authorization`` headers) and the
  environment's (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AZURE_STORAGE_ACCOUNT_KEY``,
  ``AZURE_STORAGE_SAS_TOKEN``, the account key of ``AZURE_STORAGE_CONNECTION_STRING``,
  ``GOOGLE_SERVICE_ACCOUNT_KEY``, ``HF_TOKEN``, any ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``,
  ``*_KEY``, ``*_CREDENTIALS`` that is not the path of a file) — replaced wherever they appear
  in a message, e.g. a server's error body that echoes a request.
* :func:`redact`: all of the above, the one call for a message; :data:`LOG_FILTER` applies it to
  every record of the ``mmloader`` logger.

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

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}|\\]+")  # "|" is no URL character
_AZURE_SCHEMES = {"az", "azure", "abfs", "abfss"}
_AUTH_HEADER = re.compile(r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:([\w-]+)\s+)?([^\s\"',;()<>\[\]{}]+)")
_BEARER = re.compile(r"\bBearer\s+[A-Za-z0-9._~+/-]+=*")
_SIGNATURE = re.compile(r"\b(Signature=)[0-9a-fA-F]{16,}")
_S3_ECHO = re.compile(
    r"<(StringToSign|StringToSignBytes|CanonicalRequest|CanonicalRequestBytes|SignatureProvided)>.*?</\1>", re.S
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


def redact_url(url: str) -> str:
    """``url`` with its credentials replaced by ``***``: a userinfo password (``user:***@``), a
    bare user name (``***@``: it may be a token; Azure's ``container@account`` is kept), and the
    values of query or fragment parameters that carry signatures or tokens. Anything that is not
    a ``scheme://`` URL is returned as it is.

    Args:
        url: the URL to show.

    >>> redact_url("http://user:pw@127.0.0.1:9000/ds"), redact_url("https://ghp_x@host/r")
    ('http://user:***@127.0.0.1:9000/ds', 'https://***@host/r')
    >>> redact_url("https://acct.blob.core.windows.net/c/x?sv=2022-11-02&se=2030-01-01&sp=r&sig=AbC%2B")
    'https://acct.blob.core.windows.net/c/x?sv=2022-11-02&se=2030-01-01&sp=r&sig=***'
    >>> redact_url("abfs://container@account.dfs.core.windows.net/ds"), redact_url("data/ds")
    ('abfs://container@account.dfs.core.windows.net/ds', 'data/ds')
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return url
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i >= 0:
            end = min(end, i)
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            authority = f"{user}:{REDACTED}@{host}"
        elif scheme.lower() not in _AZURE_SCHEMES:
            authority = f"{REDACTED}@{host}"
    path, hash_, fragment = tail.partition("#")  # a fragment follows the query
    path, qmark, query = path.partition("?")
    query = _redact_params(query)
    fragment = _redact_params(fragment) if "=" in fragment else fragment
    return f"{scheme}://{authority}{path}{qmark}{query}{hash_}{fragment}"


def redact_text(text: str) -> str:
    """Every URL in ``text`` through :func:`redact_url`, and the credentials requests carry:
    ``Authorization:`` values, ``Bearer`` tokens, and the request echoes of S3 error answers.

    Args:
        text: a message, log line or report.

    >>> redact_text("GET http://u:pw@h/x failed (Authorization: Basic dTpwdw==)")
    'GET http://u:***@h/x failed (Authorization: Basic ***)'
    """
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{REDACTED}", text)
    if "Bearer" in text:
        text = _BEARER.sub(f"Bearer {REDACTED}", text)
    if "Signature=" in text:  # an AWS SigV4 header's signature
        text = _SIGNATURE.sub(lambda m: m.group(1) + REDACTED, text)
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


def secret_values(storage_options: Mapping | None = None, environ: Mapping[str, str] | None = None) -> set[str]:
    """The credentials to scrub from messages: the secret ``storage_options`` (by name: keys,
    tokens, SAS, passwords, credentials; ``Authorization``-like ``default_headers``) and the
    environment's (:data:`SECRET_ENV`, and any variable named ``*_TOKEN``, ``*_SECRET``,
    ``*_PASSWORD``, ``*_KEY``, ``*_CREDENTIALS``, unless its value is the path of a file), each
    at least :data:`MIN_SECRET_LENGTH` long.

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
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH}


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
