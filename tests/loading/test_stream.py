"""Streaming to DDP with real processes: 2 ranks (gloo) x 2 DataLoader workers."""

from __future__ import annotations

import faulthandler
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from conftest import jpeg_bytes

import mmloader

WORLD = 2
HANG_DUMP_S = 200  # under pytest's 300 s: the stacks reach the failure report


def _text_dataset(path: Path, n: int, shards: int) -> Path:
    per = max(1, math.ceil(n / shards))
    with mmloader.ShardWriter(path, shard_size=per) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:05d}", "txt": f"t{i}"})
    return path


def _stream(path, batch, **kw):
    ds = mmloader.zip(caption=mmloader.TextReader(str(path)))
    return mmloader.Stream(ds, batch_size=batch, order=mmloader.Order(seed=7, block_size=4, window_blocks=2), **kw)


def _keys(loader):
    return [b["__key__"] if isinstance(b["__key__"], list) else [b["__key__"]] for b in loader]


def _rank_main(rank: int, init: str, cases: list, out: str) -> None:
    # A hang (one CI run in many) prints every thread's stack in the failure, not a bare timeout.
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)  # (never armed in a forked worker: it hangs there)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    results = {}
    for name, path, batch in cases:
        loader = mmloader.loader(
            _stream(path, batch),
            num_workers=2,
            persistent_workers=False,
            multiprocessing_context="fork",
        )  # spawn would re-import torch per worker
        got = _keys(loader)
        counts = torch.tensor([len(got)])
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # would hang or differ if ranks were unequal
        results[name] = {"batches": got, "max_batches": int(counts), "len": len(loader)}
    # determinism, epochs, resume (one dataset, batch 4)
    path = cases[-1][1]
    loader = mmloader.loader(_stream(path, 4), num_workers=2, multiprocessing_context="fork")
    loader.set_epoch(1)
    epoch1 = _keys(loader)
    epoch2_by_itself = _keys(loader)  # a pass after a completed pass is the next epoch
    loader.set_epoch(1)
    epoch1_again = _keys(loader)
    loader.set_epoch(2)
    epoch2 = _keys(loader)
    loader.set_epoch(1)
    it = iter(loader)
    first = [list(next(it)["__key__"]) for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed_loader = mmloader.loader(_stream(path, 4), num_workers=2, multiprocessing_context="fork")
    resumed_loader.load_state_dict(state)
    resumed = _keys(resumed_loader)
    after_resume_next_epoch = (resumed_loader.set_epoch(2), _keys(resumed_loader))[1]
    results["_resume"] = {
        "epoch1": epoch1,
        "epoch1_again": epoch1_again,
        "epoch2": epoch2,
        "epoch2_by_itself": epoch2_by_itself,
        "first": first,
        "state": state,
        "resumed": resumed,
        "next_epoch": after_resume_next_epoch,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    cases = []
    for n, shard_counts in [(1, [1]), (3, [1, 2, 3]), (7, [1, 4, 7]), (1000, [1, 2, 5, 9])]:
        for shards in shard_counts:
            for batch in [None, 4] if n < 1000 else [16]:
                name = f"n{n}-s{shards}-b{batch}"
                cases.append((name, str(_text_dataset(root / name, n, shards)), batch))
    tmp.spawn(_rank_main, args=(str(root / "init"), cases, str(root)), nprocs=WORLD, join=True)
    results = [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return cases, results


def _flat(batches):
    return [k for b in batches for k in (b if isinstance(b, list) else [b])]


def test_every_sample_once_plus_listed_pads_equal_batches(ddp_run):
    cases, results = ddp_run
    for name, path, batch in cases:
        n = int(name.split("-")[0][1:])
        per_rank = [r[name]["batches"] for r in results]
        assert len({len(b) for b in per_rank}) == 1, f"{name}: unequal batch counts"
        assert results[0][name]["len"] == len(per_rank[0]) == results[0][name]["max_batches"]
        keys = Counter(k for b in per_rank for k in _flat(b))
        assert set(keys) == {f"k{i:05d}" for i in range(n)}, name
        pads = sum(keys.values()) - n
        assert pads == math.ceil(n / WORLD) * WORLD - n, name  # only the padding repeats
        assert all(len(_flat(b)) == math.ceil(n / WORLD) for b in per_rank)


def test_same_seed_same_order_other_epoch_other_order(ddp_run):
    _cases, results = ddp_run
    for r in results:
        res = r["_resume"]
        assert res["epoch1"] == res["epoch1_again"]
        assert res["epoch1"] != res["epoch2"]
        assert res["epoch2_by_itself"] == res["epoch2"]
        assert sorted(_flat(res["epoch1"])) != _flat(res["epoch1"])  # really shuffled
    both = [_flat(r["_resume"]["epoch1"]) for r in results]
    assert not set(both[0]) & set(both[1])  # ranks see disjoint samples (1000 divides evenly)


def test_resume_after_k_batches_matches_uninterrupted(ddp_run):
    _cases, results = ddp_run
    for r in results:
        res = r["_resume"]
        assert res["first"] == res["epoch1"][:3]
        assert res["resumed"] == res["epoch1"][3:]
        assert res["next_epoch"] == res["epoch2"]  # the resume applies to that epoch only


def test_elastic_resume_from_world_2_onto_world_1(ddp_run):
    cases, results = ddp_run
    path = cases[-1][1]
    state = results[0]["_resume"]["state"]
    seen = Counter(k for r in results for k in _flat(r["_resume"]["first"]))
    stream = _stream(path, 4)
    stream.set_world(0, 1)
    loader = mmloader.loader(stream, num_workers=2)
    loader.load_state_dict(state)
    rest = Counter(_flat(_keys(loader)))
    assert not set(rest) & set(seen)
    assert sum(rest.values()) + sum(seen.values()) == 1000 and len(rest | seen) == 1000


def test_resume_onto_more_workers_single_process(tmp_path):
    path = _text_dataset(tmp_path / "d", 103, 5)
    full = _keys(mmloader.loader(_stream(path, 8), num_workers=0))
    loader = mmloader.loader(_stream(path, 8), num_workers=1)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    del it
    other = mmloader.loader(_stream(path, 8), num_workers=3)
    other.load_state_dict(state)
    assert _keys(other) == full[4:]


def test_drop_last_and_lengths(tmp_path):
    path = _text_dataset(tmp_path / "d", 23, 3)
    s = _stream(path, 4, drop_last=True)
    s.set_world(1, 2)
    got = _keys(mmloader.loader(s, num_workers=2))
    assert len(got) == len(s) == 2 and all(len(b) == 4 for b in got)
    s2 = _stream(path, None)
    s2.set_world(0, 3)
    assert len(s2) == 8 and len(list(mmloader.loader(s2, num_workers=0))) == 8


@pytest.mark.process
def test_persistent_workers_follow_set_epoch(tmp_path):
    path = _text_dataset(tmp_path / "d", 40, 2)
    loader = mmloader.loader(_stream(path, 5), num_workers=2, persistent_workers=True)
    reference = mmloader.loader(_stream(path, 5), num_workers=0)
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        reference.set_epoch(epoch)
        assert _keys(loader) == _keys(reference)


@pytest.mark.process
def test_worker_rngs_seeded_from_seed_epoch_rank_worker(tmp_path):
    path = _text_dataset(tmp_path / "d", 16, 1)

    def draw(seed, epoch):
        ds = mmloader.zip(caption=mmloader.TextReader(str(path), transform=lambda t: torch.rand(1).item()))
        s = mmloader.Stream(ds, batch_size=4, seed=seed)
        loader = mmloader.loader(s, num_workers=2, persistent_workers=False)
        loader.set_epoch(epoch)
        return [b["caption"].tolist() for b in loader]

    assert draw(1, 0) == draw(1, 0)
    assert draw(1, 0) != draw(1, 1) and draw(1, 0) != draw(2, 0)
    b = draw(1, 0)
    assert b[0] != b[1]  # the two workers draw differently


def test_collate_pads_and_masks():
    out = mmloader.collate(
        [{"__key__": "a", "t": torch.ones(2), "s": "x", "l": 1}, {"__key__": "b", "t": torch.ones(3), "l": 2}]
    )
    assert out["t"].shape == (2, 3) and out["__mask__"]["t"].sum() == 5
    assert out["s"] == ["x", None] and out["__present__"]["s"].tolist() == [True, False]
    assert out["l"].tolist() == [1, 2] and out["__key__"] == ["a", "b"]


def _clip_memory(batch: torch.Tensor) -> bool:
    """A (B, T, C, H, W) batch over (B, T, H, W, C) memory."""
    return batch.permute(0, 1, 3, 4, 2).is_contiguous()


def test_collate_batches_pixels_channels_last_and_pads_them_in_that_layout():
    """Images (C, H, W) batch channels-last; clips (T, C, H, W) that are channels-last (as decoded,
    or crops and frame slices of that) batch so too, also next to a planar row and padded to
    several lengths, whichever row is absent; planar 4-D uint8 (an array, a transform's output)
    batches as it is, and mixed dtypes promote as torch.stack does."""
    clips = [torch.randint(0, 255, (t, 3, 5, 7), dtype=torch.uint8) for t in (2, 3)]
    views = [c.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) for c in clips]  # as decoded
    mixed_layouts = mmloader.collate([{"v": views[0]}, {"v": clips[0]}])["v"]  # torch.stack: planar
    assert torch.equal(mixed_layouts, torch.stack([clips[0], clips[0]])) and _clip_memory(mixed_layouts)
    rows = [{"v": views[0]}, {"v": views[1]}]
    crops = [{"v": v[:, :, 1:4, 2:6]} for v in views]  # a transform's crop: a view, not dense
    for batch in (rows, [{"x": 1}, *rows], crops):  # the second: row 0 lacks the clip
        out = mmloader.collate(batch)
        padded, mask, first = out["v"], out["__mask__"]["v"], len(batch) - 2
        want = [c[:, :, 1:4, 2:6] for c in clips] if batch is crops else clips
        assert padded.shape == (len(batch), 3, *want[0].shape[1:]) and _clip_memory(padded)
        assert torch.equal(padded[first, :2], want[0]) and torch.equal(padded[first + 1], want[1])
        assert not padded[first, 2].any() and mask[first, :2].all() and not mask[first, 2].any()
    gray = torch.randint(0, 255, (2, 5, 7, 1), dtype=torch.uint8).permute(0, 3, 1, 2)
    assert torch.equal(mmloader.collate([{"g": gray}, {"g": gray}])["g"], torch.stack([gray, gray]))
    planar = mmloader.collate([{"a": clips[0]}, {"a": clips[0]}])["a"]
    assert planar.is_contiguous() and planar.view(2, -1).shape == (2, 210)
    mixed = mmloader.collate([{"v": views[0]}, {"v": views[0].float() + 0.5}])["v"]
    assert mixed.dtype == torch.float32 and mixed[1, 0, 0, 0, 0] == clips[0][0, 0, 0, 0] + 0.5
    images = mmloader.collate([{"i": clips[1][0]}, {"i": views[1][1]}])["i"]
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, clips[1][:2])


def test_collate_always_masks_named_modalities():
    same = [{"__key__": "a", "t": torch.ones(2)}, {"__key__": "b", "t": torch.ones(2)}]
    assert "__mask__" not in mmloader.collate(same)
    out = mmloader.Collate(masks=["t"])(same)
    assert out["__mask__"]["t"].all() and out["t"].shape == (2, 2)


def test_thread_backend_same_batches_and_resume(tmp_path):
    path = _text_dataset(tmp_path / "d", 57, 3)
    process = _keys(mmloader.loader(_stream(path, 5), num_workers=2))
    thread = mmloader.loader(_stream(path, 5), num_workers=2, backend="thread")
    assert _keys(thread) == process and len(thread) == len(process)
    thread.set_epoch(0)  # (without it, this pass would be epoch 1)
    it = iter(thread)
    for _ in range(4):
        next(it)
    state = thread.state_dict()
    del it
    resumed = mmloader.loader(_stream(path, 5), num_workers=1, backend="thread")
    resumed.load_state_dict(state)
    assert _keys(resumed) == process[4:]


@pytest.mark.process
def test_auto_backend_threads_for_builtin_decoders_processes_for_user_python(tmp_path, caplog):
    from mmloader.loading.dataloader import Loader
    from mmloader.loading.threaded import ThreadLoader

    path = _text_dataset(tmp_path / "d", 20, 2)
    text = lambda **kw: mmloader.Stream(
        mmloader.zip(caption=mmloader.TextReader(str(path), **kw)),  # noqa: E731
        batch_size=4,
        seed=7,
    )
    cases = [
        (text(), {}, ThreadLoader, "only built-in decoders"),
        (text(transform=str.upper), {}, Loader, "a transform on 'caption'"),
        (text(decode=lambda b, k: b.decode()), {}, Loader, "a decode= on 'caption'"),
        (
            mmloader.Stream(
                mmloader.zip(caption=mmloader.TextReader(str(path))),
                batching=mmloader.Batching(4, collate_fn=lambda rows: rows),
            ),
            {},
            Loader,
            "a custom collate_fn",
        ),
        (text(), {"persistent_workers": True}, Loader, "process-only options ['persistent_workers']"),
        (text(transform=str.upper), {"backend": "thread"}, ThreadLoader, None),
        (text(), {"backend": "process"}, Loader, None),
    ]
    for stream, options, kind, why in cases:
        caplog.clear()
        with caplog.at_level("INFO", logger="mmloader"):
            made = mmloader.loader(stream, num_workers=2, **options)
        assert type(made) is kind, (why, options)
        lines = [r.getMessage() for r in caplog.records if "backend=" in r.getMessage()]
        if why is None:
            assert lines == []  # chosen by the caller: nothing to explain
        else:
            assert len(lines) == 1 and why in lines[0], lines
    # the same batches whichever backend was chosen
    assert _keys(mmloader.loader(text(transform=str.upper), num_workers=2)) == _keys(
        mmloader.loader(text(), num_workers=2)
    )


class _BrokenAt(torch.utils.data.Dataset):
    """``n`` samples keyed ``k{i}``; reading sample ``bad`` raises."""

    def __init__(self, n: int, bad: int):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise mmloader.SampleError("broken sample", key=f"k{i}")
        return {"__key__": f"k{i}"}


def test_thread_backend_raises_worker_errors(tmp_path):
    loader = mmloader.loader(mmloader.Stream(_BrokenAt(10, 7), batch_size=2, shuffle=False), backend="thread")
    with pytest.raises(mmloader.SampleError, match="k7"):
        list(loader)


@pytest.mark.process
def test_length_bucketing_cuts_padding_keeps_exactly_once(tmp_path):
    import random

    rng = random.Random(0)
    path = tmp_path / "var.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(400):
            w.write({"__key__": f"k{i:04d}", "txt": "w " * rng.randint(1, 60)})
    tok = lambda s: torch.ones(len(s.split()), dtype=torch.long)

    def run(**kw):
        ds = mmloader.zip(tokens=mmloader.TextReader(path, transform=tok))
        stream = mmloader.Stream(ds, batch_size=16, seed=1, **kw)
        batches = list(mmloader.loader(stream, num_workers=2))
        padding = sum(int((~b["__mask__"]["tokens"]).sum()) for b in batches)
        return batches, padding

    plain, plain_pad = run()
    bucketed, bucketed_pad = run(lengths=mmloader.Bucketing("tokens", window=8))
    keys = sorted(k for b in bucketed for k in b["__key__"])
    assert keys == [f"k{i:04d}" for i in range(400)] and len(bucketed) == len(plain)
    assert bucketed_pad < plain_pad / 3, (bucketed_pad, plain_pad)
    again, _ = run(lengths=mmloader.Bucketing("tokens", window=8))
    assert [b["__key__"] for b in again] == [b["__key__"] for b in bucketed]
    with pytest.raises(ValueError, match="not a modality"):
        _stream(path, 4, lengths=mmloader.Bucketing("nope"))


def test_thread_backend_delivers_batches_before_the_error_in_order(tmp_path):
    for producers in (1, 3):
        loader = mmloader.loading.threaded.ThreadLoader(
            mmloader.Stream(_BrokenAt(40, 23), batch_size=4, shuffle=False), producers=producers
        )
        got = []
        with pytest.raises(mmloader.SampleError, match="k23"):
            for batch in loader:
                got.append(batch["__key__"])
        assert got == [[f"k{i}" for i in range(a, a + 4)] for a in range(0, 20, 4)]


def test_thread_backend_stops_its_threads_when_left_early(tmp_path):
    import threading

    path = _text_dataset(tmp_path / "d", 200, 4)
    before = threading.active_count()
    for producers in (1, 2):
        it = iter(mmloader.loading.threaded.ThreadLoader(_stream(path, 2), producers=producers))
        next(it)
        it.close()
    assert threading.active_count() == before


def test_thread_backend_many_producers_same_batches(tmp_path):
    path = _text_dataset(tmp_path / "d", 131, 5)
    expect = _keys(mmloader.loader(_stream(path, 3), num_workers=1, backend="thread"))
    for producers in (2, 5):
        assert _keys(mmloader.loading.threaded.ThreadLoader(_stream(path, 3), producers=producers)) == expect


# -- issue 13: the documented paths -------------------------------------------------------------
BACKENDS = ["thread", "process"]


def _train(loader, start_epoch, epochs, stop_after=None):
    """The README's training loop, as written there: returns (keys delivered, last state)."""
    seen, state, steps = [], None, 0
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            seen.append((epoch, list(batch["__key__"])))
            state = loader.state_dict()
            steps += 1
            if steps == stop_after:
                return seen, state
    return seen, state


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_readme_resume_loop_continues_mid_epoch(tmp_path, backend):
    """Defect 1: load_state_dict then the loop's set_epoch(start_epoch) must not replay the epoch."""
    path = _text_dataset(tmp_path / "d", 40, 2)
    full, _ = _train(mmloader.loader(_stream(path, 4), num_workers=2, backend=backend), 0, 2)
    first, state = _train(mmloader.loader(_stream(path, 4), num_workers=2, backend=backend), 0, 2, stop_after=3)
    loader = mmloader.loader(_stream(path, 4), num_workers=2, backend=backend)
    loader.load_state_dict(state)
    rest, _ = _train(loader, loader.epoch, 2)
    assert len([b for e, b in rest if e == 0]) == 7  # the 7 unseen batches, not the 10 of a whole epoch
    assert first + rest == full


def test_set_epoch_of_another_epoch_drops_a_pending_resume_with_a_warning(tmp_path):
    path = _text_dataset(tmp_path / "d", 40, 2)
    loader = mmloader.loader(_stream(path, 4), num_workers=1, backend="thread")
    _, state = _train(loader, 0, 1, stop_after=3)
    resumed = mmloader.loader(_stream(path, 4), num_workers=1, backend="thread")
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the pending resume of epoch 0"):
        resumed.set_epoch(1)
    assert len(_keys(resumed)) == 10


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_state_after_an_epochs_last_batch_resumes_at_the_next_epoch(tmp_path, backend):
    """Defect 10: a checkpoint after the last batch of epoch 0 must not replay epoch 0."""
    path = _text_dataset(tmp_path / "d", 40, 2)
    full, _ = _train(mmloader.loader(_stream(path, 4), num_workers=2, backend=backend), 0, 2)
    first, state = _train(mmloader.loader(_stream(path, 4), num_workers=2, backend=backend), 0, 2, stop_after=10)
    assert (state["epoch"], state["consumed"]) == (1, 0)
    loader = mmloader.loader(_stream(path, 4), num_workers=2, backend=backend)
    loader.set_epoch(0)
    list(loader)
    assert loader.state_dict()["epoch"] == 1  # also when taken after the loop ended
    resumed = mmloader.loader(_stream(path, 4), num_workers=2, backend=backend)
    resumed.load_state_dict(state)
    rest, _ = _train(resumed, resumed.epoch, 2)
    assert first + rest == full


def _corrupt_pairs(tmp_path, n=24, bad=(5, 17)):
    from conftest import jpeg_bytes

    path = tmp_path / "pairs.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(n):
            img = jpeg_bytes(i)
            w.write(
                {"__key__": f"k{i:03d}", "jpg": img[: len(img) // 2] + b"\xff\xd9" if i in bad else img, "txt": f"t{i}"}
            )
    return path


@pytest.mark.process
@pytest.mark.parametrize("backend", BACKENDS)
def test_skipped_samples_counted_across_workers(tmp_path, backend, caplog):
    """Defect 4: stream.skipped counts skips made in worker processes and threads."""
    path = _corrupt_pairs(tmp_path)
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    stream = mmloader.Stream(ds, batch_size=4, seed=1, errors="skip")
    batches = list(mmloader.loader(stream, num_workers=2, backend=backend))
    keys = [k for b in batches for k in b["__key__"]]
    assert "k005" not in keys and "k017" not in keys and len(keys) == 24
    assert stream.skipped == 2
    if backend == "thread":
        assert "k005" in caplog.text and "k017" in caplog.text


def _augmented_stream(path, workers_global: bool):
    def augment(text):  # draws from the batch's generator, or from the global RNG
        return float(torch.rand(1)) if workers_global else float(mmloader.rng().torch_rand())

    ds = mmloader.zip(caption=mmloader.TextReader(str(path), transform=augment))
    return mmloader.Stream(ds, batch_size=4, seed=3)


@pytest.mark.process
def test_same_seed_same_augmentations_on_both_backends_any_worker_count(tmp_path):
    """Defect 8: per-batch seeds, not per-worker streams: backend, workers and resume do not matter."""
    path = _text_dataset(tmp_path / "d", 32, 2)

    def draws(backend, workers, global_rng=False, epoch=0):
        loader = mmloader.loader(
            _augmented_stream(path, global_rng),
            num_workers=workers,
            backend=backend,
            **({"persistent_workers": False} if backend == "process" else {}),
        )
        loader.set_epoch(epoch)
        return [(b["__key__"], b["caption"].tolist()) for b in loader]

    reference = draws("thread", 1)
    assert draws("thread", 2) == reference == draws("process", 2) == draws("process", 1)
    assert draws("process", 2, global_rng=True) == draws("process", 1, global_rng=True)
    assert draws("thread", 1, epoch=1) != reference
    assert len({v for _k, vs in reference for v in vs}) == 32  # every sample drew its own value


def test_misaligned_batch_raises_alignment_error_naming_key_and_stores(tmp_path, monkeypatch):
    """Defect 3: mmloader's own zip() shadowed the builtin inside get_batch. The key fingerprint
    digests every key, so a swapped pair is joined by key; the per-batch check stays the guard
    for a fingerprint that does not tell (made here: every key sequence digests the same)."""
    from mmloader.storage.base import KeysView

    a, b = tmp_path / "a.lmdb", tmp_path / "b"
    with mmloader.LMDBWriter(a) as wa, mmloader.ShardWriter(b) as wb:
        for i in range(1000):  # same keys, one pair swapped
            wa.write({"__key__": f"k{i:04d}", "txt": "a"})
            j = {10: 11, 11: 10}.get(i, i)
            wb.write({"__key__": f"k{j:04d}", "txt": "b"})
    joined = mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b))
    assert joined.by_key and [s["__key__"] for s in (joined[10], joined[11])] == ["k0010", "k0011"]
    monkeypatch.setattr(KeysView, "fingerprint", lambda self: "same")
    ds = mmloader.zip(x=mmloader.TextReader(a), y=mmloader.TextReader(b))
    assert not ds.by_key  # zipped by position, checked per batch
    with pytest.raises(mmloader.AlignmentError, match=r"key 'k0010'.*'k0011'"):
        ds.get_batch(list(range(8, 16)))


def test_star_import_keeps_the_builtins():
    namespace: dict = {}
    exec("from mmloader import *", namespace)
    assert "open" not in namespace and "zip" not in namespace
    assert mmloader.zip.__module__ == "mmloader.align.zip" and callable(mmloader.open)


def test_no_module_shadows_a_builtin_it_uses():
    import ast
    import builtins

    names = set(dir(builtins))
    offenders = []
    for path in Path(mmloader.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        bound = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign):
                bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        offenders += [f"{path.name}: {n}" for n in sorted(bound & names & used)]
    assert not offenders, offenders


def test_collate_packs_only_declared_raw_modalities():
    """Defect 9: a 1-D uint8 tensor is data unless its reader says it is encoded bytes."""
    rows = [
        {"__key__": "a", "m": torch.ones(3, dtype=torch.uint8)},
        {"__key__": "b", "m": torch.ones(5, dtype=torch.uint8)},
    ]
    out = mmloader.Collate(masks=["m"])(rows)
    assert out["m"].shape == (2, 5) and out["__mask__"]["m"].sum() == 8 and "__offsets__" not in out
    packed = mmloader.Collate(pack=["m"])(rows)
    assert packed["m"].shape == (8,) and packed["__offsets__"]["m"].tolist() == [0, 3, 8]


def test_raw_images_packed_on_the_per_sample_path_too(tmp_path):
    path = _corrupt_pairs(tmp_path, n=8, bad=(2,))
    ds = mmloader.zip(image=mmloader.ImageReader(path, output="raw"), caption=mmloader.TextReader(path))
    batch = next(iter(mmloader.loader(mmloader.Stream(ds, batch_size=8, shuffle=False), backend="thread")))
    assert "__offsets__" in batch and len(batch["__offsets__"]["image"]) == 9


def test_images_are_channels_last_on_every_path(tmp_path):
    path = _corrupt_pairs(tmp_path, n=8, bad=())
    ds = mmloader.zip(image=mmloader.ImageReader(path))
    batched = next(iter(mmloader.loader(mmloader.Stream(ds, batch_size=8, shuffle=False), backend="thread")))
    rows = mmloader.collate([ds[i] for i in range(8)])
    for image in (batched["image"], rows["image"]):
        assert image.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batched["image"], rows["image"])


def test_adjacent_bad_samples_are_counted_and_logged_once_each(tmp_path, caplog):
    path = _corrupt_pairs(tmp_path, n=16, bad=(5, 6))
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    stream = mmloader.Stream(ds, batch_size=4, shuffle=False, errors="skip")
    keys = [k for b in mmloader.loader(stream, num_workers=1, backend="thread") for k in b["__key__"]]
    assert "k005" not in keys and "k006" not in keys and len(keys) == 16
    assert stream.skipped == 2  # k005 replaced by k006 (bad too) then k007: k006 counted once, at its place
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("k005" in w for w in warnings) == 1 and sum("k006" in w for w in warnings) == 1


def _tuples(samples):  # a custom collate that returns tuples
    return tuple(s["__key__"] for s in samples), (len(samples), 1)


@pytest.mark.process
def test_a_custom_collate_gives_the_same_types_on_both_backends(tmp_path):
    path = _text_dataset(tmp_path / "d", 12, 2)
    ds = mmloader.zip(caption=mmloader.TextReader(str(path)))
    got = {
        b: next(
            iter(
                mmloader.loader(
                    mmloader.Stream(ds, batching=mmloader.Batching(4, collate_fn=_tuples)), num_workers=2, backend=b
                )
            )
        )
        for b in BACKENDS
    }
    assert got["thread"] == got["process"] and isinstance(got["process"], tuple)
    assert isinstance(got["process"][1], tuple)


def test_batch_seed_is_computed_only_for_batches_that_draw(tmp_path, monkeypatch):
    """The seed (numpy SeedSequence, ~14 us) was computed for every batch, a tenth of a raw
    batch's build; now on first use of mmloader.rng(), with the same value."""
    from mmloader.loading import stream as stream_module
    from mmloader.readers import seeding

    path = _text_dataset(tmp_path / "d", 32, 2)
    calls = []

    def counted(*args):
        calls.append(args)
        return seeding.batch_seed(*args)

    monkeypatch.setattr(stream_module, "batch_seed", counted)
    plain = mmloader.Stream(mmloader.zip(caption=mmloader.TextReader(str(path))), batch_size=4, seed=3)
    assert len(list(mmloader.loader(plain, num_workers=1, backend="thread"))) == 8 and calls == []
    seeds = []
    ds = mmloader.zip(caption=mmloader.TextReader(str(path), transform=lambda t: seeds.append(mmloader.rng().seed)))
    list(mmloader.loader(mmloader.Stream(ds, batch_size=4, seed=3), num_workers=1, backend="thread"))
    assert len(calls) == 8 and sorted(set(seeds)) == sorted(seeding.batch_seed(*c) for c in calls)
    assert [c[3] for c in calls] == list(range(0, 32, 4))  # (seed, epoch, rank, first position)


def test_worker_reseeds_global_rngs_only_when_user_python_runs(tmp_path):
    """Reseeding random/numpy/torch per batch cost ~1 us a sample of a raw batch; nothing but
    user code draws from them, so a pipeline of built-in readers leaves them alone."""
    import random

    path = _text_dataset(tmp_path / "d", 16, 1)

    def global_states_after_each_batch(transform):
        ds = mmloader.zip(caption=mmloader.TextReader(str(path), transform=transform))
        states = []
        for build in mmloader.Stream(ds, batch_size=4, seed=3).batch_tasks(0, 1, seed_globals=True):
            random.seed(12345)
            build()
            states.append(random.random())
        return states

    untouched = random.Random(12345).random()
    assert global_states_after_each_batch(None) == [untouched] * 4
    reseeded = global_states_after_each_batch(lambda t: t)
    assert untouched not in reseeded and len(set(reseeded)) == 4


def test_collate_subclass_runs_and_counts_as_user_python(tmp_path):
    """A Collate subclass was swapped for a plain Collate when packing was added: its overrides
    never ran, and the pipeline looked free of user Python (threads, no worker reseeding)."""
    path = _text_dataset(tmp_path / "d", 16, 1)

    class Tagged(mmloader.Collate):
        def columns(self, columns):
            return {**super().columns(columns), "tag": "mine"}

    stream = mmloader.Stream(
        mmloader.zip(caption=mmloader.TextReader(str(path))),
        batching=mmloader.Batching(4, collate_fn=Tagged(masks=["caption"])),
    )
    assert stream.python_work() == ["a custom collate_fn"]
    batches = list(mmloader.loader(stream, 1, backend="thread"))
    assert len(batches) == 4 and all(b["tag"] == "mine" for b in batches)


def test_collate_subclass_overriding_call_sees_every_batch(tmp_path):
    """A Collate subclass overriding __call__ (the usual way to customise a collate) was never
    called: whole-batch reads went to Collate.columns."""
    path = _text_dataset(tmp_path / "d", 16, 1)
    calls = []

    class Counted(mmloader.Collate):
        def __call__(self, samples):
            calls.append(len(samples))
            return {**super().__call__(samples), "n": len(samples)}

    stream = mmloader.Stream(
        mmloader.zip(caption=mmloader.TextReader(str(path))),
        shuffle=False,
        batching=mmloader.Batching(4, collate_fn=Counted()),
    )
    batches = list(mmloader.loader(stream, 1, backend="thread"))
    assert calls == [4, 4, 4, 4] and [b["n"] for b in batches] == [4, 4, 4, 4]
    assert [b["caption"] for b in batches][0] == ["t0", "t1", "t2", "t3"]


def test_collate_subclass_overriding_columns_sees_batches_built_sample_by_sample(tmp_path):
    """Collate.__call__ used the module's collate(), so an overridden columns() was skipped for
    batches built from rows: one with a skipped corrupt sample, or from a plain map-style dataset."""
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, (8, 8)) if i != 5 else b"\xff\xd8 not a jpeg"})

    class Tagged(mmloader.Collate):
        def columns(self, columns):
            return {**super().columns(columns), "tag": "mine"}

    skipping = mmloader.Stream(
        mmloader.zip(image=mmloader.ImageReader(path)),
        shuffle=False,
        batching=mmloader.Batching(4, collate_fn=Tagged()),
        errors="skip",
    )
    rows = mmloader.Stream(
        [{"x": torch.tensor(i)} for i in range(8)], shuffle=False, batching=mmloader.Batching(4, collate_fn=Tagged())
    )
    for stream in (skipping, rows):
        batches = list(mmloader.loader(stream, 1, backend="thread"))
        assert len(batches) == 2 and all(b["tag"] == "mine" for b in batches)


def test_a_users_collate_is_used_as_given_also_when_raw_images_are_packed(tmp_path):
    """The stream used a copy of the user's Collate (to add the raw images' packing), so changing
    its settings between epochs did nothing (a plain callable is used as given)."""
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, (8, 8)), "npy": np.array([i, i], dtype=np.int64)})
    for output in ("tensor", "raw"):
        coll = mmloader.Collate()
        ds = mmloader.zip(image=mmloader.ImageReader(path, output=output), x=mmloader.ArrayReader(path))
        loader = mmloader.loader(
            mmloader.Stream(ds, shuffle=False, batching=mmloader.Batching(4, collate_fn=coll)), 1, backend="thread"
        )
        batch = next(iter(loader))
        assert "__mask__" not in batch
        assert ("image" in batch.get("__offsets__", {})) == (output == "raw")
        coll.masks = ("x",)
        loader.set_epoch(1)
        batch = next(iter(loader))
        assert batch["__mask__"]["x"].all(), output
        assert ("image" in batch.get("__offsets__", {})) == (output == "raw")


def test_raw_images_stay_packed_through_a_users_collate_on_every_path(tmp_path):
    """A user's Collate is used as given, and raw images stay packed whatever it does with
    ``self.pack`` (a list, passed on to mmloader.collate / collate_columns) and whichever path
    built the batch (a skipped empty image sends one batch sample by sample)."""
    from mmloader.align.collate import collate_columns

    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, (8, 8)) if i != 5 else b""})

    class ListPack(mmloader.Collate):
        def __init__(self):
            super().__init__()
            self.pack = []

    class PassesPackOn(mmloader.Collate):
        def __call__(self, samples):
            return mmloader.collate(samples, self.pad_value, self.masks, self.pack)

    class ColumnsPassOn(mmloader.Collate):
        def columns(self, columns):
            return collate_columns(columns, self.pad_value, self.masks, self.pack)

    def plain_function(samples):
        return {**mmloader.collate(samples), "mine": True}

    for coll in (ListPack(), PassesPackOn(), ColumnsPassOn(), plain_function):
        stream = mmloader.Stream(
            mmloader.zip(image=mmloader.ImageReader(path, output="raw")),
            shuffle=False,
            batching=mmloader.Batching(4, collate_fn=coll),
            errors="skip",
        )
        batches = list(mmloader.loader(stream, 1, backend="thread"))
        assert len(batches) == 2
        for b in batches:
            assert "image" in b["__offsets__"], coll
            assert all(
                bytes(t.numpy()) == mmloader.open(path).get(k)["jpg"]
                for k, t in zip(b["__key__"], mmloader.unpack(b, "image"))
            )
        if isinstance(coll, mmloader.Collate):
            assert coll.pack == ()  # outside a stream's call: what the user gave


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works where there is CUDA")
@pytest.mark.parametrize(
    "backend, workers", [("thread", 1), ("process", 0), pytest.param("process", 1, marks=pytest.mark.process)]
)
def test_pin_memory_without_cuda_warns_and_delivers(lmdb_ds, backend, workers):
    """pin_memory=True crashed without CUDA ('Found no NVIDIA driver'); torch's DataLoader warns
    and delivers unpinned batches: so does every backend (issue 57)."""
    stream = mmloader.Stream(mmloader.zip(caption=mmloader.TextReader(lmdb_ds)), batch_size=4)
    with pytest.warns(UserWarning, match="pin_memory=True, but no CUDA device is available"):
        loader = mmloader.loader(stream, backend=backend, num_workers=workers, pin_memory=True)
    assert sum(len(b["__key__"]) for b in loader) == len(stream.datasets[0])
