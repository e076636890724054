"""GPUDecode on the CPU: the same pixels as the normal decode path (same decoder)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes
from PIL import Image

import mmloader
from mmloader.readers.image_decode import decode_to_tensor


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "imgs"
    with mmloader.ShardWriter(path, shard_size=8) as w:
        for i in range(20):
            if i % 7 == 3:  # a PNG among JPEGs: decoded on the CPU for that item only
                buf = io.BytesIO()
                Image.fromarray(np.full((32, 48, 3), i * 10, np.uint8)).save(buf, "PNG")
                w.write({"__key__": f"k{i:03d}", "jpg": buf.getvalue(), "cls": i})
            else:
                w.write({"__key__": f"k{i:03d}", "jpg": jpeg_bytes(i, size=(48, 32)), "cls": i})
    return path


def _loader(path, decode, backend="thread"):
    ds = mmloader.zip(image=mmloader.ImageReader(path, output=decode), label=mmloader.LabelReader(path))
    return mmloader.loader(mmloader.Stream(ds, batch_size=6, seed=3), num_workers=2, backend=backend)


@pytest.mark.process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_raw_batches_are_packed(mixed, backend):
    batch = next(iter(_loader(mixed, "raw", backend)))
    flat, offsets = batch["image"], batch["__offsets__"]["image"]
    assert flat.dtype == torch.uint8 and flat.dim() == 1 and offsets.shape == (7,)
    store = mmloader.open(mixed)
    for key, t in zip(batch["__key__"], mmloader.unpack(batch, "image")):
        assert bytes(t.numpy()) == store.get(key)["jpg"]


def test_cpu_fallback_equals_normal_decode_pixel_for_pixel(mixed):
    normal = list(_loader(mixed, "tensor"))
    gpu_path = list(mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu"))
    assert len(normal) == len(gpu_path) == 4
    for a, b in zip(normal, gpu_path):
        assert a["__key__"] == b["__key__"]
        assert torch.equal(a["image"], b["image"])
        assert torch.equal(a["label"], b["label"])
        assert "__offsets__" not in b


def test_stats_count_gpudecodes_own_decode_as_the_loops_wait(mixed):
    """The decode GPUDecode does in the training process is time the loop waits for data, not
    its compute: a loop that only iterates waits nearly all of its time, and advice says why."""
    from mmloader.loading.diagnosis import advice

    decoded = mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu", size=(224, 224))
    for _ in range(3):
        assert len(list(decoded)) == 4
    s = decoded.stats(reset=True)
    assert s["gpu_decode_ms_per_batch"] > s["compute_ms_per_batch"] and s["wait_fraction"] > 0.5
    assert advice(s).startswith("gpu decode is the bottleneck: GPUDecode takes")
    assert "gpu_decode_ms_per_batch" not in decoded.stats()  # counted afresh after the reset


def test_transforms_match_torchvision_v2_on_cpu(mixed):
    from torchvision.transforms.v2 import functional as F

    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    stage = mmloader.GPUDecode(
        _loader(mixed, "raw"),
        device="cpu",
        size=(40, 60),
        crop=(32, 32),
        dtype=torch.float32,
        mean=mean,
        std=std,
        channels_last=True,
    )
    batch = next(iter(stage))
    store = mmloader.open(mixed)
    expect = []
    for key in batch["__key__"]:
        im = decode_to_tensor(store.get(key)["jpg"])
        im = F.center_crop(F.resize(im, [40, 60], antialias=True), [32, 32]).float() / 255
        expect.append(F.normalize(im, list(mean), list(std)))
    got = batch["image"]
    assert got.shape == (6, 3, 32, 32) and got.dtype == torch.float32
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(got, torch.stack(expect), atol=1e-5)


def test_bf16_and_flip(mixed):
    stage = mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu", size=(32, 48), dtype=torch.bfloat16, flip=1.0)
    plain = mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu", size=(32, 48), dtype=torch.bfloat16)
    a, b = next(iter(stage)), next(iter(plain))
    assert a["image"].dtype == torch.bfloat16
    assert torch.equal(a["image"], b["image"].flip(-1))


def test_resume_api_passes_through(mixed):
    stage = mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu")
    it = iter(stage)
    next(it)
    state = stage.state_dict()
    assert state["consumed"] == 6 and len(stage) == 4


def test_mixed_sizes_need_a_size(mixed, tmp_path):
    path = tmp_path / "sizes"
    with mmloader.ShardWriter(path) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, size=(40 + 8 * i, 32))})
    loader = mmloader.loader(
        mmloader.Stream(mmloader.zip(image=mmloader.ImageReader(path, output="raw")), batch_size=4), num_workers=0
    )
    with pytest.raises(ValueError, match="differ in size"):
        next(iter(mmloader.GPUDecode(loader, device="cpu")))
    assert next(iter(mmloader.GPUDecode(loader, device="cpu", size=(32, 32))))["image"].shape == (4, 3, 32, 32)


# -- issue 13, defect 2: the batch decoded ahead is not counted as delivered ---------------------
@pytest.mark.process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_state_describes_what_the_caller_received_not_the_read_ahead(mixed, backend):
    full = [b["__key__"] for b in _loader(mixed, "raw", backend)]
    loader = _loader(mixed, "raw", backend)
    stage = mmloader.GPUDecode(loader, device="cpu")
    it = iter(stage)
    got = [next(it)["__key__"] for _ in range(2)]
    assert loader.batches_seen == 3  # the read-ahead ran (on the CPU, the same code path as CUDA)
    state = stage.state_dict()
    assert state["consumed"] == 12  # two batches of 6 received, not three
    del it
    resumed_loader = _loader(mixed, "raw", backend)
    resumed = mmloader.GPUDecode(resumed_loader, device="cpu")
    resumed.load_state_dict(state)
    assert got + [b["__key__"] for b in resumed] == full


def test_state_after_the_last_batch_points_at_the_next_epoch(mixed):
    stage = mmloader.GPUDecode(_loader(mixed, "raw"), device="cpu")
    batches = list(stage)
    assert len(batches) == 4 and stage.state_dict()["epoch"] == 1


# -- issue 13, defect 8: augmentations from the plan, not from the global RNG ------------------
@pytest.mark.process
def test_random_crop_and_flip_follow_the_seed_on_both_backends(mixed):
    def run(backend, workers=2, epoch=0):
        loader = _loader(mixed, "raw", backend)
        loader.set_epoch(epoch)
        torch.manual_seed(12345 + workers)  # the global RNG must not matter
        stage = mmloader.GPUDecode(loader, device="cpu", size=(32, 48), crop=(24, 24), random_crop=True, flip=0.5)
        return [b["image"] for b in stage]

    a, b = run("thread"), run("process")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = run("thread", epoch=1)
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_a_mix_whose_other_source_has_no_image_gets_zero_rows(mixed, tmp_path):
    """GPUDecode decoded the 0-byte entries of rows without an image (a mix with a text-only
    source) and raised: those rows are zeros, as the default collate makes them."""
    with mmloader.LMDBWriter(tmp_path / "t.lmdb") as w:
        for i in range(20):
            w.write({"__key__": f"t{i}", "txt": f"only text {i}"})
    images = mmloader.zip(image=mmloader.ImageReader(mixed, output="raw"))
    texts = mmloader.zip(caption=mmloader.TextReader(tmp_path / "t.lmdb"))
    stream = mmloader.Stream(mmloader.mix([images, texts], names=["img", "txt"]), batch_size=6, seed=0)
    store, absent, here = mmloader.open(mixed), 0, 0
    for batch in mmloader.GPUDecode(mmloader.loader(stream, 1, backend="thread"), device="cpu", size=(32, 48)):
        if "image" not in batch:  # no sample of this batch has one: the modality is absent, as collated
            absent += len(batch["__key__"])
            continue
        assert batch["image"].shape == (6, 3, 32, 48)
        presence = batch.get("__present__", {}).get("image", torch.ones(6, dtype=torch.bool)).tolist()
        for key, row, present in zip(batch["__key__"], batch["image"], presence):
            if present:
                here += 1
                assert torch.equal(row, decode_to_tensor(store.get(key)["jpg"], "RGB"))
            else:
                absent += 1
                assert not row.any()
    assert here == 20 and absent == 20
