"""Damaged and half-written datasets, locally and on object storage (a real moto S3 server on
127.0.0.1): a truncated LMDB is an error naming it, never a SIGBUS; a failed remote writer leaves
nothing behind; merge reads LMDB URLs and refuses tar URLs in one line; ``-q`` silences the bars
of remote work."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest
from conftest import ROOT, make_samples, write_dataset, write_pairs_folder
from remote_servers import FaultProxy, own_cache, s3  # noqa: F401  (fixtures)

import mmloader
from mmloader.errors import FormatError


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a SIGBUS there fails the test, not the test run)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=env, timeout=120
    )


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return _python("import sys; from mmloader.cli import main; sys.exit(main(sys.argv[1:]))", *argv)


_OPEN = """
    import sys, mmloader
    from mmloader.errors import FormatError
    try:
        store = mmloader.open(sys.argv[1], **({"cache_dir": sys.argv[2]} if len(sys.argv) > 2 else {}))
        print("opened", len(store), store[0]["__key__"])
    except FormatError as e:
        print("FormatError:", e)
"""


def _truncated_copy(src: Path, dst: Path, keep: float = 0.5) -> Path:
    dst.mkdir(parents=True)
    data = (src / "data.mdb").read_bytes()
    (dst / "data.mdb").write_bytes(data[: int(len(data) * keep)])
    return dst


# -- 1. truncated LMDB -------------------------------------------------------------------------------------------
def test_the_meta_page_check_agrees_with_lmdb_itself(lmdb_ds, tmp_path):
    from mmloader.storage.lmdb.store import check_lmdb_file, lmdb_required_size

    copy = tmp_path / "copy.lmdb"  # a copy: the session's dataset may be open in this process already
    copy.mkdir()
    (copy / "data.mdb").write_bytes((lmdb_ds / "data.mdb").read_bytes())
    path = copy / "data.mdb"
    env = lmdb.open(str(copy), readonly=True, lock=False)
    try:
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    data = path.read_bytes()
    assert lmdb_required_size(lambda o, n: data[o : o + n], len(data), "x") == need <= len(data)
    check_lmdb_file(path)  # a whole file passes


def test_a_truncated_local_lmdb_is_an_error_naming_it_not_a_crash(lmdb_ds, tmp_path):
    bad = _truncated_copy(lmdb_ds, tmp_path / "bad.lmdb")
    size = (bad / "data.mdb").stat().st_size
    r = _python(_OPEN, str(bad))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    assert f"FormatError: {bad / 'data.mdb'}: truncated: {size} bytes, its metadata needs at least" in r.stdout
    r = _cli("verify", str(bad), "-q")
    assert r.returncode == 1 and "truncated" in r.stderr and str(bad) in r.stderr, r


@pytest.mark.parametrize(
    "content, why", [(b"\0" * 100, "too small to hold LMDB's meta pages"), (b"not lmdb" * 2000, "bad magic")]
)
def test_a_file_that_is_not_lmdb_is_refused_before_it_is_mapped(tmp_path, content, why):
    d = tmp_path / "x.lmdb"
    d.mkdir()
    (d / "data.mdb").write_bytes(content)
    with pytest.raises(FormatError, match=why):
        len(mmloader.open(d))


def test_a_truncated_lmdb_on_s3_is_refused_naming_the_url_and_nothing_is_cached(s3, lmdb_ds, tmp_path):
    data = (lmdb_ds / "data.mdb").read_bytes()
    s3.client().put_object(Bucket=s3.bucket, Key="half.lmdb/data.mdb", Body=data[: len(data) // 2])
    url, cache = f"s3://{s3.bucket}/half.lmdb", tmp_path / "cache"
    r = _python(_OPEN, url, str(cache))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    assert f"FormatError: {url}/data.mdb: truncated: {len(data) // 2} bytes, its metadata needs at least" in r.stdout
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.startswith(".")]  # no copy kept
    r = _cli("verify", url, "-q")
    assert r.returncode == 1 and "truncated" in r.stderr and url in r.stderr, r


def test_a_bad_cached_copy_is_checked_before_use_removed_and_fetched_again(s3, lmdb_ds, tmp_path):
    url, cache = s3.upload(lmdb_ds, "whole.lmdb"), tmp_path / "cache"
    first = mmloader.open(url, cache_dir=str(cache))
    copy = Path(first.path) / "data.mdb"
    # Damage the cached copy the way a short file looks: both meta pages claim more pages than it has.
    raw = bytearray(copy.read_bytes())
    psize = struct.unpack_from("<I", raw, 40)[0]
    for meta in (0, psize):
        struct.pack_into("<Q", raw, meta + 136, len(raw) // psize + 10)
    copy.write_bytes(bytes(raw))
    r = _python(_OPEN, url, str(cache))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    assert f"FormatError: {url}/data.mdb (cached copy {copy}): truncated" in r.stdout
    assert not copy.exists()  # not kept under its name
    r = _python(_OPEN, url, str(cache))
    assert r.stdout.startswith("opened"), r  # fetched again
    assert copy.read_bytes() == (lmdb_ds / "data.mdb").read_bytes()


# -- 2. a failed remote writer -------------------------------------------------------------------------------------
def _objects(s3, prefix: str) -> list[str]:
    return [k[len(prefix) + 1 :] for k in s3.keys(prefix + "/")]


def test_a_writer_that_fails_deletes_what_it_uploaded_and_nothing_else(s3):
    s3.client().put_object(Bucket=s3.bucket, Key="exc/notes.txt", Body=b"the user's")
    url = f"s3://{s3.bucket}/exc"
    with pytest.raises(RuntimeError, match="user code"):
        with mmloader.writer_for(url, shard_size=2, progress=False) as w:
            for s in make_samples(9):
                w.write(s)
            raise RuntimeError("user code failed")
    assert _objects(s3, "exc") == ["notes.txt"]  # the shards uploaded on the way are gone, not the rest
    with pytest.raises(FormatError, match="has no index.json"):
        mmloader.open(url)
    write_dataset(url, 5, "tar", shard_size=2, progress=False)  # the place is usable again
    assert len(mmloader.open(url)) == 5


def test_overwrite_that_fails_leaves_the_old_dataset_or_none_never_a_mixture(s3):
    url = f"s3://{s3.bucket}/ow"
    write_dataset(url, 6, "tar", shard_size=2, progress=False)
    old = sorted(_objects(s3, "ow"))
    before = [mmloader.open(url)[i] for i in range(6)]
    # Fails before any shard is complete: nothing was uploaded, the old dataset is as it was.
    with pytest.raises(RuntimeError):
        with mmloader.writer_for(url, shard_size=4, overwrite=True, progress=False) as w:
            for s in make_samples(2, prefix="new"):
                w.write(s)
            raise RuntimeError("early")
    assert sorted(_objects(s3, "ow")) == old
    assert [mmloader.open(url)[i] for i in range(6)] == before
    # Fails after new shards replaced old ones: no manifest (none), and the new objects are gone.
    with pytest.raises(RuntimeError):
        with mmloader.writer_for(url, shard_size=2, overwrite=True, progress=False) as w:
            for s in make_samples(5, prefix="new"):
                w.write(s)
            raise RuntimeError("late")
    left = _objects(s3, "ow")
    assert "index.json" not in left and "data-000000.tar" not in left and "data-000001.tar" not in left
    assert set(left) <= set(old)  # what stays is what the writer never touched
    with pytest.raises(FormatError):
        mmloader.open(url)


def test_a_writer_whose_upload_fails_deletes_what_it_uploaded(s3):
    proxy = FaultProxy(f"127.0.0.1:{s3.port}")
    try:
        url = f"s3://{s3.bucket}/upfail"
        w = mmloader.writer_for(url, shard_size=2, progress=False, storage_options={"endpoint": proxy.url})
        for s in make_samples(7):
            w.write(s)
        for f in w._inner._uploads:  # the shards cut so far are on the server
            f.result()
        assert _objects(s3, "upfail")
        proxy.fail(1, status=400)  # the next upload is refused (not retried)
        with pytest.raises(Exception):
            w.close()
        assert _objects(s3, "upfail") == []
    finally:
        proxy.stop()


# -- 3. merge with URL sources ---------------------------------------------------------------------------------------
def _lmdb_on_s3(s3, name: str, start: int) -> str:
    url = f"s3://{s3.bucket}/{name}.lmdb"
    with mmloader.writer_for(url, progress=False) as w:
        for s in make_samples(4, start=start):
            w.write(s)
    return url


def test_merge_reads_lmdb_urls_and_refuses_tar_urls_in_one_line(s3, tmp_path):
    a, b = _lmdb_on_s3(s3, "ma", 0), _lmdb_on_s3(s3, "mb", 100)
    tar_url = s3.upload(write_dataset(tmp_path / "shards", 4, "tar"), "mshards")
    env_cache = {"MMLOADER_CACHE_DIR": str(tmp_path / "cache")}
    os.environ.update(env_cache)
    try:
        for dst in (tmp_path / "all.lmdb", tmp_path / "all", f"s3://{s3.bucket}/merged.lmdb"):
            r = _cli("merge", a, b, str(dst), "-q")
            assert r.returncode == 0, r.stderr
            got = mmloader.open(str(dst))
            assert [got[i]["__key__"] for i in range(len(got))] == [s["__key__"] for s in make_samples(4)] + [
                s["__key__"] for s in make_samples(4, start=100)
            ]
        r = _cli("merge", a, tar_url, f"s3://{s3.bucket}/cat", "-q")
        assert r.returncode == 1
        assert r.stderr.strip() == (
            f"mmloader merge: error: {tar_url}: merge reads tar shards from local folders: "
            f"download them first, e.g. `aws s3 cp --recursive {tar_url}/ mshards/`, "
            "then merge that folder"
        )
        assert "s3:/" + s3.bucket not in r.stderr.replace("s3://", "")  # the URL is never collapsed
        assert not s3.keys("cat/")
        r = _cli("merge", f"s3://{s3.bucket}/x.parts/", str(tmp_path / "y"))
        assert r.returncode == 1 and "local parts directory" in r.stderr, r.stderr
    finally:
        os.environ.pop("MMLOADER_CACHE_DIR", None)


# -- 5. -q silences the bars of remote work -------------------------------------------------------------------------
def test_quiet_silences_upload_and_fetch_bars(s3, tmp_path):
    raw = write_pairs_folder(tmp_path / "raw", 6, 16)
    url = f"s3://{s3.bucket}/quiet"
    r = _python(
        "import sys; from mmloader.cli import main; sys.exit(main(sys.argv[1:]))",
        "convert",
        "pairs",
        str(raw),
        url,
        "--shard-size",
        "2",
        "-q",
    )
    assert r.returncode == 0 and "uploading" not in r.stderr, r.stderr
    r = _cli("convert", "pairs", str(raw), url + ".lmdb", "-q")
    assert r.returncode == 0 and "uploading" not in r.stderr, r.stderr
    os.environ["MMLOADER_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        r = _cli("verify", url + ".lmdb", "-q")
        assert r.returncode == 0 and "fetching" not in r.stderr, r.stderr
        config = tmp_path / "c.yaml"
        config.write_text(
            f"batch_size: 2\nsources:\n  s:\n    path: {url}.lmdb\n    modalities:\n      caption: {{field: txt}}\n"
        )
        (tmp_path / "cache").rename(tmp_path / "cache-old")  # fetched again by plan
        r = _cli("plan", str(config), "-q")
        assert r.returncode == 0 and "fetching" not in r.stderr and "6 samples" in r.stdout, (r.stdout, r.stderr)
    finally:
        os.environ.pop("MMLOADER_CACHE_DIR", None)
