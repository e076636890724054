"""Datasets on object storage, against real servers on 127.0.0.1 started here: moto's S3 server,
a standard-library HTTP server that honours Range, and a fault-injecting proxy (latency, 503
bursts, resets, truncated bodies, hung requests, a server killed and restarted)."""

from __future__ import annotations

import doctest
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTS, make_samples, write_dataset, write_pairs_folder
from remote_servers import FaultProxy, RangeServer, own_cache, s3  # noqa: F401  (fixtures)

import mmloader
from mmloader.storage import remote
from mmloader.storage.remote import (
    RemoteError,
    RemoteUnavailableError,
    failures,
    location,
    ranges,
    redaction,
    servers,
    shard_cache,
    urls,
)
from mmloader.storage.remote.tar import RemoteTarStore

pytest.importorskip("moto.server")
pytest.importorskip("obstore")

HERE = TESTS
N = 24


@pytest.fixture(scope="module")
def data(tmp_path_factory, s3):
    root = tmp_path_factory.mktemp("remote-data")
    tar = write_dataset(root / "shards", N, "tar", shard_size=5)
    lmdb_path = write_dataset(root / "ds.lmdb", N, "lmdb")
    urls = {"tar": s3.upload(tar, "shards"), "lmdb": s3.upload(lmdb_path, "ds.lmdb")}
    http = RangeServer(root)
    yield {
        "root": root,
        "local": {"tar": tar, "lmdb": lmdb_path},
        "s3": urls,
        "http": {"tar": f"{http.url}/shards/", "lmdb": f"{http.url}/ds.lmdb"},
        "http_server": http,
    }
    http.stop()


def _all(store) -> list[dict]:
    return [store[i] for i in range(len(store))]


@pytest.mark.parametrize("where", ["s3", "http"])
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_every_sample_from_object_storage_equals_the_local_read(data, where, fmt, tmp_path):
    local = mmloader.open(data["local"][fmt])
    store = mmloader.open(data[where][fmt], cache_dir=str(tmp_path / "cache"))
    assert len(store) == len(local) == N and store.fields == local.fields
    assert _all(store) == _all(local)
    order = list(np.random.default_rng(0).permutation(N))
    for views in (False, True):
        keys, cols = store.read_many(order, ["jpg", "txt", "cls"], views=views)
        lkeys, lcols = local.read_many(order, ["jpg", "txt", "cls"])
        assert keys == lkeys
        assert {f: [bytes(v) for v in vs] for f, vs in cols.items()} == lcols
    assert store.get("s00007") == local.get("s00007")
    assert list(store.keys) == list(local.keys) and "s00003" in store.keys


def test_readers_zip_stream_loader_and_configs_over_s3(data, tmp_path):
    url = data["s3"]["tar"]

    def batches(src, backend):
        ds = mmloader.zip(image=mmloader.ImageReader(src, "jpg"), caption=mmloader.TextReader(src, "txt"))
        loader = mmloader.loader(
            mmloader.Stream(ds, batch_size=5, order=mmloader.Order(seed=3, block_size=4)),
            num_workers=2,
            backend=backend,
        )
        return [(b["__key__"], b["caption"], b["image"].sum().item()) for b in loader]

    want = batches(str(data["local"]["tar"]), "thread")
    assert batches(url, "thread") == want
    config = {
        "seed": 3,
        "batch_size": 5,
        "block_size": 4,
        "sources": {"s": {"path": url, "modalities": {"image": {"field": "jpg"}, "caption": {"field": "txt"}}}},
    }
    loader = mmloader.loader(mmloader.from_config(config), num_workers=2, backend="thread")
    assert [(b["__key__"], b["caption"], b["image"].sum().item()) for b in loader] == want


def test_workers_after_the_parent_used_obstore_read_correctly_and_a_fork_is_refused_not_hung(data):
    """obstore's runtime does not survive fork(): the process backend starts its workers with
    spawn when the stream reads object storage this process has read, and a process forked anyway is told
    what to do at its first read instead of hanging."""
    import multiprocessing

    url = data["s3"]["tar"]
    store = mmloader.open(url, readahead=False)
    store.read_many([0, 1], ["txt"])  # data reads: this process has started obstore
    assert remote.obstore_started_here()
    ds = mmloader.zip(caption=mmloader.TextReader(store, "txt", transform=str.upper))  # -> process backend
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=6, seed=1), num_workers=2)
    assert loader.dataloader.multiprocessing_context.get_start_method() == "spawn"
    got = sorted(k for b in loader for k in b["__key__"])
    assert got == sorted(mmloader.open(data["local"]["tar"]).keys)

    def child(queue):
        try:
            store.location.rebuild()
            store.read_many([2], ["txt"])
            queue.put("read")
        except Exception as e:  # what it says is the check
            queue.put(f"{type(e).__name__}: {e}")

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    forked = ctx.Process(target=child, args=(queue,))
    forked.start()
    said = queue.get(timeout=60)
    forked.join(30)
    assert "does not survive fork(): start worker processes with multiprocessing_context='spawn'" in said, said


# -- DDP: 2 ranks x 2 worker processes over S3 ----------------------------------------------------------
def _rank_main(rank: int, init: str, url: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    ds = mmloader.zip(caption=mmloader.TextReader(url, "txt"), label=mmloader.LabelReader(url, "cls"))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=4, order=mmloader.Order(seed=5, block_size=4, window_blocks=2)),
        num_workers=2,
        backend="process",
    )
    got = [list(b["__key__"]) for b in loader]
    counts = torch.tensor([len(got)])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"batches": got, "max": int(counts)}))
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_two_workers_over_s3_every_sample_once_equal_batches(data, tmp_path):
    import torch.multiprocessing as tmp

    tmp.spawn(_rank_main, args=(str(tmp_path / "init"), data["s3"]["tar"], str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_rank = [r["batches"] for r in results]
    assert len(per_rank[0]) == len(per_rank[1]) == results[0]["max"] == math.ceil(N / 2 / 4)
    keys = Counter(k for b in per_rank for batch in b for k in batch)
    assert set(keys) == set(mmloader.open(data["local"]["tar"]).keys)
    assert sum(keys.values()) == N  # 24 samples, 2 ranks x 3 batches of 4: no padding, each once


def test_resume_mid_epoch_over_s3(data):
    url = data["s3"]["tar"]

    def loader():
        return mmloader.loader(
            mmloader.Stream(
                mmloader.zip(caption=mmloader.TextReader(url, "txt")),
                batch_size=3,
                order=mmloader.Order(seed=2, block_size=4),
            ),
            num_workers=2,
            backend="thread",
        )

    full = [b["__key__"] for b in loader()]
    first = loader()
    it = iter(first)
    seen = [next(it)["__key__"] for _ in range(3)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + [b["__key__"] for b in resumed] == full


def test_store_pickles_without_client_or_credentials(data):
    store = mmloader.open(data["s3"]["tar"])
    store.read_many([0, 5, 9], ["txt"])
    blob = pickle.dumps(store)
    assert b"testing" not in blob and b"obstore" not in blob  # no key from the environment, no client
    again = pickle.loads(blob)
    assert again[3] == store[3]


# -- coalescing and read-ahead ------------------------------------------------------------------------------
@pytest.fixture
def proxied(data, s3):
    """The S3 datasets seen through a fault-injecting proxy (its own endpoint)."""
    proxy = FaultProxy(f"127.0.0.1:{s3.port}")
    yield proxy, {"endpoint": proxy.url}
    proxy.stop()


def test_a_batch_of_adjacent_samples_is_one_coalesced_request(data, proxied):
    proxy, opts = proxied
    store = mmloader.open(data["s3"]["tar"], storage_options=opts, readahead=False)
    store.read_many([0], ["txt"])
    proxy.ranges.clear()
    keys, cols = store.read_many([1, 2, 3, 4], ["jpg", "txt"])  # one shard (5 per shard), adjacent
    shard_gets = [r for p, r in proxy.ranges if p.endswith(".tar")]
    assert len(shard_gets) == 1, proxy.ranges
    assert cols == mmloader.open(data["local"]["tar"]).read_many([1, 2, 3, 4], ["jpg", "txt"])[1]
    proxy.ranges.clear()
    far = RemoteTarStore(data["s3"]["tar"], storage_options=opts, readahead=False, coalesce=0)
    far.read_many([0], ["txt"])
    proxy.ranges.clear()
    far.read_many([1, 2, 3, 4], ["jpg", "txt"])
    assert len([r for p, r in proxy.ranges if p.endswith(".tar")]) == 4  # threshold 0: one request per sample


# -- the shard cache -------------------------------------------------------------------------------------------
def test_cache_stays_under_its_limit_over_3_epochs_and_deletes_only_cached_files(data, tmp_path):
    local = mmloader.open(data["local"]["tar"])
    sizes = [s["bytes"] for s in local.shards]
    limit = sum(sizes) // 2
    cache_dir = tmp_path / "cache"
    (cache_dir / "mine").mkdir(parents=True)
    (cache_dir / "mine" / "notes.tar").write_bytes(b"x" * 5000)  # the user's files: never evicted
    (cache_dir / "big-user-file.bin").write_bytes(b"y" * limit)
    store = mmloader.open(data["s3"]["tar"], cache_dir=str(cache_dir), cache_limit=limit)
    cache = store._cache
    for epoch in range(3):
        order = np.random.default_rng(epoch).permutation(N).tolist()
        for i in range(0, N, 4):
            assert store.read_many(order[i : i + 4], ["jpg"])[1] == local.read_many(order[i : i + 4], ["jpg"])[1]
            assert cache.size() <= limit
        store.wait_for_cache()
        assert cache.size() <= limit
    finals, _ = cache.usage()
    assert finals and all(p.parent == cache.dir for _m, _s, p in finals)
    assert (cache_dir / "mine" / "notes.tar").read_bytes() == b"x" * 5000
    assert (cache_dir / "big-user-file.bin").stat().st_size == limit
    assert not list(cache.dir.glob(".*.part-*"))
    # nothing but the cached shards and the marker: no lock file per shard ever cached (#34)
    assert sorted(p.name for p in cache.dir.iterdir()) == sorted(
        [shard_cache.MARKER, *(p.name for _m, _s, p in finals)]
    )


_SHARE = textwrap.dedent("""
    import os, sys
    sys.path[:0] = {paths!r}
    import mmloader
    store = mmloader.open({url!r}, cache_dir={cache!r}, storage_options={{"endpoint": {endpoint!r}}})
    print(store.prefetch(progress=False))
""")


def test_two_processes_sharing_a_cache_download_each_shard_once(data, proxied, tmp_path):
    proxy, opts = proxied
    proxy.latency = 0.05  # downloads overlap
    local = mmloader.open(data["local"]["tar"])
    code = _SHARE.format(
        paths=[str(HERE.parent), str(HERE)], url=data["s3"]["tar"], cache=str(tmp_path / "c"), endpoint=opts["endpoint"]
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and [o.split()[-1] for o in outs] == ["5", "5"]
    for shard in local.shards:  # (a shard of one request's size comes in a whole GET, without Range)
        whole = f"bytes=0-{shard['bytes'] - 1}"
        got = [r for path, r in proxy.ranges if path.endswith("/" + shard["file"]) and r in (None, whole)]
        assert len(got) == 1, (shard["file"], got)
    cached = mmloader.open(data["s3"]["tar"], cache_dir=str(tmp_path / "c"), storage_options=opts)
    assert _all(cached) == _all(local)


_SLOW_DOWNLOAD = textwrap.dedent("""
    import os, sys
    sys.path[:0] = {paths!r}
    import mmloader
    store = mmloader.open({url!r}, cache_dir={cache!r}, storage_options={{"endpoint": {endpoint!r}}},
                          retry_deadline=600)
    print("opened", flush=True)
    sys.stdin.readline()
    store.cache_shard(0)
""")


def test_kill_9_during_a_download_leaves_no_partial_visible(data, proxied, tmp_path):
    proxy, opts = proxied
    code = _SLOW_DOWNLOAD.format(
        paths=[str(HERE.parent), str(HERE)], url=data["s3"]["tar"], cache=str(tmp_path / "c"), endpoint=opts["endpoint"]
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "opened"
    cache = mmloader.open(data["s3"]["tar"], cache_dir=str(tmp_path / "c"), storage_options=opts)._cache  # same dir
    proxy.hang(1000)  # every request hangs: the download is in progress when the process dies
    p.stdin.write("go\n")
    p.stdin.flush()
    deadline = time.monotonic() + 30
    while not list(cache.dir.glob(".*.part-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(cache.dir.glob(".*.part-*")), "the download never started"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    proxy.faults.clear()
    name = mmloader.open(data["local"]["tar"]).shards[0]["file"]
    assert cache.lookup(name) is None and not (cache.dir / name).exists()  # nothing partial under the name
    assert cache.size() == 0  # the dead download's part is not counted, and is removed
    store = mmloader.open(data["s3"]["tar"], cache_dir=str(tmp_path / "c"), storage_options=opts)
    assert store.cache_shard(0) is not None  # its lock died with it
    assert not list(cache.dir.glob(".*.part-*"))
    assert store[0] == mmloader.open(data["local"]["tar"])[0]


# -- writing ---------------------------------------------------------------------------------------------------
def test_converting_to_s3_then_reading_back_equals_the_local_conversion(s3, tmp_path):
    from mmloader.converters import pairs

    raw = write_pairs_folder(tmp_path / "raw", 12, 16)
    for fmt, suffix in (("tar", ""), ("lmdb", ".lmdb")):
        assert pairs.main([str(raw), str(tmp_path / f"local{suffix}"), "--shard-size", "5", "-q"]) == 0
        url = f"s3://{s3.bucket}/converted-{fmt}{suffix}"
        assert pairs.main([str(raw), url, "--shard-size", "5", "-q"]) == 0
        assert _all(mmloader.open(url, cache_dir=str(tmp_path / "c"))) == _all(
            mmloader.open(tmp_path / f"local{suffix}")
        )
        assert pairs.main([str(raw), url, "-q"]) == 1  # exists: refused without --overwrite
        assert pairs.main([str(raw), url, "--overwrite", "--shard-size", "3", "-q"]) == 0
        assert len(mmloader.open(url, cache_dir=str(tmp_path / "c2"))) == 12
    names = s3.keys("converted-tar/")
    assert "converted-tar/index.json" in names and "converted-tar/data-000003.tar" in names  # 12 / 3 shards
    assert "converted-tar/data-000004.tar" not in names  # objects of the replaced dataset removed


def test_a_missing_bucket_is_named_at_once_not_taken_for_a_missing_object(s3, tmp_path, capsys, monkeypatch):
    """The server's NoSuchBucket is named (it was "data-000000.tar: no such object", while
    uploading): when converting (before any shard is written), writing and opening, and at once
    (no retries)."""
    from mmloader.converters import pairs

    raw = write_pairs_folder(tmp_path / "raw", 3, 16)
    url = "s3://no-such-bucket-mm/x"
    started = time.monotonic()
    assert pairs.main([str(raw), url, "-q"]) != 0
    err = capsys.readouterr().err
    assert "no such bucket 'no-such-bucket-mm' (the server says NoSuchBucket" in err and "data-0000" not in err, err
    with pytest.raises(RemoteError, match=r"s3://no-such-bucket-mm/x/index.json: LIST failed: no such bucket"):
        mmloader.writer_for(url)
    with pytest.raises(RemoteError, match=r"s3://no-such-bucket-mm/x/index.json: GET failed: no such bucket"):
        mmloader.open(url, retry_deadline=60)
    assert time.monotonic() - started < 10


def test_invalid_bucket_names_and_refused_access_are_named_not_retried():
    """The answers S3 gives (their XML as sent; moto answers NoSuchBucket for every name, so the
    others are read here from the bodies AWS documents) become one message, raised at once."""
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidBucketName</Code><Message>The specified '
        b"bucket is not valid.</Message><BucketName>My_Bucket</BucketName></Error>"
    )
    e = OSError(f"s3://My_Bucket/x/index.json: HTTP status 400: {body.decode()}")  # as obstore quotes it
    assert remote.server_refusal(e) == (
        "invalid bucket name 'My_Bucket' (the server says InvalidBucketName: The specified bucket is not valid.)"
    )
    location = remote.Location("s3://My_Bucket/x")
    with pytest.raises(RemoteError, match="LIST failed: invalid bucket name 'My_Bucket'"):
        remote._Deadline(location.policy, "s3://My_Bucket/x/index.json", "LIST").next_delay(e, location)
    denied = OSError("HTTP status 403: <Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
    assert remote.server_refusal(denied) == "access denied (the server says AccessDenied: Access Denied)"
    assert remote.server_refusal(OSError("HTTP status 503: <Error><Code>SlowDown</Code></Error>")) is None


_KILLED_UPLOAD = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    import mmloader
    from conftest import make_samples
    with mmloader.writer_for({url!r}, shard_size=2, storage_options={{"endpoint": {endpoint!r}}}) as w:
        for s in make_samples(16):
            w.write(s)
        print("closing", flush=True)  # the last uploads: shards, indexes, then the manifest
""")


def test_a_killed_upload_leaves_no_manifest(s3, proxied, tmp_path):
    proxy, opts = proxied
    url = f"s3://{s3.bucket}/killed"
    proxy.latency = 0.2
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _KILLED_UPLOAD.format(paths=[str(HERE.parent), str(HERE)], url=url, endpoint=opts["endpoint"]),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "MMLOADER_TMPDIR": str(tmp_path)},
    )  # its local files die with it
    assert p.stdout.readline().strip() == "closing"
    deadline = time.monotonic() + 60
    while not any(k.endswith(".idx.npy") for k in s3.keys("killed/")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)  # while the indexes upload
    p.wait()
    names = s3.keys("killed/")
    assert any(k.endswith(".tar") for k in names) and "killed/index.json" not in names  # shards, no dataset
    with pytest.raises(mmloader.FormatError, match="killed has no index.json"):
        mmloader.open(url)


def test_an_lmdb_copy_that_does_not_match_its_metadata_is_refused_and_not_kept(s3, data, tmp_path):
    import shutil

    import lmdb

    bad = tmp_path / "bad.lmdb"
    shutil.copytree(data["local"]["lmdb"], bad)
    env = lmdb.open(str(bad), max_dbs=1024)
    meta_db = env.open_db(b"__meta__")
    with env.begin(write=True) as txn:
        meta = json.loads(txn.get(b"meta", db=meta_db))
        meta["field_counts"]["jpg"] += 1  # the records no longer match what the metadata says
        txn.put(b"meta", json.dumps(meta).encode(), db=meta_db)
    env.close()
    url = s3.upload(bad, "bad.lmdb")
    with pytest.raises(mmloader.FormatError, match=r"bad\.lmdb: the fetched copy does not match its metadata"):
        mmloader.open(url, cache_dir=str(tmp_path / "c"))
    assert not list((tmp_path / "c").glob("mmloader-*/data.mdb"))


def test_credentials_are_resolved_again_when_the_environment_changes(data, monkeypatch):
    store = mmloader.open(data["s3"]["tar"], readahead=False)
    store.read_many([0], ["txt"])
    first = store.location.client()
    assert store.location.client() is first
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rotated")
    assert store.location.client() is not first  # a new client, built from the new credentials
    assert store[1]["txt"] == mmloader.open(data["local"]["tar"])[1]["txt"]


def _foreign_shards(folder: Path) -> Path:
    """15 samples in tar shards of 6 that webdataset wrote (no mmloader index)."""
    import webdataset as wds

    folder.mkdir()
    with wds.ShardWriter(str(folder / "f-%03d.tar"), maxcount=6, verbose=0) as sw:
        for smp in make_samples(15):
            sw.write({"__key__": smp["__key__"], "txt": smp["txt"], "jpg": smp["jpg"]})
    return folder


def test_index_verify_inspect_merge_on_urls(s3, data, tmp_path, capsys):

    from mmloader.cli import main

    foreign = _foreign_shards(tmp_path / "foreign")
    url = s3.upload(foreign, "foreign")
    assert main(["index", url, "-q"]) == 0
    assert main(["verify", url, "-q"]) == 0
    assert main(["inspect", url, "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "samples: 15" in out and url in out
    assert (
        main(["merge", str(data["local"]["tar"]), str(data["local"]["tar"]), f"s3://{s3.bucket}/merged", "-q"]) == 1
    )  # the same part twice: duplicate keys, refused, nothing published
    assert "merged/index.json" not in s3.keys("merged/")
    assert main(["merge", str(data["local"]["tar"]), f"s3://{s3.bucket}/merged", "-q"]) == 0
    assert _all(mmloader.open(f"s3://{s3.bucket}/merged")) == _all(mmloader.open(data["local"]["tar"]))
    assert main(["inspect", f"s3://{s3.bucket}/nothing-here"]) == 1
    assert "s3://mmloader-test/nothing-here has no index.json" in capsys.readouterr().err


def test_an_index_kept_locally_for_shards_on_s3(s3, tmp_path, capsys):
    """`mmloader index s3://... -o DIR`: the index in a local folder, each shard pinned to the
    version indexed; a shard replaced on the bucket since is an error, never bytes read at the
    old offsets; an index that cannot be finished leaves no folder behind."""
    import webdataset as wds

    from mmloader.cli import main
    from mmloader.storage.remote import ObjectChangedError

    foreign = _foreign_shards(tmp_path / "foreign")
    url = s3.upload(foreign, "kept-locally")
    index = tmp_path / "index"
    assert main(["index", url, "-o", str(index), "-q"]) == 0
    assert s3.keys("kept-locally/") == [f"kept-locally/f-00{i}.tar" for i in range(3)]  # nothing written there
    manifest = json.loads((index / "index.json").read_text())
    assert manifest["shards_url"] == url and all(sh["etag"] for sh in manifest["shards"])
    store = mmloader.open(str(index))
    assert isinstance(store, RemoteTarStore) and len(store) == 15
    expected = [
        (s["__key__"], s["txt"]) for s in wds.WebDataset(sorted(map(str, foreign.glob("*.tar"))), shardshuffle=False)
    ]
    assert [(store[i]["__key__"], store[i]["txt"]) for i in range(15)] == expected

    (foreign / "f-001.tar").write_bytes((foreign / "f-002.tar").read_bytes())  # replaced on the bucket
    s3.client().upload_file(str(foreign / "f-001.tar"), s3.bucket, "kept-locally/f-001.tar")
    fresh = mmloader.open(str(index))
    assert fresh[0]["txt"] == store[0]["txt"]  # the shards left as they were still read
    with pytest.raises(ObjectChangedError, match=r"f-001.tar.*the index in .*index describes .*build it again"):
        fresh[7]
    cached = mmloader.open(str(index), cache_dir=tmp_path / "cache", verify_checksums=True)
    assert cached.prefetch([0], progress=False) == 1  # checksummed as it is cached (the file read back)

    (foreign / "f-002.tar").write_bytes(b"not a tar" * 100)
    s3.client().upload_file(str(foreign / "f-002.tar"), s3.bucket, "kept-locally/f-002.tar")
    assert main(["index", url, "-o", str(tmp_path / "broken"), "-q"]) == 1
    assert "f-002.tar" in capsys.readouterr().err
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken*"))


def test_preview_bench_and_plan_on_urls(data, tmp_path, capsys):
    from mmloader.cli import main

    url = data["s3"]["tar"]
    assert main(["preview", url, "-o", str(tmp_path / "p.png"), "-n", "4"]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0
    assert main(["bench", url, "--epochs", "1", "--batch-size", "8", "--workers", "1"]) == 0
    config = tmp_path / "c.yaml"
    config.write_text(
        f"batch_size: 4\nsources:\n  s:\n    path: {url}\n    modalities:\n      caption: {{field: txt}}\n"
    )
    assert main(["plan", str(config), "--world", "2"]) == 0
    assert "12 samples per rank = 3 batches of 4" in capsys.readouterr().out


# -- faults ----------------------------------------------------------------------------------------------------
def test_503_bursts_resets_truncated_bodies_and_latency_are_retried(data, proxied):
    proxy, opts = proxied
    local = mmloader.open(data["local"]["tar"])
    store = mmloader.open(data["s3"]["tar"], storage_options=opts, readahead=False, retry_deadline=30)
    proxy.latency = 0.02
    proxy.fail(4)
    proxy.reset(3)
    proxy.truncate(3)
    proxy.fail(2, status=500)
    proxy.fail(2, status=429)
    for i in range(0, N, 6):
        assert (
            store.read_many(list(range(i, i + 6)), ["jpg", "txt"])[1]
            == local.read_many(list(range(i, i + 6)), ["jpg", "txt"])[1]
        )
    assert not proxy.faults  # every fault was served, and recovered from


def test_a_server_restarted_mid_epoch_pauses_the_loader_then_it_continues(data, proxied):
    proxy, opts = proxied
    url = data["s3"]["tar"]
    ds = mmloader.zip(
        caption=mmloader.TextReader(mmloader.open(url, storage_options=opts, readahead=False, retry_deadline=30), "txt")
    )
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=4, order=mmloader.Order(seed=0, block_size=4)),
        num_workers=1,
        backend="thread",
        prefetch_factor=1,
    )
    got, pause, last = [], 0.0, 0.0
    for j, batch in enumerate(loader):
        got += batch["__key__"]
        now = time.monotonic()
        if j >= 2:  # the longest wait for a batch after the server went away
            pause = max(pause, now - last)
        if j == 1:
            proxy.stop()
            threading.Timer(1.5, proxy.start).start()
            now = time.monotonic()
        last = now
    assert sorted(got) == sorted(mmloader.open(data["local"]["tar"]).keys)
    assert pause >= 0.5  # it waited for the server (batches read ahead before it went came at once)


def test_a_server_gone_raises_an_error_naming_the_url_within_the_deadline(data, proxied):
    proxy, opts = proxied
    store = mmloader.open(data["s3"]["tar"], storage_options=opts, readahead=False, retry_deadline=2)
    store.read_many([0], ["txt"])
    proxy.stop()
    ds = mmloader.zip(caption=mmloader.TextReader(store, "txt"))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=0), num_workers=2, backend="thread")
    t0 = time.monotonic()
    with pytest.raises(RemoteUnavailableError, match=r"s3://mmloader-test/shards/data-00000\d\.tar.*retry_deadline=2"):
        for _ in loader:
            pass
    assert time.monotonic() - t0 < 15


def test_a_hung_request_times_out_and_is_retried(data, proxied):
    proxy, opts = proxied
    store = mmloader.open(
        data["s3"]["tar"], storage_options=opts, readahead=False, request_timeout=1, retry_deadline=20
    )
    assert store[0] == mmloader.open(data["local"]["tar"])[0]  # indexes fetched: next is a data request
    proxy.hang(1)
    t0 = time.monotonic()
    assert store[3] == mmloader.open(data["local"]["tar"])[3]
    assert time.monotonic() - t0 < 4.5  # cut after request_timeout=1 s, then retried


def test_wrong_bytes_are_never_passed_on_and_missing_objects_fail_at_once(data, s3, tmp_path):
    local = data["local"]["tar"]
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(local, bad)
    shard = mmloader.open(local).shards[1]["file"]
    blob = (bad / shard).read_bytes()
    (bad / shard).write_bytes(blob[512:] + b"\0" * 512)  # every member moved: the index no longer matches
    url = s3.upload(bad, "bad")
    store = mmloader.open(url, readahead=False)
    with pytest.raises(mmloader.SampleError, match=r"offset index does not match.*bad/data-000001\.tar"):
        store.read_many([5, 6], ["jpg"])
    s3.client().delete_object(Bucket=s3.bucket, Key=f"bad/{mmloader.open(local).shards[2]['file']}")
    t0 = time.monotonic()
    with pytest.raises((FileNotFoundError, RemoteError, mmloader.FormatError), match="bad/data-000002.tar"):
        store.read_many([11], ["jpg"])
    assert time.monotonic() - t0 < 5  # a missing object is not retried


def test_url_helpers_and_cache_limits_docstrings():
    for module in (urls, location, ranges, shard_cache, redaction, failures, servers):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0


# -- versions: a dataset replaced while it is read ------------------------------------------------------------
def _upload_tar(s3, local: Path, prefix: str) -> str:
    return s3.upload(local, prefix)


def _rewritten_shard(local_tar: Path, name: str) -> bytes:
    """Shard ``name`` with every caption changed but every size and offset kept (the layout
    checks cannot tell: only the version can)."""
    data = (local_tar / name).read_bytes()
    changed = data.replace(b"caption number", b"CAPTION NUMBER")
    assert changed != data and len(changed) == len(data)
    return changed


def test_a_shard_replaced_while_reading_is_an_error_never_a_mixture(data, s3, tmp_path):
    client = "obstore"
    url = _upload_tar(s3, data["local"]["tar"], f"replaced-{client}")
    store = mmloader.open(url, readahead=False)
    worker_copy = pickle.loads(pickle.dumps(store))  # what a DataLoader worker gets
    name = store.shards[1]["file"]
    assert store[0]["txt"] == worker_copy[0]["txt"] == "caption number 0 é".encode()
    s3.client().put_object(
        Bucket=s3.bucket, Key=f"replaced-{client}/{name}", Body=_rewritten_shard(data["local"]["tar"], name)
    )
    first = store.metadata["_starts"][1]
    for reader in (store, worker_copy):
        with pytest.raises(
            remote.ObjectChangedError, match=rf"{name}: the object changed since this dataset was opened"
        ):
            reader.read_many([first, first + 1], ["txt"])
    assert store[0]["txt"] == "caption number 0 é".encode()  # untouched shards read on
    fresh = mmloader.open(url, readahead=False)  # opened after the change: the new version, consistently
    assert fresh[first]["txt"].startswith(b"CAPTION NUMBER")


def test_a_replaced_dataset_fails_the_running_epoch_loudly(data, s3):
    url = _upload_tar(s3, data["local"]["tar"], "replaced-epoch")
    ds = mmloader.zip(caption=mmloader.TextReader(url, "txt"))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=4, order=mmloader.Order(seed=1, block_size=4), errors="skip"),
        num_workers=2,
        backend="process",
    )
    it = iter(loader)
    next(it)
    for shard in mmloader.open(data["local"]["tar"]).shards:  # every shard rewritten, same layout
        s3.client().put_object(
            Bucket=s3.bucket,
            Key=f"replaced-epoch/{shard['file']}",
            Body=_rewritten_shard(data["local"]["tar"], shard["file"]),
        )
    with pytest.raises(Exception, match="changed since this dataset was opened"):
        for batch in it:  # even under on_error="skip": a version change is not a bad sample
            assert not any("CAPTION" in c for c in batch["caption"]), "a mixture was delivered"


def test_cache_is_keyed_by_the_dataset_version_and_the_endpoint(data, s3, tmp_path):
    url = _upload_tar(s3, data["local"]["tar"], "recached")
    cache = str(tmp_path / "cache")
    old = mmloader.open(url, cache_dir=cache)
    assert old.prefetch(progress=False) == len(old.shards)
    local = data["local"]["tar"]
    rewritten = tmp_path / "rewritten"
    rewritten.mkdir()
    for p in local.iterdir():
        body = _rewritten_shard(local, p.name) if p.suffix == ".tar" else p.read_bytes()
        (rewritten / p.name).write_bytes(body)
    manifest = json.loads((local / "index.json").read_text())
    for shard in manifest["shards"]:  # the new shards' own checksums: another manifest
        import hashlib

        shard["sha256"] = hashlib.sha256((rewritten / shard["file"]).read_bytes()).hexdigest()
    (rewritten / "index.json").write_text(json.dumps(manifest))
    s3.upload(rewritten, "recached")
    new = mmloader.open(url, cache_dir=cache)
    assert new[0]["txt"].startswith(b"CAPTION NUMBER")  # not the old cached copy
    assert new.prefetch(progress=False) == len(new.shards) and new[0]["txt"].startswith(b"CAPTION NUMBER")
    a = remote.Location(url, {"endpoint": "http://127.0.0.1:1"}).identity()
    b = remote.Location(url, {"endpoint": "http://127.0.0.1:2"}).identity()
    assert a != b


def test_a_cached_shard_changed_on_disk_is_never_served(data, s3, tmp_path, caplog):
    """One flipped payload byte in a cached shard came back as data, no error (issue 60)."""
    url = _upload_tar(s3, data["local"]["tar"], "flipped")
    cache = str(tmp_path / "cache")
    first = mmloader.open(url, cache_dir=cache)
    assert first.prefetch(progress=False) == len(first.shards)
    want = [first[i]["txt"] for i in range(N)]
    copy = Path(first._cache.path(first.shards[0]["file"]))
    raw = bytearray(copy.read_bytes())
    at = raw.index(b"caption number")
    raw[at] ^= 0x20  # 'c' -> 'C': same size, the tar headers untouched
    copy.write_bytes(bytes(raw))
    again = mmloader.open(url, cache_dir=cache)  # (another process would open it the same way)
    with caplog.at_level("WARNING", logger="mmloader"):
        got = [again[i]["txt"] for i in range(N)]
    assert got == want  # read from the object store while the copy is fetched again
    assert f"cached copy {copy}" in caplog.text and "does not hold the bytes the manifest names" in caplog.text
    again.wait_for_cache()
    assert again.prefetch(progress=False) == len(again.shards)
    assert copy.read_bytes() == (data["local"]["tar"] / first.shards[0]["file"]).read_bytes()


# -- failures that no retry can cure are reported at once --------------------------------------------------
class _NoRangeHandler(__import__("http.server").server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_permanent_failures_are_not_retried_until_the_deadline(data, s3, tmp_path):
    import http.server
    import socketserver

    root = data["root"]

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), lambda *a, **kw: _NoRangeHandler(*a, directory=str(root), **kw))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/shards"
        store = mmloader.open(url, readahead=False, retry_deadline=60)
        with pytest.raises(RemoteError, match="Range|ranged reads"):
            store.read_many([0, 7], ["txt"])
        with pytest.raises(mmloader.MMLoaderError, match="has no index.json"):  # PROPFIND: 501, not retried
            mmloader.open(f"http://127.0.0.1:{httpd.server_address[1]}/nothing", retry_deadline=60)
        assert time.monotonic() - started < 20
    finally:
        httpd.shutdown()
        httpd.server_close()
    # an object truncated (replaced by a shorter one) after it was indexed
    url = _upload_tar(s3, data["local"]["tar"], "truncated")
    store = mmloader.open(url, readahead=False, retry_deadline=60)
    name = store.shards[2]["file"]
    store.location.pins.pop(name, None)  # as if it had been truncated in place (no version to compare)
    s3.client().put_object(
        Bucket=s3.bucket, Key=f"truncated/{name}", Body=(data["local"]["tar"] / name).read_bytes()[:3000]
    )
    started = time.monotonic()
    with pytest.raises(remote.ObjectChangedError, match="truncated or replaced"):
        store.read_many([store.metadata["_starts"][2] + 3], ["jpg"])
    assert time.monotonic() - started < 10


def test_urls_and_options_that_cannot_work_are_refused_up_front(data, s3, tmp_path):
    for bad in ("s3://b/ds?x=1", "s3://b/ds#frag", "s3://b/pct%41", "https://h/ds?sig=1"):
        with pytest.raises(ValueError, match="cannot hold|percent-escapes"):
            mmloader.open(bad)
        with pytest.raises(ValueError, match="cannot hold|percent-escapes"):
            mmloader.writer_for(bad).close()
    url = data["s3"]["tar"]
    for options, message in (
        (dict(max_in_flight=0), "max_in_flight"),
        (dict(request_timeout=0), "request_timeout"),
        (dict(chunk_bytes=0), "chunk_bytes"),
        (dict(readahead_bytes=-1), "readahead_bytes"),
        (dict(cache_limit="1G"), "needs cache_dir"),
    ):
        with pytest.raises(ValueError, match=message):
            mmloader.open(url, **options)


def test_http_versions_are_pinned_when_opened_so_workers_agree(data, tmp_path):
    """A plain HTTP server cannot list: the opening process pins each shard with a HEAD, so a
    worker whose first read comes after a replacement still sees the change (it would
    otherwise pin the new version and mix it with the other workers' old one)."""
    import shutil

    root = tmp_path / "site"
    shutil.copytree(data["local"]["tar"], root / "ds")
    server = RangeServer(root)
    try:
        store = mmloader.open(f"{server.url}/ds", readahead=False)
        worker_copy = pickle.loads(pickle.dumps(store))  # has not read anything yet
        name = store.shards[1]["file"]
        time.sleep(0.01)  # the test server's ETag is size + mtime
        (root / "ds" / name).write_bytes(_rewritten_shard(data["local"]["tar"], name))
        first = store.metadata["_starts"][1]
        with pytest.raises(remote.ObjectChangedError, match=name):
            worker_copy.read_many([first], ["txt"])
    finally:
        server.stop()


def test_an_upper_case_scheme_reads_and_a_request_that_cannot_be_built_fails_at_once(data, s3):
    """``HTTP://`` opened (the standard-library client) but obstore was not told to allow plain
    HTTP for it: every data read failed with a "builder error", retried until the deadline."""
    from mmloader.storage.remote.obstore_client import _ObstoreClient

    local = mmloader.open(data["local"]["tar"])
    http = data["http"]["tar"].replace("http://", "HTTP://")
    for url in (http, data["s3"]["tar"].replace("s3://", "S3://")):
        store = mmloader.open(url, readahead=False, retry_deadline=60)
        assert store.url == url.rstrip("/").replace("HTTP://", "http://").replace("S3://", "s3://")
        assert store.read_many([0, 7], ["txt"]) == local.read_many([0, 7], ["txt"])
        assert (
            _ObstoreClient(remote.Location(url)).get("index.json") == (data["local"]["tar"] / "index.json").read_bytes()
        )
    started = time.monotonic()
    client = _ObstoreClient(
        remote.Location(data["http"]["tar"], {"allow_http": False}, remote.Policy(retry_deadline=60))
    )
    with pytest.raises(RemoteError, match="builder error"):
        client.get("index.json")
    assert time.monotonic() - started < 10


def test_opening_a_dataset_whose_endpoint_does_not_answer_takes_one_deadline():
    """The listing was retried until the deadline, its failure set aside, and the manifest's GET
    retried until it again: twice ``retry_deadline``."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there once closed
    options = {"endpoint": f"http://127.0.0.1:{port}", "access_key_id": "AKID", "secret_access_key": "testing1"}
    started = time.monotonic()
    with pytest.raises(
        RemoteUnavailableError, match=f"s3://bucket/ds: LIST failed: cannot connect to 127.0.0.1:{port}"
    ):
        mmloader.open("s3://bucket/ds", storage_options=options, retry_deadline=2)
    assert time.monotonic() - started < 3.0


@pytest.mark.timeout(120)  # before: two minutes each, retrying a refused connection for retry_deadline
def test_the_cli_against_an_endpoint_that_refuses_fails_within_seconds_saying_why(tmp_path):
    """``mmloader inspect http://127.0.0.1:PORT/data/`` (and ``s3://`` at such an endpoint),
    nothing listening there: exit status 1 within seconds, one error naming the URL, the host,
    that the connection was refused and what to check (it retried for 120 s)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there once closed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMLOADER_", "AWS_")) and "PROXY" not in k.upper()}
    env["MMLOADER_CACHE_DIR"] = str(tmp_path / "cache")
    s3_env = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "AKID"}
    s3_env["AWS_SECRET_ACCESS_KEY"] = "testing1"
    for url, run_env, check in (
        (f"http://127.0.0.1:{port}/data/", env, "check the URL's host and port"),
        ("s3://bucket/data/", s3_env, "check the endpoint (storage_options['endpoint'], AWS_ENDPOINT_URL)"),
    ):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "mmloader.cli", "inspect", url],
            capture_output=True,
            text=True,
            env=run_env,
            timeout=100,
        )
        elapsed, said = time.monotonic() - started, done.stdout + done.stderr
        assert done.returncode == 1 and elapsed < 20, (elapsed, said)
        errors = [line for line in said.splitlines() if "error:" in line and "WARNING" not in line]
        assert len(errors) == 1, said
        assert f"cannot connect to 127.0.0.1:{port}: the connection was refused" in errors[0], said
        assert check in errors[0] and "first_contact_deadline=5 s" in errors[0], said


def test_sigterm_is_an_interrupt_while_an_index_is_built(tmp_path):
    """`kill`/Slurm/Kubernetes send SIGTERM: an index being built cleans up as for Ctrl-C."""
    code = textwrap.dedent(
        """
        import os, signal, time
        from mmloader.storage.remote.index import _terminate_as_interrupt
        try:
            with _terminate_as_interrupt():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
        except KeyboardInterrupt:
            print("interrupted", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "interrupted True", done.stderr


def test_a_stream_that_cannot_be_spawned_is_said_or_read_with_threads(data):
    """Workers reading object storage start with spawn, which pickles the stream: a lambda
    transform fails there with torch's bare pickling error. backend="process" says why and what to
    do; backend="auto" reads with threads instead."""
    ds = mmloader.zip(caption=mmloader.TextReader(data["s3"]["tar"], "txt", transform=lambda b: b.upper()))
    stream = mmloader.Stream(ds, batch_size=6, seed=1)
    with pytest.raises(
        mmloader.errors.MMLoaderError, match=r"start with 'spawn'.*Define transforms .* at module level"
    ):
        mmloader.loader(stream, num_workers=2, backend="process")
    loader = mmloader.loader(stream, num_workers=2)  # auto: user Python per sample, yet threads
    assert type(loader).__name__ == "ThreadLoader"
    assert sorted(k for b in loader for k in b["__key__"]) == sorted(mmloader.open(data["local"]["tar"]).keys)


def test_a_shard_cached_from_a_server_without_range_support(data, tmp_path):
    """A plain HTTP server that ignores Range (python -m http.server) serves whole shards: the node
    cache downloads a shard that fits one request with one whole GET (it failed, asking for a
    range), so ``prefetch()`` then reads the dataset from the cache."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(data["local"]["tar"]))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(RemoteError, match="does not support ranged reads .*download it and open the local copy"):
            mmloader.open(url, readahead=False)[3]  # in place: Range is needed
        cached = mmloader.open(url, cache_dir=str(tmp_path / "cache"))
        assert cached.prefetch(progress=False) == len(cached.shards)
        assert _all(cached) == _all(mmloader.open(data["local"]["tar"]))
    finally:
        server.shutdown()
        server.server_close()
