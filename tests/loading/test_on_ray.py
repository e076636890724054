"""backend="ray" (mmloader/loading/on_ray/) on a real local Ray cluster of three nodes (a head,
where this process trains, and two decode nodes), started once for the module: the batches of
the thread backend, by torchrun ranks too, resumed and onto another world size, through a
builder killed and a decode node lost mid-epoch, errors named, the window bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from conftest import ROOT, jpeg_bytes, write_dataset

import mmloader
from mmloader.errors import SampleError

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.distributed
N = 40


@pytest.fixture(scope="module")
def cluster():
    fast_failure = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
    }
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_failure},
    )
    nodes = [c.add_node(num_cpus=2) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ray") / "d.lmdb", N, "lmdb")


def _stream(path, rank=0, world=1, padding=None, **kw):
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    if padding is not None:
        kw["batching"] = mmloader.Batching(4, padding=padding)
    else:
        kw["batch_size"] = 4
    stream = mmloader.Stream(ds, seed=5, **kw)
    stream.set_world(rank, world)
    return stream


def _keys(loader) -> list[list[str]]:
    return [list(b["__key__"]) for b in loader]


def _ray(stream, **kw):
    """backend="ray" with this module's two builders (started once, shared by its tests)."""
    return mmloader.loader(stream, backend="ray", actors=2, job=f"tests-{os.getpid()}", **kw)


@pytest.mark.parametrize("options", [{}, {"padding": "mask"}, {"drop_last": True}])
def test_the_batches_of_the_thread_backend_on_each_rank_over_two_epochs(cluster, path, options):
    for rank in range(2):
        local = mmloader.loader(_stream(path, rank, 2, **options), 1, backend="thread")
        remote = _ray(_stream(path, rank, 2, **options))
        for _epoch in range(2):
            want, got = _keys(local), _keys(remote)
            assert got == want and got
        assert remote.epoch == 1


def test_torchrun_ranks_share_the_builders_and_see_every_sample_once(cluster, path, tmp_path):
    c, _nodes = cluster
    env = {**os.environ, "RAY_ADDRESS": c.address, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0"]
    run = subprocess.run(
        [*cmd, str(ROOT / "tests/loading/ray_ranks.py"), str(path), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) == N // 8
        keys = Counter(k for batches in per_rank for b in batches for k in b)
        assert keys == Counter(f"s{i:05d}" for i in range(N)), f"epoch {epoch}: not every sample once"
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # a new order each epoch
    assert ranks[0]["epochs"][0] == _keys(mmloader.loader(_stream(path, 0, 2), 1, backend="thread"))
    # the 2 -> 1 elastic resume of the state the ranks took two batches into epoch 2
    seen = Counter(k for r in ranks for b in r["first"] for k in b)
    resumed = _ray(_stream(path, 0, 1))
    resumed.load_state_dict(ranks[0]["state"])
    rest = Counter(k for b in _keys(resumed) for k in b)
    assert not set(rest) & set(seen) and sum((rest + seen).values()) == N == len(rest | seen)


def test_a_mid_epoch_resume_delivers_the_rest(cluster, path):
    full = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    loader = _ray(_stream(path))
    it = iter(loader)
    first = [list(next(it)["__key__"]) for _ in range(3)]
    state = loader.state_dict()
    del it
    again = _ray(_stream(path))
    again.load_state_dict(state)
    assert first == full[:3] and _keys(again) == full[3:]


def _built_on(loader) -> list[str]:
    """The nodes the loader's builders run on (waiting for those Ray is restarting)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return [ray.get(a.where.remote(), timeout=30)[0] for a in loader.pool().actors]
        except ray.exceptions.RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_builder_killed_mid_epoch_loses_and_repeats_nothing(cluster, path):
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    loader = _ray(_stream(path), in_flight=6)
    it = iter(loader)
    got = [list(next(it)["__key__"]) for _ in range(2)]
    ray.kill(loader.pool().actors[0], no_restart=False)  # Ray restarts it; its batches go elsewhere
    got += [list(b["__key__"]) for b in it]
    assert got == want and loader.rebuilt >= 1


def test_a_decode_node_lost_mid_epoch_loses_and_repeats_nothing(cluster, path):
    c, nodes = cluster
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))

    def slow(text):  # builds that take a while: some are under way when the node goes
        time.sleep(0.1)
        return text

    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path, transform=slow))
    loader = _ray(mmloader.Stream(ds, batch_size=4, seed=5), in_flight=6)
    where = _built_on(loader)
    victim = next(n for n in nodes if n.node_id in where)
    it = iter(loader)
    got = [list(next(it)["__key__"]) for _ in range(2)]
    c.remove_node(victim, allow_graceful=False)  # its raylet and every process on it killed
    got += [list(b["__key__"]) for b in it]
    assert got == want and loader.rebuilt >= 1
    assert victim.node_id not in _built_on(loader)  # restarted on the node left
    nodes[nodes.index(victim)] = c.add_node(num_cpus=2)  # the next tests have two decode nodes again
    c.wait_for_nodes()


def test_a_bad_sample_raises_naming_it_or_is_skipped_as_locally(cluster, tmp_path):
    path = tmp_path / "bad.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(12):
            img = jpeg_bytes(i)
            w.write({"__key__": f"k{i:03d}", "jpg": img[: len(img) // 2] if i == 5 else img, "txt": f"t{i}"})
    with pytest.raises(SampleError) as e:
        list(_ray(_stream(path)))
    assert e.value.key == "k005" and e.value.field == "jpg"
    local, remote = _stream(path, errors="skip"), _stream(path, errors="skip")
    want = _keys(mmloader.loader(local, 1, backend="thread"))
    assert _keys(_ray(remote)) == want
    assert remote.skipped == local.skipped == 1


def test_batches_in_flight_stay_within_the_window(cluster, path):
    """A slow trainer: the builders build at most ``in_flight`` batches ahead of it."""
    loader = _ray(_stream(path), in_flight=2)
    before = sum(ray.get([a.built.remote() for a in loader.pool().actors]))
    it = iter(loader)
    next(it)
    time.sleep(1.0)  # the builders would race ahead if nothing held them
    built = sum(ray.get([a.built.remote() for a in loader.pool().actors])) - before
    assert built <= 1 + 2, f"{built} batches built for 1 taken"
    assert len(list(it)) == N // 4 - 1


def test_an_unreachable_cluster_is_said_within_seconds():
    code = (
        "import sys, mmloader\n"
        "from mmloader.loading.on_ray.cluster import connect\n"
        "try:\n    connect('127.0.0.1:9')\nexcept mmloader.MMLoaderError as e:\n    print(e); sys.exit(3)\n"
    )
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 3, run.stderr[-2000:]
    assert "cannot reach the Ray cluster at '127.0.0.1:9'" in run.stdout and "ray start --head" in run.stdout
    assert time.monotonic() - start < 20


def test_a_live_stream_is_refused_naming_the_backends_that_take_it():
    live = mmloader.LiveStream(mmloader.live(lambda *where: iter([])), batch_size=1, steps=1)
    with pytest.raises(TypeError, match="backend='thread' or 'process'"):
        mmloader.loader(live, backend="ray")
