"""backend="ray" (mmloader/loading/on_ray/) on a real local Ray cluster of three nodes (a head,
where this process trains, and two decode nodes), started once for the module: the batches of
the thread backend (plain, masked, drop_last, a mix, packed rows), by torchrun ranks and by
Lightning's DDP ranks too, resumed and onto another world size, through a builder killed and a
decode node lost mid-epoch, errors named, the window and the references held bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
from conftest import ROOT, TESTS, jpeg_bytes, write_dataset

import mmloader
from mmloader.errors import SampleError

ray = pytest.importorskip("ray")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from test_contract import DEEP, EXAMPLES, PROFILE, run_contract  # noqa: E402

pytestmark = pytest.mark.distributed
N = 40


@pytest.fixture(scope="module")
def cluster():
    fast_failure = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
    }
    address_before = os.environ.get("RAY_ADDRESS")
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
        if address_before is None:  # later modules in this process start a Ray of their own
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = address_before


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
            want, got = list(local), list(remote)
            assert [list(b["__key__"]) for b in got] == [list(b["__key__"]) for b in want] and got
            for a, b in zip(got, want):  # the values too, not only the keys
                assert a["image"].equal(b["image"]) and a["caption"] == b["caption"]
                if "__valid__" in b:
                    assert a["__valid__"].equal(b["__valid__"])
        assert remote.epoch == 1


def _npy(values) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.asarray(values, dtype=np.int64))
    return buf.getvalue()


def test_a_mix_and_packed_rows_are_the_thread_backends(cluster, path, tmp_path):
    tokens = tmp_path / "tokens.lmdb"
    with mmloader.writer_for(tokens) as w:
        for i in range(60):
            w.write({"__key__": f"t{i:03d}", "ids.npy": _npy(range(1, 2 + i % 23))})

    def packed():
        ds = mmloader.zip(ids=mmloader.ArrayReader(tokens, "ids.npy"))
        return mmloader.Stream(ds, batch_size=3, seed=2, lengths=mmloader.Packing(48, length_by="ids"))

    def mixed():
        a = mmloader.zip(caption=mmloader.TextReader(path))
        b = mmloader.zip(caption=mmloader.TextReader(path, "txt"))
        return mmloader.Stream(mmloader.mix([a, b], weights=[3, 1], epoch_size=48), batch_size=4, seed=9)

    for make in (packed, mixed):
        want, got = list(mmloader.loader(make(), 1, backend="thread")), list(_ray(make()))
        assert [b["__key__"] for b in got] == [b["__key__"] for b in want] and got
        for a, b in zip(got, want):
            for name in ("ids", "position_ids", "cu_seqlens", "__source__"):
                if name in b:
                    same = a[name].equal(b[name]) if hasattr(b[name], "equal") else a[name] == b[name]
                    assert same, name


def test_torchrun_ranks_share_the_builders_and_see_every_sample_once(cluster, path, tmp_path):
    c, _nodes = cluster
    env = {**os.environ, "RAY_ADDRESS": c.address, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run = subprocess.run(
        [*cmd, str(TESTS / "loading" / "ray_ranks.py"), str(path), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["builders"] == ranks[1]["builders"] == 2  # one pool, found by the second rank
    assert ranks[0]["job"] == ranks[1]["job"] and ranks[0]["job"].startswith("run-")  # torchrun's run id
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
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):  # (ActorUnavailableError too)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_builder_killed_mid_epoch_loses_and_repeats_nothing(cluster, path):
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))

    def slow(text):  # builds that take a while (nested: sent by value): fast ones could all be
        time.sleep(0.1)  # finished when the kill comes, and nothing would be built again
        return text

    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path, transform=slow))
    loader = _ray(mmloader.Stream(ds, batch_size=4, seed=5), in_flight=6)
    it = iter(loader)
    got = [list(next(it)["__key__"]) for _ in range(2)]
    ray.kill(loader.pool().actors[0], no_restart=False)  # Ray restarts it; its batches go elsewhere
    got += [list(b["__key__"]) for b in it]
    assert got == want and loader.rebuilt >= 1 and loader.stats()["rebuilt"] == loader.rebuilt
    _built_on(loader)  # the restarted builder is back for the next tests


def test_builders_released_under_a_paused_rank_are_made_anew_and_delivery_goes_on(cluster, path):
    """A rank paused past the lease (a debugger, SIGSTOP) while no other rank renewed it: the
    lease released the builders. Here the release is done by hand, mid-epoch, as the lease does it."""
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    loader = _ray(_stream(path), in_flight=4)
    it = iter(loader)
    got = [list(next(it)["__key__"]) for _ in range(2)]
    pool = loader.pool()
    for actor in pool.actors:
        ray.kill(actor, no_restart=True)
    ray.kill(pool.lease, no_restart=True)
    got += [list(b["__key__"]) for b in it]
    assert got == want and pool.joins == 2
    assert _held(loader.job) == sorted([f"{loader.job}-builder-0", f"{loader.job}-builder-1", f"{loader.job}-lease"])


def test_a_job_remade_with_fewer_builders_while_a_rank_was_paused_is_read_on(cluster, path):
    """A later rank made the job anew, with fewer builders, after the paused rank's lease
    released its own: that rank's queued batches named builders the job no longer had
    (IndexError)."""
    from mmloader.loading.on_ray import lease
    from mmloader.loading.on_ray.cluster import NAMESPACE

    job = f"tests-{os.getpid()}-fewer"
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    loader = mmloader.loader(_stream(path), backend="ray", actors=2, job=job, in_flight=4)
    it = iter(loader)
    got = [list(next(it)["__key__"]) for _ in range(2)]
    pool = loader.pool()
    for actor in [*pool.actors, pool.lease]:
        ray.kill(actor, no_restart=True)
    _gone_within(job, 10)
    lease.join(ray, job, [f"{job}-builder-0"], NAMESPACE)  # the later rank's lease: one builder
    got += [list(b["__key__"]) for b in it]
    assert got == want and pool.joins == 2 and len(pool.actors) == 1
    lease.leave(ray, job, pool.lease)  # (this process was the job's only rank: its builder goes)
    _gone_within(job, 10)


def test_builders_that_did_not_start_are_let_go_so_a_retry_with_fewer_starts(cluster, path, monkeypatch):
    """The error's remedy ("pass actors= fewer") in the same process: the failed try's lease was
    still held, and its count won."""
    from mmloader.loading.on_ray import builders

    _ray(_stream(path)).pool()  # the module's two builders hold 2 of the cluster's 5 CPUs
    monkeypatch.setattr(builders, "START_S", 20.0)  # (5 s was too short for three to start in a loaded CI)
    job = f"tests-{os.getpid()}-retry"
    with pytest.raises(mmloader.MMLoaderError, match="[1-4] of 4 builders did not start within 20 s"):
        mmloader.loader(_stream(path), backend="ray", actors=4, job=job).pool()
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    retry = mmloader.loader(_stream(path), backend="ray", actors=1, job=job)
    assert _keys(retry) == want and len(retry.pool().actors) == 1
    from mmloader.loading.on_ray import lease

    lease.leave(ray, job, retry.pool().lease)
    _gone_within(job, 10)


LEFT_EARLY = (
    "import sys, mmloader\n"
    "ds = mmloader.zip(image=mmloader.ImageReader(sys.argv[1]), caption=mmloader.TextReader(sys.argv[1]))\n"
    "loader = mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=5), backend='ray', actors=1, job=sys.argv[2])\n"
    "it = iter(loader)\n"
    "print(len(next(it)['__key__']), flush=True)\n"  # the pass left early, still open at exit
)


@pytest.mark.process
def test_a_process_that_exits_with_a_pass_open_says_nothing_and_leaves_the_job(cluster, path):
    """Its generator was closed while the interpreter tore Ray down: "Exception ignored in
    <generator RayLoader._batches> ... TypeError: 'NoneType' object is not callable"."""
    env = {**os.environ, "RAY_ADDRESS": cluster[0].address, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = f"tests-{os.getpid()}-left-early"
    run = subprocess.run(
        [sys.executable, "-c", LEFT_EARLY, str(path), job], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0 and run.stdout.strip() == "4", run.stderr[-3000:]
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    _gone_within(job, 10)  # it left the job's lease at exit


@pytest.mark.process
def test_a_lost_head_is_said_within_the_timeout_before_ray_ends_the_process(path):
    """The whole cluster gone mid-epoch: the rank took the lease's silence for a release and
    waited on the head to join again, until Ray ended the process after 60 s, saying nothing
    of the loader."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    script = [sys.executable, str(TESTS / "loading" / "ray_head_lost.py"), str(path)]
    run = subprocess.run(script, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["error"] and got["error"].startswith("MMLoaderError: backend='ray': batch "), got
    assert "lost 4 times with its builder" in got["error"] and got["after_s"] < 30, got


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


def test_what_the_trainer_holds_stays_bounded_over_many_passes(cluster, path):
    """Over 8 epochs (80 batches) the objects this process holds on the cluster never exceed the
    window (plus the pass's stream and plan): nothing of a finished pass, or a taken batch, stays."""
    core = ray._private.worker.global_worker.core_worker
    loader = _ray(_stream(path), in_flight=3)
    held, baseline = [], len(core.get_all_reference_counts())
    for _epoch in range(8):
        for _batch in loader:
            held.append(len(core.get_all_reference_counts()) - baseline)
    assert len(held) == 8 * N // 4
    assert max(held) <= 3 + 2, f"objects held: max {max(held)}"
    assert held[-1] <= held[len(held) // 8]  # no growth from pass to pass


def test_lightning_ddp_on_ray_preempted_and_resumed_on_one_rank_trains_every_epoch_once(cluster, tmp_path):
    """Lightning's own DDP ranks (not torchrun) share one pool through its rendezvous address;
    its checkpoint, taken mid-epoch on 2 ranks, resumes on 1 with every epoch exactly once."""
    pytest.importorskip("lightning")
    sys.path.insert(0, str(TESTS / "frameworks"))  # (the framework tests' helpers)
    from common import make_dataset
    from runs import PER_RANK, assert_each_epoch_exactly_once, per_epoch, run_script, seen_all

    c, _nodes = cluster
    data = make_dataset(tmp_path / "data")
    out = tmp_path / "run"
    out.mkdir()
    os.environ["RAY_ADDRESS"] = c.address  # the scripts inherit it
    common = ["--backend", "ray", "--datamodule"]
    run_script("lightning_fit.py", str(data), str(out), "--preempt-after", str(PER_RANK + 2), *common)
    args = ["--resume", str(out / "preempt.ckpt"), "--devices", "1", "--max-epochs", "2", *common]
    run_script("lightning_fit.py", str(data), str(out), *args)
    assert_each_epoch_exactly_once(per_epoch(seen_all(out)), [0, 1])


def test_the_loaders_of_one_process_share_its_builders(cluster, path):
    """A train and a validation loader (a DataModule's, a notebook's): the second found no CPU
    left for a pool of its own and waited out timeout_s."""
    want = _keys(mmloader.loader(_stream(path), 1, backend="thread"))
    train = mmloader.loader(_stream(path), backend="ray", actors=2, timeout_s=60)
    val = mmloader.loader(_stream(path), backend="ray", actors=2, timeout_s=60)
    assert _keys(train) == want and _keys(val) == want
    assert train.job == val.job and train.pool() is val.pool()


def _rank(cluster, path, job: str, lease_s: float) -> subprocess.Popen:
    """A rank of ``job`` (tests/loading/ray_job_rank.py) that has read its first batch."""
    env = {**os.environ, "RAY_ADDRESS": cluster[0].address, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = [sys.executable, str(TESTS / "loading" / "ray_job_rank.py"), str(path), job, str(lease_s)]
    rank = subprocess.Popen(
        script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    if rank.stdout.readline().strip() != "ready":  # ('' once it has ended)
        rank.kill()
        pytest.fail(f"the rank of {job} did not start: {rank.communicate(timeout=60)[1][-3000:]}")
    return rank


def _held(job: str) -> list[str]:
    """The job's actors (its builders and lease) alive on the cluster."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"{job}-"))


def _gone_within(job: str, seconds: float) -> float:
    start = time.monotonic()
    while _held(job):
        assert time.monotonic() - start < seconds, f"{job}'s actors still there after {seconds} s: {_held(job)}"
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.mark.process
def test_the_builders_outlive_the_rank_that_made_them_and_go_with_the_jobs_last_rank(cluster, path):
    """The rank that made the builders owned them: when it ended, the other ranks' next builds
    failed at once (4 tries in 0.0 s), and which rank that was depended on a race."""
    job = f"tests-{os.getpid()}-outlive"
    maker = _rank(cluster, path, job, 8)  # makes the builder and the job's lease (8 s)
    reader = _rank(cluster, path, job, 8)  # finds them
    assert _held(job) == [f"{job}-builder-0", f"{job}-lease"]
    maker.kill()  # (SIGKILL: it leaves nothing behind, its lease lapses)
    maker.wait(timeout=30)
    reader.stdin.write("read 10\n")  # reads on past the maker's lapsed lease: its own renewals hold
    reader.stdin.flush()
    out, err = reader.communicate(timeout=180)
    assert reader.returncode == 0, err[-3000:]
    got = json.loads(out.splitlines()[-1])
    thread = mmloader.loader(_stream(path), 1, backend="thread")
    assert got["keys"] == _keys(thread) + _keys(thread) and got["joins"] == 1  # two epochs, never re-made
    # the reader left at its exit, the job's last rank: its builders went then (a lapse: 6-8 s later)
    _gone_within(job, 5)


@pytest.mark.process
def test_the_builders_of_a_job_whose_ranks_were_all_killed_go_after_its_lease(cluster, path):
    job = f"tests-{os.getpid()}-killed"
    rank = _rank(cluster, path, job, 3)
    rank.kill()
    rank.wait(timeout=30)
    assert _held(job)  # nothing left it: it lapses
    _gone_within(job, 20)


def test_the_cluster_its_builders_and_this_driver_listen_on_loopback_only(cluster, path):
    """conftest.py sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: without it Ray binds every process to
    the machine's network address (and all interfaces)."""
    from listeners import beyond_loopback, descendants, listening

    assert _keys(_ray(_stream(path)))  # builders started and serving
    assert cluster[0].address.startswith("127.0.0.1:")
    assert sum(len(listening(pid)) for pid in descendants(os.getpid())) >= 4  # gcs, raylets, workers
    assert beyond_loopback(os.getpid()) == []


def test_more_builders_than_the_cluster_has_cpus_is_said_at_once(cluster, path):
    with pytest.raises(mmloader.MMLoaderError, match="actors=64 builders of one CPU each, on a cluster of 5 CPUs"):
        list(mmloader.loader(_stream(path), backend="ray", actors=64, job="too-many"))


def test_an_unreachable_cluster_or_ranks_without_one_are_said_within_seconds():
    code = (
        "import sys, mmloader\n"
        "from mmloader.loading.on_ray.cluster import connect\n"
        "for address, world in (('127.0.0.1:9', 1), (None, 2)):\n"
        "    try:\n        connect(address, world=world)\n"
        "    except mmloader.MMLoaderError as e:\n        print(e)\n"
        "    else:\n        sys.exit(4)\n"
    )
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert "cannot reach the Ray cluster at '127.0.0.1:9'" in run.stdout and "ray start --head" in run.stdout
    assert "on 2 ranks needs one Ray cluster they share" in run.stdout and "RAY_ADDRESS" in run.stdout
    assert time.monotonic() - start < 20


def test_a_live_stream_and_bad_options_are_refused_naming_what_works(path):
    live = mmloader.LiveStream(mmloader.live(lambda *where: iter([])), batch_size=1, steps=1)
    with pytest.raises(TypeError, match="backend='thread' or 'process'"):
        mmloader.loader(live, backend="ray")
    with pytest.raises(ValueError, match="in_flight=0: expected a positive number"):
        mmloader.loader(_stream(path), backend="ray", in_flight=0)
    with pytest.raises(TypeError, match=r"backend='ray' does not take \['pin_memory'\]; it takes address, actors"):
        mmloader.loader(_stream(path), backend="ray", pin_memory=True)
    with pytest.raises(ValueError, match="num_workers=0 \\(the job's builders\\): expected >= 1"):
        mmloader.loader(_stream(path), 0, backend="ray")


def test_the_ranks_of_one_job_name_it_alike_and_no_other_job_does(monkeypatch, tmp_path):
    import torch.distributed as dist

    from mmloader.loading.on_ray.cluster import job_name

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    alone = job_name()
    assert alone.startswith(f"process-{os.getpid()}-") and job_name() == alone  # this process's loaders share it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without a run id: not a name
    assert job_name() == alone
    names = []
    for run in range(2):  # two jobs, one after the other, with the same rendezvous address
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store{run}", rank=0, world_size=1)
        try:
            names.append((job_name(), job_name()))
        finally:
            dist.destroy_process_group()
    assert names[0][0] == names[0][1] and names[1][0] == names[1][1]  # asked again: the same
    assert names[0][0] != names[1][0] and names[0][0].startswith("job-")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")  # torchrun's
    assert job_name() == "run-abc"


def test_a_batch_crosses_as_arrays_and_arrives_as_the_same_tensors():
    """What a builder returns (mmloader/loading/on_ray/wire.py): tensors of every dtype, nested."""
    import doctest

    import torch

    from mmloader.loading.on_ray import wire

    assert doctest.testmod(wire).failed == 0
    batch = {
        "x": torch.randn(3, 4).to(torch.bfloat16),
        "m": {"a": torch.tensor([True, False]), "b": [torch.arange(3), "text"]},
        "t": (torch.zeros(2, dtype=torch.int64), 5),
        "__key__": ["a", "b"],
    }
    sent = wire.to_wire(batch)
    assert isinstance(sent["x"], wire.WireTensor) and isinstance(sent["m"]["b"][0], wire.WireTensor)
    back = wire.from_wire(ray.cloudpickle.loads(ray.cloudpickle.dumps(sent)))
    assert back["x"].dtype == torch.bfloat16 and back["x"].equal(batch["x"])
    assert back["m"]["a"].equal(batch["m"]["a"]) and back["m"]["b"][0].equal(torch.arange(3))
    assert back["m"]["b"][1] == "text" and back["t"][1] == 5 and back["t"][0].dtype == torch.int64


@pytest.fixture(scope="module")
def contract_stores(tmp_path_factory):
    from contract import Stores

    return Stores(tmp_path_factory.mktemp("contract-ray"))


@DEEP
@settings(settings.get_profile(f"contract-{PROFILE}"), max_examples=EXAMPLES[PROFILE]["ray"])
@given(data=st.data())
def test_contract_on_ray(data, cluster, contract_stores):
    """The contract's property test (tests/loading/test_contract.py) on this cluster's builders."""
    import contract

    ray.cloudpickle.register_pickle_by_value(contract)  # (its length functions, for the builders)
    run_contract(data, contract_stores, "ray", 120 if PROFILE == "deep" else 40)


NOT_RAY = (
    "import socket, sys, threading, time\n"
    "import mmloader\n"
    "from mmloader.cluster.ray_cluster import ClusterUnreachable\n"
    "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen(8)  # answers, is not Ray\n"
    "held = []\n"
    "threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()\n"
    "address = f'127.0.0.1:{server.getsockname()[1]}'\n"
    "ds = mmloader.zip(caption=mmloader.TextReader(sys.argv[1]))\n"
    "for attempt in range(2):\n"
    "    start = time.monotonic()\n"
    "    try:\n"
    "        list(mmloader.loader(mmloader.Stream(ds, batch_size=4), backend='ray', address=address, connect_timeout_s=6))\n"
    "    except ClusterUnreachable as e:\n"
    "        print(f'{time.monotonic() - start:.1f}', e, flush=True)\n"
    "    else:\n"
    "        sys.exit(4)\n"
)


@pytest.mark.process
def test_an_address_that_answers_but_is_not_ray_is_said_within_the_deadline(path):
    """Ray's client retried such an address for good (7 minutes and on, in the issue); a connect
    that cannot be taken back leaves later connects of that process refused at once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, "-c", NOT_RAY, str(path)], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    first, second = run.stdout.splitlines()[:2]
    assert float(first.split()[0]) < 20 and "no Ray cluster answered at 127.0.0.1:" in first
    assert "within 6 s" in first and "ray status --address" in first
    assert float(second.split()[0]) < 1 and "an earlier connect" in second and "restart" in second


def test_an_address_naming_another_cluster_than_the_one_joined_is_refused(cluster, path):
    with pytest.raises(
        mmloader.MMLoaderError,
        match=r"connected to the Ray cluster at 127\.0\.0\.1:\d+, and address='127.0.0.1:1' names another",
    ):
        list(_ray(_stream(path), address="127.0.0.1:1"))
    assert _keys(_ray(_stream(path), address=cluster[0].address))  # the one joined: used


def test_ranks_with_rank_and_world_size_only_are_told_to_name_their_job(cluster, path, monkeypatch):
    """Each such rank made a pool of its own; rank 1 then waited 120 s and blamed the CPUs."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    start = time.monotonic()
    with pytest.raises(
        mmloader.MMLoaderError, match="on 2 ranks: the ranks cannot find their shared builders.*pass job="
    ):
        list(mmloader.loader(_stream(path, 1, 2), backend="ray", actors=2))
    assert time.monotonic() - start < 10
    assert _keys(mmloader.loader(_stream(path, 1, 2), backend="ray", actors=2, job=f"tests-{os.getpid()}"))


def test_ray_shutdown_between_or_during_passes_is_said_and_the_jobs_builders_stay(cluster, path):
    """(Last in the module: it replaces the module's connection.) The old handles raised Ray's
    "Can't find actor ... from a different cluster"; then Ray ended the process with no word
    (a shutdown during a pass), or the builders failed to fetch what the reconnected process
    put (OwnerDiedError, in some runs). The builders are the job's: they stay for its ranks."""
    thread = mmloader.loader(_stream(path), 1, backend="thread")
    loader = _ray(_stream(path))
    it = iter(loader)
    assert list(next(it)["__key__"]) == _keys(thread)[0]
    builders = sorted(_held(loader.job))
    ray.shutdown()  # during a pass: Ray's next call would end this process, saying nothing
    with pytest.raises(mmloader.MMLoaderError, match=r"Ray was shut down \(ray.shutdown\(\)\) during this pass"):
        next(it)
    ray.init(address=cluster[0].address, log_to_driver=False)
    with pytest.raises(mmloader.MMLoaderError, match="keep Ray connected between passes"):
        next(iter(loader))
    assert sorted(_held(loader.job)) == builders  # (a new process of the job joins them)


LOCAL_RAY = (
    "import time\n"
    "from mmloader.cluster.ray_cluster import connect\n"
    "ray = connect('local', num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
    "one = ray.remote(lambda: 1)\n"
    "time.sleep(2)  # the connect's thread would have ended by now\n"
    "print('after connect', ray.get(one.remote(), timeout=60), flush=True)\n"
    "ray.shutdown()\n"
    "ray = connect('local', num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
    "print('connected again', ray.get(one.remote(), timeout=60), flush=True)\n"
    "ray.shutdown()\n"
)


@pytest.mark.process
def test_a_local_ray_started_by_connect_outlives_the_connect():
    """Ray ties the processes of a local start to the thread that started them: started on a
    thread that then ended, the local cluster died and Ray ended the process with it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-c", LOCAL_RAY], capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0 and "after connect 1" in run.stdout and "connected again 1" in run.stdout, (
        run.stdout + run.stderr[-2000:]
    )
