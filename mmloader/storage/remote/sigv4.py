"""S3 request signing for the standard-library client: static credentials (``storage_options``,
the environment, or botocore's chain when installed) and AWS Signature Version 4 headers."""

from __future__ import annotations

import os
import time
from typing import Any, Literal


def static_s3_credentials(options: dict) -> tuple[str, str, str | None] | None | Literal[True]:
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


#: What botocore's answer depends on: a change of any of these asks it again at once.
_BOTO_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)
_BOTO: tuple[float, tuple, Any] = (0.0, (), None)
#: How botocore found credentials that obstore finds by itself (the environment, an instance's
#: or a container's role, web identity); from anywhere else (a profile in the shared files, SSO,
#: a credential process, an assumed role) obstore is given them (:func:`profile_credentials`).
OBSTORE_RESOLVES = frozenset({"env", "iam-role", "container-role", "assume-role-with-web-identity"})


def _botocore_resolved() -> tuple[str, str, str | None, str] | None:
    """(key, secret, token, how found) from botocore's chain (profiles, SSO, instance or container
    roles) when it is installed; asked again every 5 minutes (temporary credentials expire) and
    whenever the variables botocore reads change. What it finds is scrubbed from every message
    (:func:`~.redaction.remember_secrets`)."""
    global _BOTO
    env = tuple(os.environ.get(k) for k in _BOTO_ENV)
    if time.monotonic() - _BOTO[0] < 300 and _BOTO[1] == env:
        return _BOTO[2]
    try:
        import botocore.session

        creds = botocore.session.get_session().get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        value = (
            (frozen.access_key, frozen.secret_key, frozen.token, str(getattr(creds, "method", "") or ""))
            if frozen and frozen.access_key and frozen.secret_key
            else None
        )
    except Exception:  # not installed, or no credentials anywhere
        value = None
    if value is not None:
        from .redaction import remember_secrets

        remember_secrets(*value[:3])
    _BOTO = (time.monotonic(), env, value)
    return value


def _botocore_credentials() -> tuple[str, str, str | None] | None:
    """(key, secret, token) from botocore's chain (see :func:`_botocore_resolved`), or None."""
    found = _botocore_resolved()
    return found[:3] if found is not None else None


def profile_credentials(options: dict) -> dict[str, str]:
    """S3 settings for obstore, which reads no AWS profile: the credentials botocore resolves
    from a profile (``AWS_PROFILE``, the shared credentials and config files, SSO, a credential
    process, an assumed role) as ``access_key_id``, ``secret_access_key`` and ``session_token``;
    empty where ``options`` or the environment give credentials, requests are unsigned, or
    botocore found them where obstore looks too (:data:`OBSTORE_RESOLVES`)."""
    if str(options.get("skip_signature", os.environ.get("AWS_SKIP_SIGNATURE", ""))).lower() in ("true", "1"):
        return {}
    if options.get("access_key_id") or options.get("secret_access_key") or os.environ.get("AWS_ACCESS_KEY_ID"):
        return {}
    found = _botocore_resolved()
    if found is None or found[3] in OBSTORE_RESOLVES:
        return {}
    key, secret, token, _how = found
    return {"access_key_id": key, "secret_access_key": secret, **({"session_token": token} if token else {})}


def sigv4_headers(
    method: str,
    host: str,
    path: str,
    region: str,
    creds: tuple[str, str, str | None],
    now: float | None = None,
    query: str = "",
) -> dict[str, str]:
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
    canonical = "\n".join(
        [method, path, query, "".join(f"{k}:{headers[k]}\n" for k in names), ";".join(names), payload]
    )
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in headers.items() if k != "host"}
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out
