"""Bad inputs, faults, load: nothing lost, nothing silent, nothing executed that should not be."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import _proc_figures, jpeg_bytes, write_dataset, write_pairs_folder

import mmloader
from mmloader.cli import main as cli
from mmloader.cli.verify import verify
from mmloader.errors import ConfigError, DecodeError, FormatError, SampleError, SizeLimitError, UnsafeFieldError

ROOT = Path(__file__).resolve().parents[1]


def _store_with(tmp_path, samples, fmt="tar", name="d"):
    path = tmp_path / (name + (".lmdb" if fmt == "lmdb" else ""))
    with mmloader.writer_for(path, fmt, shard_size=4) as w:
        for s in samples:
            w.write(s)
    return path


def _pairs(n, bad=()):
    for i in range(n):
        img = jpeg_bytes(i)
        yield {"__key__": f"k{i:03d}", "jpg": img[:120] if i in bad else img, "txt": f"t{i}"}


# -- bad input while reading ---------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_corrupt_jpeg_raise_names_key_store_field_in_training_process(tmp_path, fmt):
    path = _store_with(tmp_path, _pairs(12, bad={5}), fmt)
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, shuffle=False), num_workers=2)
    with pytest.raises(DecodeError) as e:  # re-raised in this process, not an opaque worker death
        list(loader)
    msg = str(e.value)
    assert "k005" in msg and "'jpg'" in msg and str(Path(path).name) in msg


def test_skip_policy_replaces_bad_samples_and_keeps_batches_equal(tmp_path, caplog):
    path = _store_with(tmp_path, _pairs(20, bad={3, 11}), "tar")
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    counts = []
    for rank in (0, 1):
        stream = mmloader.Stream(ds, batch_size=4, shuffle=False, errors="skip")
        stream.set_world(rank, 2)
        batches = list(mmloader.loader(stream, num_workers=0))
        counts.append([len(b["__key__"]) for b in batches])
        keys = [k for b in batches for k in b["__key__"]]
        assert "k003" not in keys and "k011" not in keys
        assert stream.skipped == 1  # one bad sample in each rank's half, counted
    assert counts[0] == counts[1] == [4, 4, 2]
    assert "k003" in caplog.text and "k011" in caplog.text


def test_truncated_shard_mid_member(tmp_path):
    path = _store_with(tmp_path, _pairs(8), "tar")
    shard = path / "data-000001.tar"
    data = shard.read_bytes()
    store = mmloader.open(path)
    _s, _row = store.locate(6)
    off, size = np.load(path / "data-000001.tar.idx.npy")[2, 0]
    shard.write_bytes(data[: off + size // 2])  # cut inside sample 6's jpg
    store = mmloader.open(path)
    assert store[5]["txt"] == b"t5"
    with pytest.raises(SampleError, match=r"truncated.*k006.*data-000001\.tar"):
        store[6]
    assert any("data-000001.tar" in p for p in verify(path, progress=False).problems)


def test_shard_missing_on_disk(tmp_path):
    path = _store_with(tmp_path, _pairs(8), "tar")
    (path / "data-000001.tar").unlink()
    with pytest.raises(FormatError, match="data-000001.tar is listed in .* but missing on disk"):
        mmloader.open(path)[5]
    assert "data-000001.tar: listed in the manifest but missing on disk" in verify(path, progress=False).problems


def test_offset_index_not_matching_shard(tmp_path):
    path = _store_with(tmp_path, _pairs(8), "tar")
    table = np.load(path / "data-000000.tar.idx.npy")
    table[1] = table[2]  # sample 1 now points at sample 2's bytes
    np.save(path / "data-000000.tar.idx.npy", table)
    store = mmloader.open(path)
    with pytest.raises(SampleError, match=r"offset index does not match.*'k002\.jpg', expected 'k001\.jpg'"):
        store[1]
    assert not verify(path, progress=False).ok


def test_checksum_mismatch_at_read_time_when_asked(tmp_path):
    path = _store_with(tmp_path, _pairs(8), "tar")
    shard = path / "data-000000.tar"
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0xFF  # inside the end padding: reads still work, but the bytes changed
    shard.write_bytes(bytes(data))
    assert mmloader.open(path)[0]["txt"] == b"t0"
    with pytest.raises(FormatError, match="data-000000.tar: sha256"):
        mmloader.open(path, verify_checksums=True)[0]


def test_lmdb_that_is_not_mmloader(tmp_path):
    import lmdb

    env = lmdb.open(str(tmp_path / "foreign.lmdb"))
    with env.begin(write=True) as t:
        t.put(b"0", pickle.dumps({"img": b"..."}))  # the folder2lmdb pattern
    env.close()
    with pytest.raises(FormatError, match="not an mmloader dataset"):
        mmloader.TextReader(tmp_path / "foreign.lmdb")[0]
    assert cli(["verify", str(tmp_path / "foreign.lmdb"), "-q"]) == 1


@pytest.mark.parametrize(
    "field,data,reader,match",
    [
        ("txt", b"caf\xe9", mmloader.TextReader, "cannot decode: UnicodeDecodeError"),
        ("json", b"{not json", mmloader.JSONReader, "cannot decode: JSONDecodeError"),
        ("cls", b"seven", mmloader.LabelReader, "label 'seven' is not an integer"),
    ],
)
def test_bad_text_json_label(tmp_path, field, data, reader, match):
    path = _store_with(tmp_path, [{"__key__": "bad-one", field: data}], "lmdb")
    with pytest.raises(DecodeError, match=match) as e:
        reader(path, field)[0]
    assert "bad-one" in str(e.value) and f"'{field}'" in str(e.value)


def test_max_field_size_guard(tmp_path):
    path = _store_with(tmp_path, [{"__key__": "big", "txt": "x" * 5000}], "lmdb")
    with pytest.raises(SizeLimitError, match=r"5000 bytes, over the 1000-byte limit.*big"):
        mmloader.TextReader(path, max_field_bytes=1000)[0]
    assert len(mmloader.TextReader(path)[0]) == 5000


def test_gzip_bomb_guard(tmp_path):
    import gzip

    path = _store_with(tmp_path, [{"__key__": "zip", "txt.gz": gzip.compress(b"a" * 10_000_000)}], "lmdb")
    with pytest.raises(SizeLimitError, match="inflates beyond"):
        mmloader.TextReader(path, "txt.gz", max_field_bytes=1_000_000)[0]


def test_max_pixels_configurable(tmp_path):
    path = _store_with(tmp_path, [{"__key__": "img", "jpg": jpeg_bytes(1, size=(200, 100))}], "lmdb")
    with pytest.raises(SizeLimitError, match="200x100 pixels exceeds max_pixels=10000"):
        mmloader.ImageReader(path, max_pixels=10_000)[0]
    assert mmloader.ImageReader(path)[0].shape == (3, 100, 200)


# -- tar safety ------------------------------------------------------------------------------
def test_unsafe_tar_members_ignored_with_warning_never_extracted(tmp_path, caplog):
    src = tmp_path / "evil"
    src.mkdir()
    with tarfile.open(src / "x.tar", "w") as tf:

        def add(name, data=b"ok", **kw):
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)

        add("good.txt", b"fine")
        add("../escape.txt", b"bad")
        add("/abs/path.txt", b"bad")
        add("link.txt", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add("hard.txt", type=tarfile.LNKTYPE, linkname="good.txt")
        add("dev.txt", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        add("also-good.txt", b"fine too")
    before = set(os.listdir(tmp_path))
    mmloader.build_index(src, output=tmp_path / "idx", progress=False)
    ds = mmloader.open(tmp_path / "idx")
    assert list(ds.keys) == ["good", "also-good"]
    for bad in ("../escape.txt", "/abs/path.txt", "link.txt", "hard.txt", "dev.txt"):
        assert bad in caplog.text
    assert set(os.listdir(tmp_path)) == before | {"idx"}  # nothing extracted anywhere
    assert not (tmp_path / "escape.txt").exists()


# -- no code execution from data ---------------------------------------------------------------
class _Payload:
    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling this creates the marker file


def test_malicious_pickle_in_a_shard_is_never_executed(tmp_path):
    marker = tmp_path / "PWNED"
    _Payload.marker = str(marker)
    payload = pickle.dumps(_Payload())
    path = _store_with(
        tmp_path,
        [
            {"__key__": "evil", "pyd": payload, "jpg": jpeg_bytes(1), "txt": "x"},
            {"__key__": "fine", "pyd": payload, "jpg": jpeg_bytes(2), "txt": "y"},
        ],
        "tar",
    )
    store = mmloader.open(path)
    assert store[0]["pyd"] == payload  # bytes, never unpickled
    with pytest.raises(UnsafeFieldError, match="pickled Python objects"):
        mmloader.reader_for(path, "pyd")
    assert cli(["inspect", str(path)]) == 0
    assert cli(["verify", str(path), "--decode", "-q"]) == 0
    assert cli(["preview", str(path), "-o", str(tmp_path / "p.png")]) == 0
    with pytest.raises(ConfigError, match="pickled"):
        mmloader.from_config({"sources": {"s": {"path": str(path), "modalities": {"x": {"field": "pyd"}}}}})
    import webdataset as wds  # the same shard through webdataset, as mmloader users might

    list(wds.WebDataset(str(path / "data-000000.tar"), shardshuffle=False, empty_check=False))
    assert not marker.exists()


def test_npy_with_objects_refused(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([_Payload()], dtype=object), allow_pickle=True)
    path = _store_with(tmp_path, [{"__key__": "evil", "npy": buf.getvalue()}], "lmdb")
    with pytest.raises(UnsafeFieldError):
        mmloader.ArrayReader(path)[0]


# -- faults ------------------------------------------------------------------------------------
def _partial_holding_data(parent: Path, name: str, proc: subprocess.Popen, min_bytes: int) -> Path:
    """Wait until a hidden ``.NAME.partial-*`` of ``proc`` holds ``min_bytes`` of written data."""
    deadline = time.time() + 120
    while time.time() < deadline:
        for p in parent.glob(f".{name}.partial-{proc.pid}-*"):
            size = sum(f.stat().st_size for f in p.iterdir() if f.is_file() and f.suffix in (".tar", ".mdb"))
            if size >= min_bytes:
                return p
        assert proc.poll() is None, "the conversion ended before it was killed"
        time.sleep(0.002)
    raise AssertionError("no partial with data appeared")


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_conversion_killed_inside_the_write_window(tmp_path, fmt):
    """SIGKILL inside the write window, deterministically: once the hidden partial holds data the
    converter is stopped (SIGSTOP: it can no longer publish), checked, then killed. Not finding the
    window fails the test, so this never passes by killing too early or too late."""
    raw = write_pairs_folder(tmp_path / "raw", 1500, 128)
    name = "out.lmdb" if fmt == "lmdb" else "out"
    dst = tmp_path / name
    cmd = [
        sys.executable,
        "-m",
        "mmloader.converters.pairs",
        str(raw),
        str(dst),
        "--shard-size",
        "100",
        "--check-decode",
        "-q",
    ]
    # LMDB writes pages at its commits (every 1000 samples); tar streams each shard as it goes.
    min_bytes = {"tar": 300_000, "lmdb": 1_000_000}[fmt]

    def kill_inside_the_write_window(*extra: str) -> Path:
        proc = subprocess.Popen([*cmd, *extra], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        partial = _partial_holding_data(tmp_path, name, proc, min_bytes)
        proc.send_signal(signal.SIGSTOP)
        try:
            assert partial.is_dir() and proc.poll() is None  # frozen before its rename into place
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return partial

    # 1. nothing there yet: the final path holds nothing; the partial stays (its writer was killed)
    partial = kill_inside_the_write_window()
    assert not dst.exists() and partial.is_dir()
    # 2. a rerun succeeds, removes that partial and says so
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"removed stale partial {partial}" in out.stdout and "no longer runs" in out.stdout
    assert not partial.exists()
    first = [mmloader.open(dst)[i] for i in range(1500)]
    assert verify(dst, progress=False).ok
    # 3. killed while replacing it (--overwrite): the old complete dataset is untouched
    partial = kill_inside_the_write_window("--overwrite")
    assert verify(dst, progress=False).ok and [mmloader.open(dst)[i] for i in range(1500)] == first
    # 4. the next run (--overwrite) succeeds and cleans up; nothing hidden is left behind
    out = subprocess.run([*cmd, "--overwrite"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and f"removed stale partial {partial}" in out.stdout
    assert verify(dst, progress=False).ok and len(mmloader.open(dst)) == 1500
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{name}")]


class _Suicidal(torch.utils.data.Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 30:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
        return {"__key__": str(i), "x": i}


@pytest.mark.process
def test_killed_worker_surfaces_within_seconds():
    loader = mmloader.loader(mmloader.Stream(_Suicidal(), batch_size=5, shuffle=False), num_workers=2)
    start = time.time()
    with pytest.raises(RuntimeError, match="(?i)worker.*(killed|exited)"):
        for _ in loader:
            pass
    assert time.time() - start < 15


def _rank_reader(rank, path, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=0), num_workers=8, multiprocessing_context="fork")
    keys = [k for b in loader for k in b["__key__"]]
    Path(out, f"r{rank}.json").write_text(json.dumps(keys))


@pytest.mark.process
def test_lmdb_read_by_2_ranks_x_8_workers(tmp_path):
    import multiprocessing as mp

    path = write_dataset(tmp_path / "many.lmdb", 96, "lmdb")
    procs = [mp.get_context("fork").Process(target=_rank_reader, args=(r, str(path), str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    keys = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    assert sorted(keys[0] + keys[1]) == [f"s{i:05d}" for i in range(96)]


# -- load and endurance -------------------------------------------------------------------------
@pytest.mark.process
def test_50_epochs_persistent_workers_stay_flat(tmp_path, capsys, monkeypatch):
    """The default path, unwrapped: whole-batch reads with zero-copy views from LMDB, pread from
    shards, images decoded into shared memory, the LMDB map trimmer active. The workers are
    measured from this process, so nothing in them changes to be observed."""
    from mmloader.cli.bench import _children
    from mmloader.storage.lmdb import map_trimmer

    path = write_dataset(tmp_path / "e.lmdb", 64, "lmdb")
    shards = write_dataset(tmp_path / "e", 64, "tar", shard_size=5)
    # trim a file this small too (forked workers inherit the setting): the trimmer runs every epoch
    monkeypatch.setattr(map_trimmer, "TRIM_FILES_OVER", os.path.getsize(path / "data.mdb") // 2)
    monkeypatch.setattr(map_trimmer, "TRIM_AFTER_BYTES", os.path.getsize(path / "data.mdb") // 4)
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(shards))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=8),
        num_workers=2,
        backend="process",
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    others = set(_children(os.getpid()))  # helpers earlier tests left (resource tracker, forkserver)
    per_epoch = []
    for epoch in range(50):
        loader.set_epoch(epoch)
        assert sum(len(b["__key__"]) for b in loader) == 64
        per_epoch.append({pid: _proc_figures(pid) for pid in set(_children(os.getpid())) - others})
    first, last = per_epoch[1], per_epoch[-1]  # epoch 0 includes first-touch warm-up
    assert set(first) == set(last) and len(first) == 2, "the same two persistent workers all along"
    with capsys.disabled():
        print("\n  worker   RSS kB (epoch 1 -> 50)   fds      maps")
        for pid in first:
            print(
                f"  {pid:>6}   {first[pid][0]:>7} -> {last[pid][0]:<7}   {first[pid][1]} -> {last[pid][1]}   "
                f"{first[pid][2]} -> {last[pid][2]}"
            )
    warm = per_epoch[10]  # by then every worker has touched every shard once
    for pid in first:
        assert last[pid][0] - first[pid][0] < 4096, "worker RSS grew by more than 4 MB over 50 epochs"
        assert last[pid][1] == warm[pid][1], "open file descriptors kept growing"
        assert last[pid][1] - first[pid][1] <= 13, "more descriptors than shards were added"
        assert last[pid][2] - warm[pid][2] <= 2, "memory-mapped regions kept growing"


@pytest.mark.process
def test_forkserver_workers_deliver_the_same_batches(tmp_path):
    path = write_dataset(tmp_path / "f.lmdb", 24, "lmdb")
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    threads = list(mmloader.loader(mmloader.Stream(ds, batch_size=5, seed=2), num_workers=2, backend="thread"))
    forkserver = list(
        mmloader.loader(
            mmloader.Stream(ds, batch_size=5, seed=2),
            num_workers=2,
            backend="process",
            multiprocessing_context="forkserver",
            persistent_workers=False,
        )
    )
    assert [b["__key__"] for b in forkserver] == [b["__key__"] for b in threads]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(forkserver, threads))


def test_two_loaders_same_store_one_process(tmp_path):
    path = write_dataset(tmp_path / "c.lmdb", 40, "lmdb")
    make = lambda seed: mmloader.loader(
        mmloader.Stream(mmloader.zip(t=mmloader.TextReader(path)), batch_size=5, seed=seed), num_workers=2
    )
    a, b = make(0), make(1)
    got_a, got_b = [], []
    for x, y in zip(a, b):  # interleaved
        got_a += x["__key__"]
        got_b += y["__key__"]
    assert sorted(got_a) == sorted(got_b) == [f"s{i:05d}" for i in range(40)] and got_a != got_b


def _read_all(path, out):
    loader = mmloader.loader(mmloader.Stream(mmloader.zip(t=mmloader.TextReader(path)), batch_size=5), num_workers=1)
    Path(out).write_text(json.dumps(sorted(k for b in loader for k in b["__key__"])))


@pytest.mark.process
def test_two_processes_same_store(tmp_path):
    import multiprocessing as mp

    path = write_dataset(tmp_path / "c.lmdb", 40, "lmdb")
    procs = [
        mp.get_context("spawn").Process(target=_read_all, args=(str(path), str(tmp_path / f"{i}.json"))) for i in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert json.loads((tmp_path / "0.json").read_text()) == json.loads((tmp_path / "1.json").read_text())
