"""Shared fixtures: small real datasets written with mmloader's own writers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mmloader
from mmloader.planning import RangeList, worker_batches
from mmloader.planning.partition import rank_positions, samples_per_rank

# One intra-op thread per test process (xdist workers and the processes tests start): two workers
# on two cores, each with an OpenMP team of two spinning against the other, cost 7% of the
# suite's CPU (14.5 -> 13.5 CPU-minutes). Set before anything imports torch (nothing above does); children inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Nothing the suite starts listens beyond loopback. Ray binds its processes to the machine's network
# address (and rewrites 127.0.0.1 into it) unless this is 0; every cluster and driver the tests
# start inherits it. Set before anything imports Ray. (tests/listeners.py watches the rest.)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# A worker process stuck for good raises WorkerStalledError with its stack (mmloader.loading.stalled)
# before pytest-timeout (300 s) would stop the test knowing only that the training process waited.
os.environ.setdefault("MMLOADER_WORKER_TIMEOUT", "120")

pytest_plugins = ["kinds"]

#: The tests' folder (helpers beside this file: media, remote_servers, frameworks/) and the repository.
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FOREIGN = ROOT.parent / "shared" / "data" / "foreign-shards"


def jpeg_bytes(seed: int, size=(48, 32), **save) -> bytes:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8)
    im = Image.fromarray(base).resize(size, Image.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=save.pop("quality", 90), **save)
    return buf.getvalue()


# -- images and tar files made in memory, shared by the readers', zip's and storage's tests -----
def _photo(w=97, h=61) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h) + 60)], -1).astype(np.uint8)
    rgb = rgb ^ (np.random.default_rng(0).integers(0, 24, rgb.shape, dtype=np.uint8))
    return Image.fromarray(rgb)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


CASES = {
    "baseline-jpeg": lambda: _encode(_photo(), "JPEG", quality=92),
    "progressive-jpeg": lambda: _encode(_photo(), "JPEG", progressive=True),
    "grayscale-jpeg": lambda: _encode(_photo().convert("L"), "JPEG"),
    "cmyk-jpeg": lambda: _encode(_photo().convert("CMYK"), "JPEG"),
    "png-alpha": lambda: _encode(_photo().convert("RGBA"), "PNG"),
    "png-rgb": lambda: _encode(_photo(), "PNG"),
    "png-palette": lambda: _encode(_photo().convert("P"), "PNG"),
    "webp": lambda: _encode(_photo(), "WEBP"),
}


def _half_jpeg() -> bytes:
    whole = jpeg_bytes(7, size=(256, 256))
    return whole[: len(whole) // 2] + b"\xff\xd9"  # second half gone, still ends with EOI


def _tar_with(path: Path, members: list[tuple[str, bytes]]) -> None:
    import io
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def write_pairs_folder(root: Path, count: int, px: int) -> Path:
    """A raw pairs folder of ``count`` identical ``px``-square JPEGs with distinct captions."""
    root.mkdir(parents=True, exist_ok=True)
    blob = jpeg_bytes(0, size=(px, px))
    for i in range(count):
        (root / f"{i:05d}.jpg").write_bytes(blob)
        (root / f"{i:05d}.txt").write_text(f"t{i}")
    return root


def make_samples(n: int, start: int = 0, prefix: str = "s"):
    for i in range(start, start + n):
        yield {
            "__key__": f"{prefix}{i:05d}",
            "jpg": jpeg_bytes(i),
            "txt": f"caption number {i} é",
            "cls": i % 7,
            "json": {"i": i, "tags": ["a", "b"]},
            "npy": np.arange(i % 5, dtype=np.float32),
        }


def write_dataset(path: Path, n: int, fmt: str, shard_size: int = 4, **kw) -> Path:
    opts = {"shard_size": shard_size} if fmt == "tar" else {}
    with mmloader.writer_for(path, fmt, **opts, **kw) as w:
        for s in make_samples(n):
            w.write(s)
    return path


def train_tokenizer(lines: list[str], path: Path) -> None:
    """A small byte-level BPE with BOS/EOS, trained on the test's own lines (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    tok.save(str(path))


@pytest.fixture(scope="session", autouse=True)
def loopback_only():
    """Every listening socket this test process and the processes below it open is on loopback:
    looked at each second through the session (tests/listeners.py), said at its end."""
    from listeners import Watch

    with Watch() as watch:
        yield watch
    assert not watch.seen, f"the tests started listeners beyond loopback: {watch.seen}"


@pytest.fixture(scope="session")
def lmdb_ds(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("lmdb") / "ds.lmdb", 23, "lmdb")


@pytest.fixture(scope="session")
def tar_ds(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tar") / "shards", 23, "tar", shard_size=5)


@pytest.fixture(params=["lmdb", "tar"])
def any_ds(request, lmdb_ds, tar_ds) -> Path:
    return lmdb_ds if request.param == "lmdb" else tar_ds


@pytest.fixture
def foreign() -> Path:
    if not FOREIGN.is_dir():
        pytest.skip(f"foreign shards not found at {FOREIGN} (../shared/data/foreign-shards)")
    return FOREIGN


# -- shared by tests in several rooms ----------------------------------------------------------
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def unreadable(monkeypatch):
    """Make a folder or file unreadable: chmod 000, undone at teardown. As root, mode 000 does not
    stop a read, so the refusal the kernel would give (EACCES) is raised in this process instead,
    by os.scandir (folders, what os.walk lists with) and by the converters' and verify's open."""
    import builtins
    import errno

    import mmloader.converters.reading
    import mmloader.converters.sources

    import mmloader.cli.verify
    import mmloader.storage.tar.layout

    chmodded = []
    denied: set[str] = set()

    def deny(path: Path) -> None:
        if not AS_ROOT:
            chmodded.append((path, path.stat().st_mode))
            path.chmod(0)
            return
        denied.add(os.path.realpath(path))
        real_scandir, real_open = os.scandir, builtins.open

        def scandir(p="."):
            if isinstance(p, (str, os.PathLike)) and os.path.realpath(p) in denied:
                raise PermissionError(errno.EACCES, "Permission denied", str(p))
            return real_scandir(p)

        def open_(file, *a, **kw):
            if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) in denied:
                raise PermissionError(errno.EACCES, "Permission denied", str(file))
            return real_open(file, *a, **kw)

        monkeypatch.setattr(os, "scandir", scandir)
        monkeypatch.setattr(mmloader.converters.reading, "open", open_, raising=False)  # the converters' reads
        monkeypatch.setattr(mmloader.converters.sources, "open", open_, raising=False)
        monkeypatch.setattr(mmloader.cli.verify, "open", open_, raising=False)
        monkeypatch.setattr(mmloader.storage.tar.layout, "open", open_, raising=False)  # verify's sha256_file

    yield deny
    for path, mode in chmodded:
        path.chmod(mode)


def _in_flight(target: str) -> bool:
    # torch ships each batch through a fresh shared-memory file and socket; how many are in flight
    # when we look depends on prefetching, not on us, so they are left out of the count.
    return target.startswith("socket:") or "/dev/shm/torch_" in target or target.startswith("pipe:")


def _proc_figures(pid: int) -> tuple[int, int, int]:
    """(RSS kB, open descriptors, mapped regions) of a live process, read from outside it."""
    rss = int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")).split()[1])
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += not _in_flight(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    maps = sum(1 for line in open(f"/proc/{pid}/maps") if not _in_flight(line.rstrip().split(" ")[-1]))
    return rss, fds, maps


def deliver(total, world, workers, batch, drop_last, ranges=None):
    """What each rank's DataLoader delivers, in order: batches of plan positions.

    Workers produce their batches independently; the DataLoader takes them
    round-robin (worker 0, 1, ..., 0, 1, ...), skipping exhausted workers.
    """
    visit = RangeList(ranges if ranges is not None else [(0, total)])
    per = samples_per_rank(len(visit), world, batch, drop_last)
    out = []
    for rank in range(world):
        mine = rank_positions(len(visit), world, rank, per)
        queues = [
            [visit.take(mine[a:b]).tolist() for a, b in worker_batches(per, batch, workers, w)] for w in range(workers)
        ]
        got, i = [], 0
        while any(queues):
            q = queues[i % workers]
            if q:
                got.append(q.pop(0))
            i += 1
        out.append(got)
    return out, per


def rank_streams(make, world: int) -> list:
    """One stream from ``make()`` per rank of a world of ``world``, each set to its rank."""
    streams = []
    for rank in range(world):
        s = make()
        s.set_world(rank, world)
        streams.append(s)
    return streams
