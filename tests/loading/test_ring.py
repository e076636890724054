"""The process backend's shared-memory ring (mmloader.loading.ring): same batches, no overwrites, no leaks."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TESTS, write_dataset

import mmloader
from mmloader.loading.device_stage import _tensors  # every tensor of a batch
from mmloader.loading.ring import RingBatch, SlotTensor, _Arena, _pack, _unpack


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ring") / "p.lmdb", 60, "lmdb")


def _loader(path, output="tensor", workers=2, **kw):
    ds = mmloader.zip(
        image=mmloader.ImageReader(path, output=output),
        caption=mmloader.TextReader(path),
        label=mmloader.LabelReader(path),
    )
    return mmloader.loader(
        mmloader.Stream(ds, batch_size=8, seed=5),
        num_workers=workers,
        backend="process",
        multiprocessing_context="fork",
        **kw,
    )


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not _same(x, y):
                return False
        elif isinstance(x, torch.Tensor):
            if not (torch.equal(x, y) and x.stride() == y.stride()):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.process
@pytest.mark.parametrize("output", ["tensor", "raw"])
def test_ring_gives_the_batches_of_the_thread_backend(pairs, output):
    ring = _loader(pairs, output)
    assert ring.ring is not None
    seen = []
    receive = ring.ring.receive
    ring.ring.receive = lambda item: (seen.append(type(item)), receive(item))[1]
    got = list(ring)
    ds = mmloader.zip(
        image=mmloader.ImageReader(pairs, output=output),
        caption=mmloader.TextReader(pairs),
        label=mmloader.LabelReader(pairs),
    )
    want = list(mmloader.loader(mmloader.Stream(ds, batch_size=8, seed=5), num_workers=2, backend="thread"))
    assert len(got) == len(want) == 8 and all(_same(a, b) for a, b in zip(got, want))
    assert seen.count(RingBatch) >= 6  # all but the workers' first batches came through slots
    if output == "tensor":
        assert got[-1]["image"].is_contiguous(memory_format=torch.channels_last)


def test_tensors_inside_lists_go_into_the_slot_and_plain_lists_pass_as_they_are():
    """Lists of keys or captions cross as they are (not walked value by value); a list that holds
    a tensor anywhere is walked, and its tensors go into the slot."""
    slot = torch.zeros(1 << 16, dtype=torch.uint8)
    batch = {
        "crops": [torch.arange(5), torch.ones(2, 3)],
        "caption": ["a", "b"],
        "n": [1, 2.5, None, True],
        "mixed": ["x", torch.tensor([7]), [torch.tensor([8, 9])]],
        "nested": [[torch.tensor([1])], [torch.tensor([2, 3])]],
        "dicts": [{"a": torch.tensor([4])}],
    }
    packed = _pack(batch, _Arena(slot))
    assert packed["caption"] is batch["caption"] and packed["n"] is batch["n"]
    assert [type(v) for v in packed["crops"]] == [SlotTensor, SlotTensor]
    assert isinstance(packed["mixed"][1], SlotTensor) and isinstance(packed["mixed"][2][0], SlotTensor)
    assert isinstance(packed["nested"][1][0], SlotTensor) and isinstance(packed["dicts"][0]["a"], SlotTensor)
    out = _unpack(packed, slot.numpy())
    for got, want in [
        (out["crops"][0], batch["crops"][0]),
        (out["crops"][1], batch["crops"][1]),
        (out["mixed"][1], batch["mixed"][1]),
        (out["mixed"][2][0], batch["mixed"][2][0]),
        (out["nested"][1][0], batch["nested"][1][0]),
        (out["dicts"][0]["a"], batch["dicts"][0]["a"]),
    ]:
        start = slot.data_ptr()
        assert torch.equal(got, want) and start <= got.data_ptr() < start + slot.numel()  # in the slot: no copy
    assert out["caption"] == ["a", "b"] and out["mixed"][0] == "x"


def test_dense_tensors_of_any_dim_order_cross_in_their_own_layout():
    """Contiguous, channels-last images and clips ((B, T, C, H, W) over (B, T, H, W, C) memory)
    are copied into the slot keeping their strides: a plain copy, not a transposition. A strided
    view that skips memory is copied contiguous."""
    slot = torch.zeros(1 << 16, dtype=torch.uint8)
    clip = torch.arange(2 * 3 * 4 * 5 * 3, dtype=torch.int32).reshape(2, 3, 4, 5, 3).movedim(-1, 2)
    image = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    plain, skipping = torch.arange(12).reshape(3, 4), torch.arange(24).reshape(4, 6)[:, ::2]
    packed = _pack({"clip": clip, "image": image, "plain": plain, "skip": skipping}, _Arena(slot))
    out = _unpack(packed, slot.numpy())
    for name, t in (("clip", clip), ("image", image), ("plain", plain)):
        assert torch.equal(out[name], t) and out[name].stride() == t.stride(), name
    assert torch.equal(out["skip"], skipping) and out["skip"].is_contiguous()


@pytest.mark.process
def test_ring_resume_onto_another_worker_count(pairs):
    full = [b["__key__"] for b in _loader(pairs)]
    first = _loader(pairs)
    it = iter(first)
    taken = [next(it)["__key__"] for _ in range(3)]
    state = first.state_dict()
    del it
    resumed = _loader(pairs, workers=3)
    resumed.load_state_dict(state)
    assert taken + [b["__key__"] for b in resumed] == full


@pytest.mark.process
def test_batches_the_caller_holds_are_never_overwritten(pairs):
    """A slow consumer that keeps every batch: the worker must not reuse a slot still referenced."""
    reference = [b for b in _loader(pairs, workers=1, ring=False)]
    kept, kinds = [], []
    loader = _loader(pairs, workers=1, prefetch_factor=1)  # 3 slots for 8 batches
    receive = loader.ring.receive
    loader.ring.receive = lambda item: (kinds.append(type(item)), receive(item))[1]
    for batch in loader:
        kept.append(batch)  # held: its slot may not be reused
        kept.append({"view": batch["image"][1:3]})  # a derived view holds the slot too
        time.sleep(0.01)
    batches = kept[0::2]
    assert 1 <= kinds.count(RingBatch) <= 3 < len(kinds)  # the rest went the ordinary way
    assert all(_same(a, b) for a, b in zip(batches, reference))
    assert all(torch.equal(v["view"], b["image"][1:3]) for v, b in zip(kept[1::2], reference))


@pytest.mark.process
def test_slots_are_handed_back_when_dropped(pairs):
    loader = _loader(pairs, workers=1, prefetch_factor=1, persistent_workers=True)
    kinds = []
    receive = loader.ring.receive
    loader.ring.receive = lambda item: (kinds.append(type(item)), receive(item))[1]
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            del batch
    assert kinds.count(RingBatch) == len(kinds) == 24  # every batch through a slot: slots came back
    assert len(loader.ring._cache) == 3


@pytest.mark.process
def test_restarted_workers_do_not_grow_the_slot_cache(pairs):
    loader = _loader(pairs, workers=2, persistent_workers=False)
    for epoch in range(4):
        loader.set_epoch(epoch)
        list(loader)
    assert len(loader.ring._cache) <= 2 * loader.ring.slots_per_worker + 2 * loader.ring.slots_per_worker


def _shm_state() -> tuple[set[str], int]:
    """(torch's segments in /dev/shm whose creator is gone or is this process, shared-memory
    mappings of this process). torch names a segment ``torch_<pid of its creator>_<n>``; another
    test process's live loader (pytest-xdist runs two) may hold some meanwhile, and is not ours."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    ours = {
        name
        for name in names
        if name.startswith("torch_")
        and (name.split("_")[1] == str(os.getpid()) or not os.path.exists(f"/proc/{name.split('_')[1]}"))
    }
    maps = sum(1 for line in open(f"/proc/{os.getpid()}/maps") if "/dev/shm/" in line or "torch_" in line)
    return ours, maps


@pytest.mark.process
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_ten_loader_lifetimes_leave_no_shared_memory(pairs):
    import gc

    list(_loader(pairs))  # warm: torch's own lazily created segments
    gc.collect()
    before = _shm_state()
    for _ in range(10):
        loader = _loader(pairs, persistent_workers=False)
        for batch in loader:
            pass
        del loader, batch
        gc.collect()
    assert _shm_state() == before


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    # Ctrl-C as in a terminal, however this test was started: a shell that starts a job in the
    # background without job control makes its processes ignore SIGINT, and they inherit that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import torch, mmloader
    ds = mmloader.zip(image=mmloader.ImageReader({path!r}), caption=mmloader.TextReader({path!r}))
    class Slow(torch.utils.data.Dataset):  # not needed: slow down by sleeping in the loop
        pass
    loader = mmloader.loader(mmloader.Stream(ds, batch_size=4), num_workers=2, backend="process",
                             multiprocessing_context="fork", nodes={nodes})
    for i, batch in enumerate(loader):
        if i == 2:
            print("pids", os.getpid(), *[w.pid for w in loader.dataloader._iterator._workers], flush=True)
            {action}
        time.sleep(0.2)
""")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.parametrize(
    "action",
    [
        "os.kill(os.getpid(), signal.SIGINT)",
        # the killed worker is made to leave a segment behind, as it does
        # when killed between torch's shm_open and unlink
        "w = loader.dataloader._iterator._workers[0].pid; "
        "open(f'/dev/shm/torch_{w}_999999', 'w').close(); "
        "os.kill(w, signal.SIGKILL)",
    ],
)
@pytest.mark.parametrize("nodes", ["[]", "[mmloader.Map(dict)]"])  # (a node must not keep the pass alive)
@pytest.mark.process
def test_interrupt_or_killed_worker_leaves_nothing_in_dev_shm(pairs, action, nodes):
    before = set(os.listdir("/dev/shm"))
    script = SCRIPT.format(tests=str(TESTS), path=str(pairs), action=action, nodes=nodes)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode != 0  # interrupted, or the dead worker surfaced as an error
    assert "KeyboardInterrupt" in done.stderr or "exited unexpectedly" in done.stderr or "killed" in done.stderr
    pids = [int(p) for p in done.stdout.split()[1:]]
    time.sleep(0.5)
    for pid in pids[1:]:  # no worker left behind
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    # torch names a segment torch_<pid of its creator>_<n>; only this test's processes count,
    # as other programs on the machine may use /dev/shm meanwhile.
    left = [
        name
        for name in set(os.listdir("/dev/shm")) - before
        if name.startswith("torch_") and name.split("_")[1] in {str(pid) for pid in pids}
    ]
    assert left == [], left


@pytest.mark.process
def test_batches_save_pickle_and_deep_copy_as_ordinary_tensors_at_their_own_size(pairs):
    """A batch from the ring is the user's: torch.save refused one storage seen as several dtypes,
    and a saved or pickled tensor carried its whole slot (1 MB for a 37 kB clip)."""
    kinds = []
    loader = _loader(pairs, workers=1)
    receive = loader.ring.receive
    loader.ring.receive = lambda item: (kinds.append(type(item)), receive(item))[1]
    ours = next(iter(loader))
    reference = next(iter(_loader(pairs, workers=1, ring=False)))  # torch's own way: ordinary tensors
    assert kinds == [RingBatch] and _same(ours, reference)
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in _tensors(ours))
    saved, plain = io.BytesIO(), io.BytesIO()
    torch.save(ours, saved)
    torch.save(reference, plain)
    assert len(saved.getvalue()) <= len(plain.getvalue()) + 1024  # (only names and alignment differ)
    assert _same(torch.load(io.BytesIO(saved.getvalue()), weights_only=True), reference)
    assert len(pickle.dumps(ours)) <= len(pickle.dumps(reference)) + 1024
    assert _same(pickle.loads(pickle.dumps(ours)), reference)
    copied = copy.deepcopy(ours)
    assert _same(copied, reference)
    assert not any(
        c.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        for c, t in zip(_tensors(copied), _tensors(ours))
    )
