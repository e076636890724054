"""Nothing private leaks into what mmloader prints, logs, raises or writes (issue #34).

Credentials are given the three ways users give them — in URLs (``http://user:password@host/``),
in the environment (AWS, Azure, Hugging Face) and in ``storage_options`` (S3 keys and a session
token, an ``Authorization: Bearer`` header) — and the CLI (``python -m mmloader.cli``, a real
process) and the Python API are run through their failure paths against real servers on
127.0.0.1 (moto's S3, a Range HTTP server that wants a password or a token, a fault proxy): a
missing object, refused credentials, a host name that does not resolve, a server answering 403
or 500 with a body that echoes the credentials it was sent, an upload that fails, an upload
killed half-way. Every byte printed (stdout, stderr), logged (caplog), raised (messages and
tracebacks) and written (the objects on the server, the checkpoint, the output dataset's
metadata, the shard cache) is scanned for every secret, and for the encodings a request carries
them in (a Basic header's base64, percent-escapes)."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import make_samples, write_dataset, write_pairs_folder
from remote_servers import FaultProxy, RangeServer, own_cache, s3  # noqa: F401  (fixtures)

import mmloader
from mmloader.storage import remote
from mmloader.storage.remote import RemoteError, redact, redact_url, secret_values

pytest.importorskip("moto.server")
pytest.importorskip("obstore")

ROOT = Path(__file__).resolve().parents[1]
USER = "alice"
PASSWORD = "pa55-W0rd-in-the-URL"
WRONG_PASSWORD = "wr0ng-pa55-W0rd"
ENV = {  # in the environment of this process and of every CLI run
    "AWS_SECRET_ACCESS_KEY": "env-AWS-SECRET-access-key-0123",
    "AWS_SESSION_TOKEN": "env-AWS-SESSION-token-4567",
    "HF_TOKEN": "hf_env-HUGGING-face-token-999",
    "AZURE_STORAGE_ACCOUNT_KEY": "env-AZURE-account-key-888==",
}
OPTIONS = {  # given as storage_options
    "access_key_id": "AKIDOPTIONS",
    "secret_access_key": "options-SECRET-access-key-89",
    "session_token": "options-SESSION-token-0246",
}
BEARER = "options-BEARER-token-1357"
WRONG_BEARER = "wr0ng-BEARER-token-2468"
SECRETS = [
    OPTIONS["access_key_id"],  # not a secret alone, but it names the account: never shown (issue 60)
    PASSWORD,
    WRONG_PASSWORD,
    *ENV.values(),
    OPTIONS["secret_access_key"],
    OPTIONS["session_token"],
    BEARER,
    WRONG_BEARER,
]
#: ... and the forms a request carries them in
FORBIDDEN = sorted(
    {
        *SECRETS,
        *(quote(s, safe="") for s in SECRETS),
        *(base64.b64encode(f"{USER}:{p}".encode()).decode() for p in (PASSWORD, WRONG_PASSWORD)),
    }
)


def assert_clean(data: str | bytes, where: str) -> None:
    """No secret, in any form, anywhere in ``data``."""
    blob = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
    found = [s for s in FORBIDDEN if s.encode() in blob]
    if found:
        at = blob.find(found[0].encode())
        context = blob[max(at - 300, 0) : at + 100].decode("utf-8", "replace")
        raise AssertionError(f"{where} shows {found}: ...{context}...")


#: Where the errors of HTTP libraries keep a request or an answer (aiohttp's request_info holds
#: the request's headers).
CARRIERS = ("request_info", "headers", "response", "request", "body", "history", "os_error", "args")


def shown(e: BaseException) -> str:
    """Everything a user, a traceback or a debugger reaches of an error: its message, the whole
    printed traceback, and the ``str`` and ``repr`` of every error chained to it, by
    ``__cause__`` or ``__context__`` (suppressed or not), with the attributes in which client
    libraries keep requests and answers (:data:`CARRIERS`)."""
    parts = [str(e), "".join(traceback.format_exception(e))]
    todo, seen = [e], []
    while todo:
        cur = todo.pop()
        if any(cur is x for x in seen):
            continue
        seen.append(cur)
        parts += [str(cur), repr(cur)]
        parts += [repr(getattr(cur, name, None)) for name in CARRIERS]
        todo += [c for c in (cur.__cause__, cur.__context__) if c is not None]
    return "\n".join(parts)


@pytest.fixture(autouse=True)
def secret_env(monkeypatch, s3):
    """The secrets in the environment (moto accepts any key and token)."""
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENVIRONMENT")


@pytest.fixture(scope="module")
def site(tmp_path_factory, s3):
    """A dataset served over HTTP behind a password, one behind a bearer token, and on S3."""
    root = tmp_path_factory.mktemp("site")
    write_dataset(root / "ds", 10, "tar", shard_size=4)
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    locked, tokened = RangeServer(root, authorization=basic), RangeServer(root, authorization=f"Bearer {BEARER}")
    host = locked.url.removeprefix("http://")
    yield {
        "local": root / "ds",
        "url": f"http://{USER}:{PASSWORD}@{host}/ds",
        "wrong": f"http://{USER}:{WRONG_PASSWORD}@{host}/ds",
        "shown": f"{locked.url}/ds",
        "server": locked,
        "bearer": f"{tokened.url}/ds",
        "s3": s3.upload(root / "ds", "secure-ds"),
    }
    locked.stop()
    tokened.stop()


@pytest.fixture
def proxy(s3):
    """moto behind a proxy that can answer 403 or 500 with the credentials it got in the body."""
    p = FaultProxy(f"127.0.0.1:{s3.port}")
    yield p
    p.stop()


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60) -> tuple[int, str, float]:
    """``python -m mmloader.cli ARGS``: (exit status, everything it printed, seconds)."""
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "mmloader.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "MMLOADER_RETRY_DEADLINE": "1", "MMLOADER_CACHE_DIR": str(cwd / "cache"), **(env or {})},
    )
    printed = p.stdout + p.stderr
    assert_clean(printed, f"`mmloader {' '.join(redact_url(a) for a in args)}`")
    return p.returncode, printed, time.monotonic() - started


def objects(s3, prefix: str) -> dict[str, bytes]:
    c = s3.client()
    return {k: c.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in s3.keys(prefix)}


# -- the CLI -------------------------------------------------------------------------------------------------
def test_the_cli_reads_urls_with_a_password_and_fails_showing_no_credential(site, tmp_path):
    url, host = site["url"], site["shown"].removesuffix("/ds")
    code, out, _ = run_cli("inspect", url, "-n", "1", cwd=tmp_path)
    assert code == 0 and f"path:    {site['shown']}\n" in out and "samples: 10" in out, out
    code, out, _ = run_cli("verify", url, "-q", cwd=tmp_path)
    assert code == 0 and f"{site['shown']}: 10 samples checked, no problems" in out, out
    assert site["server"].seen[-1] == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    code, out, _ = run_cli("inspect", url.replace("/ds", "/nope"), cwd=tmp_path)  # a missing object
    assert code == 1 and f"{host}/nope has no index.json" in out, out
    code, out, seconds = run_cli("inspect", site["wrong"], cwd=tmp_path, env={"MMLOADER_RETRY_DEADLINE": "60"})
    assert code == 1 and "access denied (HTTP 401)" in out and seconds < 20, out  # refused, not retried
    code, out, seconds = run_cli(
        "verify",
        f"http://{USER}:{PASSWORD}@no-such-host.invalid:9/ds",
        cwd=tmp_path,
        env={"MMLOADER_RETRY_DEADLINE": "60"},
    )  # was: the password as a host name, retried for 2 minutes, printed on every retry line
    assert code == 1 and "the host name 'no-such-host.invalid' does not resolve" in out and seconds < 20, out


@pytest.mark.parametrize("status", [403, 500])
def test_the_cli_against_a_server_echoing_credentials_shows_none(site, proxy, tmp_path, status):
    """A 403 (S3's SignatureDoesNotMatch holds the canonical request: the session token) or a
    500 whose body echoes the request's Authorization and token headers: the error, and for
    the 500 every retry line, print neither."""
    proxy.refuse(status, echo=True)
    code, out, _ = run_cli("inspect", site["s3"], cwd=tmp_path, env={"AWS_ENDPOINT_URL": proxy.url})
    if status == 403:  # the listing is refused (the open goes on without it), then the manifest
        assert code == 1 and "s3://mmloader-test/secure-ds/index.json: GET failed" in out, out
        assert "access denied (the secret key does not match the access key ID)" in out, out
    else:  # the listing fails for the whole deadline: the open ends there (one deadline, not two)
        assert code == 1 and "s3://mmloader-test/secure-ds: LIST kept failing" in out, out
        assert "retrying for up to" in out, out


def test_a_failed_and_a_refused_conversion_to_s3_show_and_upload_no_credential(s3, proxy, tmp_path):
    raw = write_pairs_folder(tmp_path / "raw", 6, 16)
    proxy.refuse(500, methods=("PUT",), echo=True)  # every upload fails, echoing what it got
    code, out, _ = run_cli(
        "convert", "pairs", str(raw), f"s3://{s3.bucket}/failed", "--shard-size", "2", cwd=tmp_path,
        env={"AWS_ENDPOINT_URL": proxy.url},
    )  # fmt: skip
    assert code == 1 and "PUT kept failing" in out and "retrying for up to" in out, out
    for name, body in objects(s3, "failed/").items():
        assert_clean(body, f"s3 object {name}")
    code, out, _ = run_cli(
        "convert", "pairs", str(raw), f"s3://AKIDINURL:{OPTIONS['secret_access_key']}@{s3.bucket}/x", cwd=tmp_path
    )
    assert code == 1 and "URLs cannot hold credentials" in out and "Traceback" not in out, out


def test_a_conversion_published_to_s3_holds_no_credential_and_no_local_path(s3, tmp_path):
    raw = write_pairs_folder(tmp_path / "alice-private" / "raw", 6, 16)
    code, out, _ = run_cli(
        "convert", "pairs", str(raw), f"s3://{s3.bucket}/published", "--shard-size", "2", cwd=tmp_path
    )
    assert code == 0 and f"to s3://{s3.bucket}/published" in out, out
    published = objects(s3, "published/")
    assert "published/index.json" in published
    for name, body in published.items():
        assert_clean(body, f"s3 object {name}")
        assert b"alice-private" not in body and str(tmp_path).encode() not in body, name
    meta = json.loads(published["published/index.json"])["metadata"]
    assert meta["layout"] == "pairs" and meta["input"]["samples"] == 6 and "source" not in meta


_KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = {paths!r}
    import mmloader
    from conftest import make_samples
    from mmloader.storage.remote.location import Location

    put_file = Location.put_file
    calls = []

    def dies_at_the_third_upload(self, name, local, purpose="data"):
        calls.append(name)
        if len(calls) == 3:
            print("killed while uploading", name, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return put_file(self, name, local, purpose)

    Location.put_file = dies_at_the_third_upload
    with mmloader.writer_for({url!r}, shard_size=2, storage_options={options!r}) as w:
        for s in make_samples(10):
            w.write(s)
""")


def test_an_upload_killed_half_way_leaves_objects_and_output_with_no_credential(s3, tmp_path):
    options = {**OPTIONS, "endpoint": s3.endpoint}
    url = f"s3://{s3.bucket}/killed-secure"
    code = _KILLED.format(paths=[str(ROOT), str(ROOT / "tests")], url=url, options=options)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == -9 and "killed while uploading" in p.stdout, (p.returncode, p.stdout, p.stderr)
    assert_clean(p.stdout + p.stderr, "the killed writer's output")
    left = objects(s3, "killed-secure/")
    assert left and "killed-secure/index.json" not in left  # shards, no dataset
    for name, body in left.items():
        assert_clean(body, f"s3 object {name}")
    with pytest.raises(mmloader.FormatError, match="killed-secure has no index.json") as e:
        mmloader.open(url, storage_options=options)
    assert_clean(shown(e.value), "the error for the missing manifest")


# -- the Python API --------------------------------------------------------------------------------------------
def test_the_api_with_a_password_url_shows_it_nowhere_read_repr_checkpoint_cache(site, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="mmloader")
    cache = tmp_path / "cache"
    store = mmloader.open(site["url"], cache_dir=str(cache), readahead=False)
    local = mmloader.open(site["local"])
    assert [store[i] for i in range(len(store))] == [local[i] for i in range(len(local))]
    assert store.prefetch(progress=False) == len(store.shards)
    ds = mmloader.zip(caption=mmloader.TextReader(site["url"], "txt"), label=mmloader.LabelReader(store, "cls"))
    stream = mmloader.Stream(ds, batch_size=3, seed=1)
    loader = mmloader.loader(stream, num_workers=1, backend="thread")
    it = iter(loader)
    next(it)
    checkpoint = json.dumps(loader.state_dict())
    for what, text in [
        ("repr of the store", repr(store)),
        ("repr of its location", repr(store.location)),
        ("repr of the zipped readers", repr(ds)),
        ("repr of the stream", repr(stream)),
        ("the store's url", store.url),
        ("the checkpoint", checkpoint),
        ("the log", caplog.text),
    ]:
        assert_clean(text, what)
    assert repr(store) == f"RemoteTarStore({site['shown']!r})"
    for p in cache.rglob("*"):
        if p.is_file():
            assert_clean(p.read_bytes(), f"the cache's {p.name}")


def test_the_api_fails_at_once_naming_the_url_and_no_credential(site, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="mmloader")
    host = site["shown"].removesuffix("/ds")
    cases = [
        (site["url"].replace("/ds", "/nope"), {}, mmloader.FormatError, f"{host}/nope has no index.json"),
        (site["wrong"], {}, RemoteError, "401"),
        (
            f"http://{USER}:{PASSWORD}@no-such-host.invalid:9/ds",
            {},
            RemoteError,
            "'no-such-host.invalid' does not resolve",
        ),
        (site["bearer"], {"default_headers": {"Authorization": f"Bearer {WRONG_BEARER}"}}, RemoteError, "401"),
        (f"http://{USER}:{PASSWORD}@127.0.0.1:port/ds", {}, ValueError, "invalid port"),
        (f"s3://AKIDINURL:{OPTIONS['secret_access_key']}@b/ds", {}, ValueError, "cannot hold credentials"),
        (f"https://host/ds?sig={BEARER}", {}, ValueError, "cannot hold '?'"),
    ]
    for client in ("obstore",):
        for url, options, error, message in cases:
            started = time.monotonic()
            with pytest.raises(error, match=message) as e:
                mmloader.open(url, storage_options=options, retry_deadline=60)
            assert time.monotonic() - started < 10, (client, redact_url(url))
            assert_clean(shown(e.value), f"the error opening {redact_url(url)} ({client or 'default'} client)")
    assert_clean(caplog.text, "the log")
    # the right token works
    for _ in range(1):
        store = mmloader.open(
            site["bearer"], storage_options={"default_headers": {"Authorization": f"Bearer {BEARER}"}}
        )
        assert store[3] == mmloader.open(site["local"])[3]
        assert_clean(repr(store), "repr")


@pytest.mark.parametrize("status", [403, 500])
def test_storage_options_secrets_stay_out_of_errors_and_logs_of_an_echoing_server(
    site, proxy, status, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG, logger="mmloader")
    options = {**OPTIONS, "endpoint": proxy.url}
    proxy.refuse(status, echo=True)
    with pytest.raises(RemoteError, match="secure-ds/index.json: GET" if status == 403 else "secure-ds: LIST") as e:
        mmloader.open(site["s3"], storage_options=options, retry_deadline=1)
    assert_clean(shown(e.value), f"the error of a {status}")
    if status == 500:
        assert "retrying for up to" in caplog.text
    assert_clean(caplog.text, "the log")
    proxy.refuse(None)
    with pytest.raises(mmloader.FormatError, match="secure-ds-nothing has no index.json") as e:  # a missing prefix
        mmloader.open(site["s3"] + "-nothing", storage_options=options)
    assert_clean(shown(e.value), "the error for a missing prefix")


def test_a_writer_whose_uploads_fail_shows_and_leaves_no_storage_option_secret(s3, proxy, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="mmloader")
    monkeypatch.setenv("MMLOADER_RETRY_DEADLINE", "0.3")  # writers take theirs from the environment
    options = {**OPTIONS, "endpoint": proxy.url}
    proxy.refuse(500, methods=("PUT",), echo=True)
    url = f"s3://{s3.bucket}/failed-api"
    with pytest.raises(remote.RemoteUnavailableError, match="failed-api/data-000000.tar: PUT kept failing") as e:
        with mmloader.writer_for(url, shard_size=2, storage_options=options, progress=False) as w:
            for s in make_samples(6):
                w.write(s)
    assert_clean(shown(e.value), "the failed upload's error")
    assert_clean(caplog.text, "the log")
    proxy.refuse(None)
    with mmloader.writer_for(url, shard_size=2, storage_options=options, progress=False, overwrite=True) as w:
        for s in make_samples(6):
            w.write(s)
    store = mmloader.open(url, storage_options=options)
    assert len(store) == 6
    for name, body in objects(s3, "failed-api/").items():
        assert_clean(body, f"s3 object {name}")
    for what, text in [("repr", repr(store)), ("pickled location", repr(store.location.__getstate__()["url"]))]:
        assert_clean(text, what)
    assert store.location.storage_options == options  # the secrets travel to workers, nowhere else


# -- the rule ----------------------------------------------------------------------------------------------------
def test_one_redaction_rule_for_urls_messages_and_log_records(caplog):
    assert redact_url(f"http://{USER}:{PASSWORD}@h:1/ds") == f"http://{USER}:***@h:1/ds"
    assert redact_url("https://tok3n@h/ds") == "https://***@h/ds"
    presigned = (
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20240101"
        "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token=TOK&X-Amz-Signature=abc"
    )
    assert redact_url(presigned) == (
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token=***&X-Amz-Signature=***"
    )
    assert redact_url("https://a.blob.core.windows.net/c?sv=2022&sp=r&SIG=x%2B") == (
        "https://a.blob.core.windows.net/c?sv=2022&sp=r&SIG=***"
    )
    assert (
        redact_url("https://h/x?token=t&api_key=k&key=v&page=2") == "https://h/x?token=***&api_key=***&key=***&page=2"
    )
    assert redact_url("gs://b/o?X-Goog-Signature=s") == "gs://b/o?X-Goog-Signature=***"
    text = f"GET http://{USER}:{PASSWORD}@h/x (Authorization: Bearer {BEARER}) said {ENV['HF_TOKEN']}"
    assert redact(text) == "GET http://alice:***@h/x (Authorization: Bearer ***) said ***"
    assert {ENV["AWS_SESSION_TOKEN"], ENV["AZURE_STORAGE_ACCOUNT_KEY"]} <= secret_values()
    assert OPTIONS["session_token"] in secret_values(OPTIONS) and "AKIDOPTIONS" not in secret_values(OPTIONS)
    caplog.set_level(logging.INFO, logger="mmloader")
    logging.getLogger("mmloader").info("fetched %s with %s", f"https://{USER}:{PASSWORD}@h/ds", ENV["HF_TOKEN"])
    assert caplog.records[-1].getMessage() == "fetched https://alice:***@h/ds with ***"


# -- after the adversarial review of #34 -------------------------------------------------------------------------
def test_a_password_holding_a_raw_slash_question_mark_or_hash_is_redacted_and_refused_at_once(tmp_path):
    """``/``, ``?`` and ``#`` end a URL's host part: the password was taken for a host, a port, a
    path or a query, and printed whole (in "invalid port" and "cannot hold '?'" errors)."""
    for sep in "/?#":
        url = f"http://{USER}:ab{sep}{PASSWORD}@127.0.0.1:9/ds"
        assert redact_url(url) == f"http://{USER}:***@127.0.0.1:9/ds"
        assert redact(f"opening {url} failed") == f"opening http://{USER}:***@127.0.0.1:9/ds failed"
        for make in (mmloader.open, lambda u: mmloader.TextReader(u, "txt"), mmloader.writer_for):
            with pytest.raises(ValueError, match="percent-encode it") as e:
                make(url)
            assert_clean(shown(e.value), f"the error for a password holding {sep!r}")
    with pytest.raises(ValueError, match="cannot hold credentials") as e:  # an AWS secret key holds '/'
        mmloader.open(f"s3://AKIDINURL:ab/{OPTIONS['secret_access_key']}@bucket/ds")
    assert_clean(shown(e.value), "the error for an s3:// URL holding a secret with '/'")
    assert redact_url("s3://bucket/k@y/ds") == "s3://bucket/k@y/ds"  # an "@" in a key is no userinfo
    assert redact_url("https://h:8080/u/bob@example.com/ds") == "https://h:8080/u/bob@example.com/ds"
    code, out, _ = run_cli("inspect", f"http://{USER}:ab/{PASSWORD}@127.0.0.1:9/ds", cwd=tmp_path)
    assert code == 1 and "percent-encode it" in out and len(out.splitlines()) == 1, out


def test_free_text_redaction_finds_passwords_holding_spaces_quotes_brackets_and_bars(tmp_path):
    """A URL in a message went to its first space, quote, bracket or '|': a password holding one
    of them was left whole (``mmloader preview DS -o "http://alice:pa'ss@..."``)."""
    for password in (f"pa ss{PASSWORD}", f"pa'ss{PASSWORD}", f"pa(ss{PASSWORD}", f"pa|ss{PASSWORD}"):
        for text in (f"failed on http://{USER}:{password}@host.example/ds: boom", f'"http://{USER}:{password}@h:9/x"'):
            assert PASSWORD not in redact(text), text
        assert redact(f"failed on http://{USER}:{password}@host.example/ds: boom") == (
            f"failed on http://{USER}:***@host.example/ds: boom"
        )
    for untouched in (  # and nothing around a URL is eaten
        "see http://host, then mail bob@example.com",
        "copy http://host/a to user@example.com failed",
        "(http://h/x) and 'http://h2/y'; then s3://b/k@y/z.",
        "endpoint http://127.0.0.1:9000|s3://b/ds",
    ):
        assert redact(untouched) == untouched
    ds = write_dataset(tmp_path / "ds", 4, "tar")
    code, out, _ = run_cli("preview", str(ds), "-o", f"http://{USER}:pa'ss{PASSWORD}@127.0.0.1:9/p.png", cwd=tmp_path)
    assert code == 1 and f"http://{USER}:***@127.0.0.1:9/p.png" in out, out


def test_redacting_again_changes_nothing(tmp_path):
    """The CLI redacts what the library redacted already: the second pass ate the ':' after
    ``token=***``."""
    messages = [
        "http://127.0.0.1:9/ds?token=abc: a dataset URL cannot hold '?'",
        f"GET http://{USER}:{PASSWORD}@h/x (Authorization: Bearer {BEARER}), said {ENV['HF_TOKEN']}.",
        f"failed on http://{USER}:pa ss{PASSWORD}@host/ds: boom",
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=abc&X-Amz-Date=1; https://tok3n@h/ds",
        "<Error><CanonicalRequest>GET /x</CanonicalRequest></Error> Authorization: Basic dTpw",
    ]
    for message in messages:
        once = redact(message)
        assert redact(once) == once and redact_url(redact_url(message)) == redact_url(message), message
    assert redact(messages[0]) == "http://127.0.0.1:9/ds?token=***: a dataset URL cannot hold '?'"
    code, out, _ = run_cli("inspect", "http://127.0.0.1:9/ds?token=abcdefgh", cwd=tmp_path)
    assert code == 1 and "http://127.0.0.1:9/ds?token=***: a dataset URL cannot hold" in out, out


def test_a_url_with_one_slash_is_named_redacted_and_told_apart_from_a_url(tmp_path):
    with pytest.raises(FileNotFoundError, match="a URL takes two") as e:
        mmloader.open(f"http:/{USER}:{PASSWORD}@127.0.0.1:9/ds")
    assert_clean(shown(e.value), "the error for a URL with one slash")


@pytest.mark.parametrize("status", [403, 404, 500])
def test_no_client_chains_an_error_that_keeps_the_request_or_a_credential(site, status):
    """An error of ours was chained to the client library's (``__cause__``), or kept it as its
    suppressed ``__context__``: aiohttp's ``request_info`` holds the request's Authorization
    header, and obstore's and our errors quote a server's answer echoing it. The client,
    against a server whose error answers echo the credentials they were sent."""
    from mmloader.storage.remote import Policy
    from mmloader.storage.remote.obstore_client import _ObstoreClient

    proxy = FaultProxy(f"127.0.0.1:{site['server'].port}")
    proxy.refuse(status, echo=True)
    try:
        host = proxy.url.removeprefix("http://")
        locations = [
            (f"http://{USER}:{PASSWORD}@{host}/ds", {}),
            (f"{proxy.url}/ds", {"default_headers": {"Authorization": f"Bearer {BEARER}"}}),
        ]
        for url, options in locations:
            for cls in (_ObstoreClient,):
                client = cls(remote.Location(url, options, Policy(retry_deadline=0.3)))
                with pytest.raises((RemoteError, FileNotFoundError)) as e:
                    client.get("index.json")
                assert_clean(shown(e.value), f"the error of {cls.__name__} for HTTP {status}")
                assert e.value.__context__ is None, cls.__name__
    finally:
        proxy.stop()


def _profile(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """An AWS profile in a shared credentials file, and no credentials in the environment."""
    creds = {
        "aws_access_key_id": "AKIDPROFILEKEY",
        "aws_secret_access_key": "profile-SECRET-access-key-1234",
        "aws_session_token": "profile-SESSION-token-5678",
    }
    (tmp_path / "credentials").write_text("[dev]\n" + "".join(f"{k} = {v}\n" for k, v in creds.items()))
    (tmp_path / "config").write_text("[profile dev]\nregion = us-east-1\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    return creds


def test_credentials_of_an_aws_profile_read_through_obstore_and_are_never_shown(
    site, s3, proxy, tmp_path, monkeypatch, caplog
):
    """obstore reads no AWS profile (every data read went to the instance metadata service and
    failed), and what botocore resolved from one was unknown to the scrubber: a server echoing
    the session token had it printed in the error, the log and the CLI's line."""
    pytest.importorskip("botocore")
    from mmloader.storage.remote.obstore_client import _ObstoreClient

    caplog.set_level(logging.DEBUG, logger="mmloader")
    creds = _profile(tmp_path, monkeypatch)
    manifest = (site["local"] / "index.json").read_bytes()
    for cls in (_ObstoreClient,):
        assert cls(remote.Location(site["s3"])).get("index.json") == manifest, cls.__name__
    store = mmloader.open(site["s3"])
    assert store[3] == mmloader.open(site["local"])[3]
    secrets = [creds["aws_secret_access_key"], creds["aws_session_token"]]
    assert set(secrets) <= secret_values()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    proxy.refuse(403, echo=True)
    for cls in (_ObstoreClient,):
        with pytest.raises(RemoteError, match="access denied") as e:
            cls(remote.Location(site["s3"])).get("index.json")
        assert not [x for x in secrets if x in shown(e.value)], shown(e.value)
    code, out, _ = run_cli("inspect", site["s3"], cwd=tmp_path)
    assert code == 1 and "access denied" in out and not [x for x in secrets if x in out], out
    assert not [x for x in secrets if x in caplog.text]


def test_an_endpoint_in_the_environment_is_checked_like_one_in_storage_options(s3, monkeypatch, tmp_path):
    """AWS_ENDPOINT_URL holding a password was used (obstore) or dropped (the standard-library
    client), and one whose port is no number was retried until the deadline."""
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(var, f"http://minio:{PASSWORD}@127.0.0.1:{s3.port}")
        for make in (mmloader.open, mmloader.writer_for):
            with pytest.raises(ValueError, match=f"\\({var}\\): an endpoint cannot hold credentials") as e:
                make("s3://bucket/ds")
            assert_clean(shown(e.value), f"the error for {var} holding a password")
        monkeypatch.setenv(var, "http://127.0.0.1:90x")
        started = time.monotonic()
        with pytest.raises(ValueError, match="invalid port"):
            mmloader.open("s3://bucket/ds", retry_deadline=60)
        assert time.monotonic() - started < 5
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    location = remote.Location("s3://bucket/ds")  # checked again when the environment changes
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://minio:{PASSWORD}@127.0.0.1:{s3.port}")
    with pytest.raises(ValueError, match="cannot hold credentials") as e:
        location.get("index.json")
    assert_clean(shown(e.value), "the error after the environment changed")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:90x")
    code, out, seconds = run_cli("inspect", "s3://bucket/ds", cwd=tmp_path, env={"MMLOADER_RETRY_DEADLINE": "60"})
    assert code == 1 and "invalid port" in out and seconds < 20, out


def test_a_client_that_cannot_be_set_up_is_one_redacted_line_in_the_cli(tmp_path, monkeypatch):
    """obstore's error building a client (a service account key it cannot read) escaped the CLI
    as a raw traceback of 50 lines."""
    key = '{"type": "service_account", "private_key_id": "' + BEARER + '"}'
    code, out, _ = run_cli("inspect", "gs://bucket/ds", cwd=tmp_path, env={"GOOGLE_SERVICE_ACCOUNT_KEY": key})
    assert code == 1 and "Traceback" not in out and len(out.splitlines()) == 1, out
    assert out.startswith("mmloader inspect: error: gs://bucket/ds: cannot set up the obstore client: "), out
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_KEY", key)
    with pytest.raises(RemoteError, match="cannot set up the obstore client") as e:
        remote.Location("gs://bucket/ds").client("data").get("index.json")
    assert_clean(shown(e.value), "the error setting up a client")
