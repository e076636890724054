"""hf:// datasets against a Hub on 127.0.0.1 (samples/local_hub.py: the endpoints huggingface_hub
calls), reached through HF_ENDPOINT; huggingface_hub's own HfFileSystem reads the same files."""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, write_dataset
from remote_servers import RangeServer, make_certificate, own_cache  # noqa: F401  (fixture)

import mmloader
from mmloader.storage import open_store
from mmloader.storage.remote import Location, Policy, RemoteError, RemoteUnavailableError
from mmloader.storage.remote.hub import HubError, forget_revisions, hub_token, parse_hub_url, retry_after

sys.path.insert(0, str(ROOT / "samples"))
from local_hub import HubServer  # noqa: E402

TOKEN = "hf_test_token_0123456789"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubdata")
    return {
        "tar": write_dataset(root / "shards", 22, "tar", shard_size=5),
        "lmdb": write_dataset(root / "pairs.lmdb", 9, "lmdb"),
    }


@pytest.fixture
def hub(local, monkeypatch, tmp_path):
    server = HubServer(retry_after=0.3)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no login of the machine's user
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    server.upload_folder("org/pairs", local["tar"], "data/train")
    server.upload_folder("org/pairs", local["lmdb"], "pairs.lmdb")
    yield server
    server.stop()


def _rows(store) -> list[dict]:
    return [{k: v for k, v in store[i].items() if k != "__index__"} for i in range(len(store))]


def test_parse_hub_urls():
    assert parse_hub_url("hf://datasets/org/name") == parse_hub_url("hf://datasets/org/name@main/")
    p = parse_hub_url("hf://datasets/org/name@refs%2Fconvert%2Fparquet/default/train")
    assert (p.repo_id, p.revision, p.path) == ("org/name", "refs/convert/parquet", "default/train")
    assert p.url == "hf://datasets/org/name@refs%2Fconvert%2Fparquet/default/train"
    for bad, said in (
        ("hf://org/name", "dataset repositories"),
        ("hf://datasets/org", "ORG/NAME"),
        ("hf://datasets/org/name@/x", "empty revision"),
    ):
        with pytest.raises(ValueError, match=said):
            parse_hub_url(bad)
    assert retry_after({"retry-after": "2"}) == 2.0 and retry_after({}) is None
    for unencoded in (
        "hf://datasets/org/name@refs/convert/parquet/default",
        "hf://datasets/org/name@refs/pr/1/default",
    ):
        p = parse_hub_url(unencoded)  # as huggingface_hub takes them
        assert p.revision.startswith("refs/") and p.path == "default", p


def test_shards_and_lmdb_read_in_place_match_local(hub, local):
    shards = mmloader.open("hf://datasets/org/pairs/data/train")
    assert len(shards) == 22 and _rows(shards) == _rows(open_store(local["tar"]))
    lmdb = open_store("hf://datasets/org/pairs/pairs.lmdb")
    assert _rows(lmdb) == _rows(open_store(local["lmdb"]))
    # samples came by ranged reads of the shards through the CDN, which never saw the token
    ranged = [r for r in hub.cdn_requests if r[0] == "GET"]
    assert ranged and all(auth is None for _m, _p, auth in hub.cdn_requests)


def test_readers_zip_and_workers(hub, local):
    url = "hf://datasets/org/pairs/data/train"
    ds = mmloader.zip(image=mmloader.ImageReader(url, field="jpg"), text=mmloader.TextReader(url, field="txt"))
    want = [s["txt"].decode() for s in _rows(open_store(local["tar"]))]
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, shuffle=False), num_workers=2, backend="process")
    got = [t for batch in loader for t in batch["text"]]
    assert got == want


def test_revision_pinned_when_opened(hub, local):
    store = open_store("hf://datasets/org/pairs/data/train")
    first = store.shards[0]["file"]
    copy = pickle.loads(pickle.dumps(store))  # as a worker receives it
    before = _rows(store)
    old_sha = store.location.hub.sha
    # a push to main mid-run: every shard rewritten with other samples
    hub.commit("org/pairs", {f"data/train/{first}": b"\0" * 4096})
    assert _rows(copy) == before and _rows(store) == before
    assert copy.location.hub.sha == old_sha
    # in this process, a revision stays the commit its first open resolved: two readers of one
    # URL never read two commits
    again = mmloader.TextReader("hf://datasets/org/pairs/data/train")
    assert again.store.location.hub.sha == old_sha
    forget_revisions()
    newer = mmloader.TextReader("hf://datasets/org/pairs/data/train")
    assert newer.store.location.hub.sha != old_sha
    with pytest.raises(mmloader.errors.AlignmentError, match="open both at one revision"):
        mmloader.zip(old=again, new=newer)
    # and a revision can be named: a commit, or a branch
    pinned = open_store(f"hf://datasets/org/pairs@{old_sha}/data/train")
    assert _rows(pinned) == before
    hub.commit("org/pairs", {"x.txt": b"x"}, branch="v2")
    assert len(open_store("hf://datasets/org/pairs@v2/data/train")) == 22


def test_listing_and_bytes_match_hffilesystem(hub, local):
    hf = pytest.importorskip("huggingface_hub")
    fs = hf.HfFileSystem(endpoint=hub.url)
    loc = Location("hf://datasets/org/pairs/data/train")
    ours = dict(loc.list())
    theirs = {
        p.split("data/train/", 1)[1]: info["size"]
        for p, info in fs.find("datasets/org/pairs/data/train", detail=True).items()
    }
    assert ours == theirs and len(ours) > 5
    for name, size in ours.items():
        with fs.open(f"datasets/org/pairs/data/train/{name}", "rb") as f:
            whole = f.read()
            f.seek(size // 3)
            middle = f.read(100)
        assert loc.get(name) == whole == (Path(local["tar"]) / name).read_bytes()
        assert loc.get_ranges([(name, size // 3, min(size // 3 + 100, size))]) == [middle]


def test_429_waits_retry_after(hub):
    hub.throttle(2)  # the revision API, then the manifest
    t = time.monotonic()
    store = open_store("hf://datasets/org/pairs/data/train")
    assert time.monotonic() - t >= 0.55 and len(store) == 22
    hub.throttle(1)  # a sample read
    assert store[7]["__key__"]
    hub.throttle(1000)
    with pytest.raises(RemoteUnavailableError, match="kept failing.*429"):
        open_store("hf://datasets/org/pairs/data/train", retry_deadline=1.0)


def test_missing_private_and_gated_repos(hub, local, monkeypatch):
    with pytest.raises(HubError, match=r"hf://datasets/org/nope: no such dataset repository.*HF_TOKEN"):
        open_store("hf://datasets/org/nope")
    with pytest.raises(HubError, match="has no revision 'v9'"):
        open_store("hf://datasets/org/pairs@v9/data/train")
    with pytest.raises(mmloader.errors.FormatError, match="no index.json"):
        open_store("hf://datasets/org/pairs/data/none")
    hub.commit("org/pairs", {"foreign/a.tar": (Path(local["tar"]) / "data-000000.tar").read_bytes()})
    forget_revisions()  # (this process resolved main before the commit)
    with pytest.raises(mmloader.errors.FormatError, match=r"no index.json: index them once .*-o DIR`, and open DIR"):
        open_store("hf://datasets/org/pairs/foreign")
    hub.create("org/private", private=True, readers={TOKEN})
    hub.upload_folder("org/private", local["tar"])
    hub.create("org/gated", gated=True, readers={TOKEN})
    hub.upload_folder("org/gated", local["tar"])
    with pytest.raises(HubError, match="or it is private"):
        open_store("hf://datasets/org/private")
    with pytest.raises(HubError, match=r"org/gated is a gated dataset: accept its conditions at .*/datasets/org/gated"):
        open_store("hf://datasets/org/gated")
    with pytest.raises(HubError, match="gated dataset.*the account of the token in use") as e:
        open_store("hf://datasets/org/gated", storage_options={"token": "hf_other_token_9876543210"})
    assert "hf_other_token" not in str(e.value)
    with pytest.raises(HubError, match=r"the token in use \(storage_options\[.token.\]\) cannot read it"):
        open_store("hf://datasets/org/private", storage_options={"token": "hf_other_token_9876543210"})
    # the token: storage_options, HF_TOKEN, or the file `hf auth login` writes
    assert len(open_store("hf://datasets/org/private", storage_options={"token": TOKEN})) == 22
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert len(open_store("hf://datasets/org/gated")) == 22
    with pytest.raises(HubError):
        open_store("hf://datasets/org/gated", storage_options={"token": False})
    monkeypatch.delenv("HF_TOKEN")
    token_file = Path(os.environ["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(TOKEN + "\n")
    assert hub_token() == TOKEN
    store = open_store("hf://datasets/org/gated")
    assert _rows(store)[3]["txt"]
    # the token read from the file is looked up again in each process, never pickled
    assert TOKEN.encode() not in pickle.dumps(store)


def test_env_token_reaches_dataloader_workers_without_pickling(hub, local, monkeypatch):
    hub.create("org/private", private=True, readers={TOKEN})
    hub.upload_folder("org/private", local["tar"])
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    reader = mmloader.TextReader("hf://datasets/org/private", field="txt")
    assert TOKEN.encode() not in pickle.dumps(reader)
    stream = mmloader.Stream(mmloader.zip(text=reader), batch_size=5, shuffle=False)
    loader = mmloader.loader(stream, num_workers=2, multiprocessing_context="spawn")
    assert sum(len(b["text"]) for b in loader) == 22


def test_hub_is_read_only(hub, tmp_path):
    with pytest.raises(RemoteError, match="does not write them"):
        with mmloader.writer_for("hf://datasets/org/pairs/new") as w:
            w.write({"__key__": "a", "txt": "x"})


def test_https_bearer_token(local):
    server = RangeServer(local["tar"], authorization="Bearer s3cr3t-token-abcdef")
    try:
        store = open_store(server.url, storage_options={"token": "s3cr3t-token-abcdef"})
        assert len(store) == 22 and store[3]["txt"]
        with pytest.raises(RemoteError) as e:
            open_store(server.url, storage_options={"token": "wrong-token-0123456789"}, retry_deadline=1)
        assert "wrong-token-0123456789" not in str(e.value)
        with pytest.raises(ValueError, match="given twice"):
            Location(server.url, {"token": "t0123456789", "headers": {"Authorization": "Basic x"}})
    finally:
        server.stop()


def test_policy_deadline_bounds_the_revision_call(monkeypatch):
    from mmloader.storage.remote import HostUnreachable, forget_answers

    forget_answers()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    t = time.monotonic()
    with pytest.raises(RemoteUnavailableError, match="resolve the revision failed: cannot connect to 127.0.0.1:9"):
        Location("hf://datasets/org/pairs", policy=Policy(retry_deadline=0.5))
    assert time.monotonic() - t < 5
    t = time.monotonic()  # the default deadline (120 s): a Hub that never answered fails within seconds
    with pytest.raises(HostUnreachable) as e:
        Location("hf://datasets/org/pairs", policy=Policy())
    assert time.monotonic() - t < 20
    assert re.search(
        r"hf://datasets/org/pairs: resolve the revision failed: cannot connect to 127\.0\.0\.1:9: the connection "
        r"was refused .*first_contact_deadline=5 s.*check the Hub's endpoint \(HF_ENDPOINT",
        str(e.value),
    ), str(e.value)


def test_a_hub_that_answered_once_is_waited_for_when_it_restarts(hub, monkeypatch):
    """The Hub's API answered, then refuses connections for 2.5 s (restarting): the next call
    waits for it, though a Hub never heard from fails after first_contact_deadline."""
    import threading

    from remote_servers import FaultProxy

    from mmloader.storage.remote import forget_answers

    forget_answers()
    front = FaultProxy(hub.url.removeprefix("http://"))  # in front of the API; stopped and started again
    monkeypatch.setenv("HF_ENDPOINT", front.url)
    policy = Policy(retry_deadline=60, first_contact_deadline=0.5)
    try:
        forget_revisions()
        assert Location("hf://datasets/org/pairs/data/train", policy=policy).list("")
        front.stop()
        threading.Timer(2.5, front.start).start()
        forget_revisions()  # the revision is asked for again
        t = time.monotonic()
        assert Location("hf://datasets/org/pairs/data/train", policy=policy).list("")
        assert time.monotonic() - t >= 2.0
    finally:
        front.stop()
        forget_revisions()


@pytest.fixture
def untrusted_tls(tmp_path):
    """An HTTPS server on 127.0.0.1 whose certificate is self-signed, so no client that verifies
    certificates accepts it."""
    server = RangeServer(tmp_path, tls=make_certificate(tmp_path))
    yield server.url
    server.stop()


def test_a_certificate_that_does_not_verify_fails_at_once(untrusted_tls, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", untrusted_tls)
    policy = Policy(retry_deadline=60)
    t = time.monotonic()
    with pytest.raises(RemoteError, match="TLS certificate does not verify .*self.signed"):
        Location("hf://datasets/org/pairs", policy=policy)  # the Hub's API
    with pytest.raises(RemoteError, match="TLS certificate does not verify"):
        Location(untrusted_tls + "/data", policy=policy).get("data-000000.tar")  # plain https://
    assert time.monotonic() - t < 10  # not retried for the minute the deadline allows


def test_paths_that_need_percent_encoding(hub, local):
    hub.upload_folder("org/pairs", local["tar"], "my data/données+@")
    store = open_store("hf://datasets/org/pairs/my data/données+@")
    assert _rows(store) == _rows(open_store(local["tar"]))
    assert dict(store.location.list()) == dict(Location("hf://datasets/org/pairs/data/train").list())


def test_listing_as_object_stores_list(hub):
    loc = Location("hf://datasets/org/pairs/data/train")
    assert [n for n, _s in loc.list("index.json")] == ["index.json"]
    assert {n for n, _s in loc.list("data-00000")} == {n for n, _s in loc.list() if n.startswith("data-00000")}
    assert loc.list("nothing/here") == []


def test_opening_costs_no_request_per_shard(hub):
    hub.requests.clear()
    store = open_store("hf://datasets/org/pairs/data/train")
    assert len(store.shards) == 5
    assert [m for m, _p, _a in hub.requests if m == "HEAD"] == []  # the commit pins the versions


def test_a_token_given_in_storage_options_never_shows(hub, local, caplog):
    hub.create("org/private", private=True, readers={TOKEN})
    hub.upload_folder("org/private", local["tar"])
    store = open_store("hf://datasets/org/private", storage_options={"token": TOKEN})
    assert TOKEN not in repr(store.location.hub) and TOKEN not in repr(store)
    hub.throttle(1000)
    with pytest.raises(RemoteUnavailableError) as e:
        open_store("hf://datasets/org/private", storage_options={"token": TOKEN + "x"}, retry_deadline=0.5)
    assert TOKEN not in str(e.value) and TOKEN not in caplog.text
    hub.throttle(0)
    with pytest.raises(ValueError, match="control character") as e:
        open_store("hf://datasets/org/private", storage_options={"token": "hf_a\nb_0123456789"})
    assert "0123456789" not in str(e.value)
    assert len(open_store("hf://datasets/org/private", storage_options={"token": f" {TOKEN}\n"})) == 22  # stripped
    with pytest.raises(TypeError, match="must be a string"):
        open_store("hf://datasets/org/private", storage_options={"token": 123})
    with pytest.raises(ValueError, match="there is none: run `hf auth login`"):
        open_store("hf://datasets/org/private", storage_options={"token": True})
    with pytest.raises(ValueError, match="not as an Authorization header"):
        open_store("hf://datasets/org/private", storage_options={"headers": {"Authorization": f"Bearer {TOKEN}"}})
    # token=True: the saved login, looked up in each process (never pickled)
    token_file = Path(os.environ["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(TOKEN)
    saved = open_store("hf://datasets/org/private", storage_options={"token": True})
    assert len(saved) == 22 and TOKEN.encode() not in pickle.dumps(saved)


def test_the_token_does_not_follow_a_redirect_to_another_host(hub, local, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.moved["org/pairs"] = hub.cdn_url  # the API answers 307 to another host
    hub.cdn_requests.clear()
    with pytest.raises(Exception):
        open_store("hf://datasets/org/pairs/data/train", retry_deadline=1)
    assert hub.cdn_requests and all(auth is None for _m, _p, auth in hub.cdn_requests)


def test_retry_after_zero_still_backs_off(hub):
    hub.retry_after = 0
    hub.throttle(10_000)
    hub.requests.clear()
    with pytest.raises(RemoteUnavailableError):
        open_store("hf://datasets/org/pairs/data/train", retry_deadline=1.0)
    assert len(hub.requests) < 40  # backoff from 0.1 s, not a request every millisecond


def test_endpoint_typos_and_options_fail_at_once(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://no-such-hub.invalid")
    t = time.monotonic()
    with pytest.raises(HubError, match="does not resolve: check HF_ENDPOINT"):
        open_store("hf://datasets/org/pairs")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"unknown storage_options \['tokne'\] for hf:// URLs"):
        open_store("hf://datasets/org/pairs", storage_options={"tokne": "x"})
    with pytest.raises(ValueError, match="is not an http"):
        open_store("hf://datasets/org/pairs", storage_options={"endpoint": "not a url"})
    with pytest.raises(ValueError, match="cannot hold credentials"):
        open_store("hf://datasets/org/pairs", storage_options={"endpoint": "http://u:secret-pw-123@127.0.0.1:9"})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set"):
        open_store("hf://datasets/org/pairs")
    assert time.monotonic() - t < 5


def test_a_repository_gone_mid_run_is_said(hub, local, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    store = open_store("hf://datasets/org/pairs/data/train")
    del hub.repos["org/pairs"]
    with pytest.raises(HubError, match="no such dataset repository"):
        store[3]


def test_parquet_on_the_hub_read_in_place(hub, tmp_path):
    """The Hub's own Parquet layout (refs/convert/parquet: default/train/0000.parquet ...), written
    by the real `datasets`, read by ranged GETs of its column chunks."""
    datasets = pytest.importorskip("datasets")
    import io as _io

    from PIL import Image

    def png(i):
        buf = _io.BytesIO()
        Image.new("RGB", (8, 8), (i * 9, 0, 0)).save(buf, format="PNG")
        return buf.getvalue()

    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(i), "path": None} for i in range(30)], "caption": [f"c{i}" for i in range(30)]},
        features=datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")}),
    )
    (tmp_path / "pq").mkdir()
    for k in range(3):
        ds.shard(3, k, contiguous=True).to_parquet(str(tmp_path / "pq" / f"{k:04d}.parquet"), batch_size=4)
    hub.commit("org/pairs", {}, branch="refs/convert/parquet")
    hub.upload_folder("org/pairs", tmp_path / "pq", "default/train", branch="refs/convert/parquet")
    local = open_store(tmp_path / "pq")
    remote = mmloader.open("hf://datasets/org/pairs@refs%2Fconvert%2Fparquet/default/train")
    assert type(remote).__name__ == "ArrowStore" and len(remote) == 30
    assert [remote[i] for i in range(30)] == [local[i] for i in range(30)]
    one = open_store("hf://datasets/org/pairs@refs%2Fconvert%2Fparquet/default/train/0001.parquet")
    assert [one[i]["caption"] for i in range(len(one))] == [f"c{i}".encode() for i in range(10, 20)]
    stream = mmloader.Stream(mmloader.zip(text=mmloader.TextReader(remote, field="caption")), batch_size=7, seed=1)
    got = [t for b in mmloader.loader(stream, num_workers=2, backend="process") for t in b["text"]]
    assert sorted(set(got)) == sorted(f"c{i}" for i in range(30))


def test_shards_another_tool_wrote_read_in_place_with_a_local_index(hub, tmp_path, capsys):
    """A public WebDataset collection: tars without mmloader's index, in someone else's repository.
    `mmloader index hf://... -o DIR` keeps the index in DIR; opening DIR reads the shards on the
    Hub, at the commit indexed, as webdataset itself reads them."""
    import webdataset as wds

    from mmloader.cli import main

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with wds.ShardWriter(str(foreign / "f-%03d.tar"), maxcount=6, verbose=0) as sw:
        for i in range(15):
            sw.write({"__key__": f"k{i:03d}", "txt": f"caption {i}", "jpg": bytes([i]) * (100 + i)})
    hub.upload_folder("org/wds", foreign, "train")
    index = tmp_path / "wds-index"
    assert main(["index", "hf://datasets/org/wds/train", "-o", str(index), "-q"]) == 0
    assert "read them in place" in capsys.readouterr().out
    assert not list(index.glob("*.tar"))  # the shards stay on the Hub
    manifest = json.loads((index / "index.json").read_text())
    assert re.fullmatch(r"hf://datasets/org/wds@[0-9a-f]{40}/train", manifest["shards_url"])
    store = mmloader.open(str(index))
    seen = [
        (s["__key__"], s["txt"], s["jpg"])
        for s in wds.WebDataset(sorted(str(p) for p in foreign.glob("*.tar")), shardshuffle=False)
    ]
    assert [(r["__key__"], r["txt"], r["jpg"]) for r in _rows(store)] == seen
    assert main(["verify", str(index), "-q"]) == 0

    # a push to the branch later: the index's commit is still what is read, in workers too
    with wds.ShardWriter(str(tmp_path / "new-%03d.tar"), maxcount=6, verbose=0) as sw:
        for i in range(15):
            sw.write({"__key__": f"k{i:03d}", "txt": f"other {i}", "jpg": b"x"})
    hub.commit("org/wds", {"train/f-000.tar": (tmp_path / "new-000.tar").read_bytes()})
    forget_revisions()
    again = pickle.loads(pickle.dumps(mmloader.open(str(index))))
    assert [r["txt"] for r in _rows(again)] == [t for _k, t, _j in seen]

    capsys.readouterr()
    assert main(["index", "hf://datasets/org/wds/train", "-o", str(index), "-q"]) == 1  # never over a folder
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert _rows(mmloader.open(str(index)))  # which is left as it was
    assert main(["index", "hf://datasets/org/wds/train", "-q"]) == 1  # nothing is written to the Hub
    assert "keep the index in a local folder: `mmloader index hf://datasets/org/wds@" in capsys.readouterr().err

    # a new folder gets the mode mkdir gives (an index to share); an empty one given is filled in place
    umask = os.umask(0o022)
    try:
        mmloader.build_index("hf://datasets/org/wds/train", output=tmp_path / "shared" / "idx", progress=False)
        assert (tmp_path / "shared" / "idx").stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(umask)
    given = tmp_path / "given"
    given.mkdir()
    given.chmod(0o2775)  # a team's folder: group-writable, setgid
    inode = given.stat().st_ino
    mmloader.build_index("hf://datasets/org/wds/train", output=given, progress=False)
    assert given.stat().st_ino == inode and given.stat().st_mode & 0o2777 == 0o2775
    assert len(mmloader.open(str(given))) == 15 and not list(tmp_path.glob(".given*"))
