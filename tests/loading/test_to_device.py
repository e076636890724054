"""ToDevice on the CPU: uint8 batches moved and normalised with the reader's own arithmetic."""

from __future__ import annotations

import pytest
import torch
from conftest import jpeg_bytes

import mmloader
from mmloader.readers.augment import IMAGENET_MEAN, IMAGENET_STD


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    path = tmp_path_factory.mktemp("to_device") / "imgs"
    with mmloader.ShardWriter(path, shard_size=8) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:03d}", "jpg": jpeg_bytes(i, size=(64, 48)), "cls": i})
    return path


def _loader(path, **reader):
    ds = mmloader.zip(image=mmloader.ImageReader(path, **reader), label=mmloader.LabelReader(path))
    return mmloader.loader(mmloader.Stream(ds, batch_size=6, seed=3), num_workers=2, backend="thread")


def test_normalised_on_the_device_equals_the_readers_own_normalisation(images):
    """Crop and flip in the reader (uint8), then ToDevice: the same floats as the reader's fused
    ToDtype + Normalize, and as torchvision's Normalize of the same uint8 pixels."""
    crop = {"crop": mmloader.Crop.random(32), "flip": 0.5}
    on_cpu = list(_loader(images, normalize="imagenet", **crop))
    moved = list(mmloader.ToDevice(_loader(images, **crop), "cpu", normalize="imagenet"))
    plain = list(_loader(images, **crop))
    assert len(on_cpu) == len(moved) == 4
    for a, b, u in zip(on_cpu, moved, plain):
        assert a["__key__"] == b["__key__"] and torch.equal(a["label"], b["label"])
        assert b["image"].dtype == torch.float32 and b["image"].shape == (len(a["__key__"]), 3, 32, 32)
        assert b["image"].is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(b["image"], a["image"], rtol=0, atol=1e-6)
        mean = torch.tensor(IMAGENET_MEAN)[None, :, None, None]
        std = torch.tensor(IMAGENET_STD)[None, :, None, None]
        torch.testing.assert_close(b["image"], (u["image"].float() / 255 - mean) / std, rtol=0, atol=1e-5)


def test_bfloat16_mean_std_pairs_and_uint8_kept(images):
    batch = next(
        iter(
            mmloader.ToDevice(
                _loader(images, size=(24, 32)), "cpu", dtype=torch.bfloat16, normalize=([0.5] * 3, [0.5] * 3)
            )
        )
    )
    raw = next(iter(_loader(images, size=(24, 32))))
    assert batch["image"].dtype == torch.bfloat16
    torch.testing.assert_close(batch["image"].float(), raw["image"].float() / 127.5 - 1, rtol=0, atol=8e-3)
    kept = next(iter(mmloader.ToDevice(_loader(images, size=(24, 32)), "cpu", dtype=None)))
    assert torch.equal(kept["image"], raw["image"]) and kept["image"].is_contiguous(memory_format=torch.channels_last)
    scaled = next(iter(mmloader.ToDevice(_loader(images, size=(24, 32)), "cpu", channels_last=False)))
    assert scaled["image"].is_contiguous()
    torch.testing.assert_close(scaled["image"], raw["image"].float() / 255, rtol=0, atol=1e-7)


def test_float_or_unstacked_images_are_refused_naming_the_field_and_the_remedy(images):
    with pytest.raises(ValueError, match=r"batch\['image'\] is torch.float32, not uint8: leave ToDtype/Normalize"):
        next(iter(mmloader.ToDevice(_loader(images, crop=mmloader.Crop.random(32), normalize="imagenet"), "cpu")))
    with pytest.raises(ValueError, match=r"batch\['image'\] is a list of 2 images of different sizes"):
        mmloader.ToDevice([], "cpu").convert(
            [torch.zeros(3, 4, 5, dtype=torch.uint8), torch.zeros(3, 5, 4, dtype=torch.uint8)]
        )
    with pytest.raises(ValueError, match="normalize has 2 channels"):
        next(iter(mmloader.ToDevice(_loader(images, size=(24, 32)), "cpu", normalize=([0.5, 0.5], [1, 1]))))
    with pytest.raises(ValueError, match="normalize needs a floating-point dtype"):
        mmloader.ToDevice([], "cpu", dtype=None, normalize="imagenet")
    with pytest.raises(ValueError, match="expected 'imagenet'"):
        mmloader.ToDevice([], "cpu", normalize="cifar")


def test_state_describes_what_the_caller_received(images):
    stage = mmloader.ToDevice(_loader(images, size=(24, 32)), "cpu")
    it = iter(stage)
    first, second = next(it), next(it)
    state = stage.state_dict()
    assert state["consumed"] == 12  # two batches received, not the third moved ahead
    it.close()
    resumed = mmloader.ToDevice(_loader(images, size=(24, 32)), "cpu")
    resumed.load_state_dict(state)
    rest = list(resumed)
    keys = [k for b in (first, second, *rest) for k in b["__key__"]]
    assert sorted(keys) == [f"k{i:03d}" for i in range(20)]
    assert "to_device_ms_per_batch" in resumed.stats()


def test_todevice_over_gpudecode_resumes_where_the_caller_was(tmp_path):
    """A stage over a stage records what the inner one handed over, not its loader's read-ahead."""
    from conftest import jpeg_bytes as jpeg

    path = tmp_path / "raw"
    with mmloader.ShardWriter(path, shard_size=8) as w:
        for i in range(30):
            w.write({"__key__": f"k{i:03d}", "jpg": jpeg(i, size=(40, 32)), "cls": i})

    def stage():
        ds = mmloader.zip(image=mmloader.ImageReader(path, output="raw"), label=mmloader.LabelReader(path))
        loader = mmloader.loader(mmloader.Stream(ds, batch_size=6, seed=1), num_workers=2, backend="thread")
        return mmloader.ToDevice(mmloader.GPUDecode(loader, device="cpu", size=(16, 16)), "cpu")

    whole = [b["__key__"] for b in stage()]
    first = stage()
    it = iter(first)
    got = [next(it)["__key__"] for _ in range(3)]
    state = first.state_dict()
    assert state["consumed"] == 18
    it.close()
    resumed = stage()
    resumed.load_state_dict(state)
    assert got + [b["__key__"] for b in resumed] == whole


def test_rows_without_the_image_and_padding_stay_zero(images):
    batch = {
        "image": torch.full((3, 3, 2, 2), 200, dtype=torch.uint8),
        "__present__": {"image": torch.tensor([True, False, True])},
        "__mask__": {"image": torch.tensor([True, True, False])[:, None, None, None].expand(3, 3, 2, 2)},
        "extra": [torch.ones(2), torch.ones(3)],
    }
    out = mmloader.ToDevice([batch], "cpu", normalize="imagenet")._process(batch)
    assert out["image"][0].min() > 1 and not out["image"][1].any() and not out["image"][2].any()
    assert isinstance(out["extra"], list) and len(out["extra"]) == 2


def test_string_dtype_and_clear_errors_for_tuples_and_missing_cuda():
    assert mmloader.ToDevice([], "cpu", dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(TypeError, match="a batch is a tuple, not a dict"):
        mmloader.ToDevice([], "cpu")._process((torch.zeros(1),))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here"):
            mmloader.ToDevice([], "cuda")


def test_every_moved_tensor_gets_its_stream_recorded():
    """On CUDA the hand-over records the caller's stream on each tensor ToDevice moved: those in
    lists (images of several sizes) and dicts as well as the top level."""
    from mmloader.loading.device_stage import _tensors

    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    found = list(_tensors({"image": a, "sizes": [b, c], "__present__": {"image": d}, "__key__": ["k0", "k1"]}))
    assert len(found) == 4 and {id(t) for t in found} == {id(a), id(b), id(c), id(d)}


def test_video_clips_are_normalised_per_channel_in_their_channels_last_memory(tmp_path):
    """(B, T, C, H, W) uint8 clips from a VideoReader: normalised on the device per channel, the
    same floats as torchvision's normalize of the clips, kept in (B, T, H, W, C) memory; uint8
    kept as it is with dtype=None."""
    from torchvision.transforms.v2.functional import normalize, to_dtype

    av = pytest.importorskip("av")  # noqa: F841
    from media import make_video

    path = tmp_path / "v.lmdb"
    with mmloader.writer_for(path) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "mp4": make_video("mp4", seconds=1, fps=10)})
    ds = mmloader.zip(video=mmloader.VideoReader(path, "mp4", frames=3, size=(24, 32)))
    raw = list(mmloader.loader(mmloader.Stream(ds, batch_size=2, seed=1), num_workers=1, backend="thread"))
    moved = list(
        mmloader.ToDevice(
            mmloader.loader(mmloader.Stream(ds, batch_size=2, seed=1), num_workers=1, backend="thread"),
            "cpu",
            images="video",
            normalize="imagenet",
        )
    )
    assert len(raw) == len(moved) == 2
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    for u, b in zip(raw, moved):
        clips = b["video"]
        assert clips.dtype == torch.float32 and clips.shape == (2, 3, 3, 24, 32)
        assert clips.permute(0, 1, 3, 4, 2).is_contiguous()
        frames = to_dtype(u["video"].flatten(0, 1), torch.float32, scale=True)
        want = normalize(frames, list(IMAGENET_MEAN), list(IMAGENET_STD)).view(clips.shape)
        torch.testing.assert_close(clips, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(clips, (u["video"].float() / 255 - mean) / std, rtol=0, atol=1e-5)
    stage = mmloader.ToDevice([raw[0]], "cpu", images="video", dtype=None)
    kept = next(iter(stage))["video"]
    assert (
        kept.dtype == torch.uint8 and torch.equal(kept, raw[0]["video"]) and kept.stride() == raw[0]["video"].stride()
    )
    with pytest.raises(ValueError, match=r"not a \(B, C, H, W\) or \(B, T, C, H, W\) batch"):
        mmloader.ToDevice([], "cpu").convert(torch.zeros(2, 3, dtype=torch.uint8), "video")
