"""Video and audio: real codecs (H.264, VP9, FLAC, MP3, Vorbis, Opus, AAC) on files made by the tests."""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mmloader
from mmloader.errors import DecodeError, SizeLimitError
from mmloader.seeding import enter_batch

av = pytest.importorskip("av")
sf = pytest.importorskip("soundfile")

from media import (decode_all_audio, decode_all_video, make_audio, make_video, signal)  # noqa: E402


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    return {"mp4": make_video("mp4", seconds=3, fps=15, keyint=10),
            "webm": make_video("webm", seconds=3, fps=15, keyint=10),
            "mkv": make_video("mkv", seconds=3, fps=15, keyint=10, bframes=False),
            "av": make_video("mp4", seconds=3, fps=15, keyint=15, audio_rate=44100)}


def store_of(tmp_path: Path, name: str, samples: list[dict]) -> Path:
    path = tmp_path / name
    with mmloader.writer_for(path) as w:
        for s in samples:
            w.write(s)
    return path


# -- video: frames equal a whole-file reference decode ---------------------------------------------
@pytest.mark.parametrize("ext", ["mp4", "webm", "mkv"])
@pytest.mark.parametrize("options", [dict(frames=8, clip="start"), dict(frames=6, clip="center", size=(24, 32)),
                                     dict(frames=5, fps=3, clip="random"), dict(frames=4, fps=2, clip=1.3),
                                     dict(frames=None, fps=5, max_seconds=2.0, size=(16, 20)),
                                     dict(frames=4, fps=40, clip=2.9)])
def test_video_frames_equal_a_reference_decode_of_the_same_timestamps(tmp_path, clips, ext, options):
    data = clips[ext]
    path = store_of(tmp_path, "v.lmdb", [{"__key__": f"k{i}", ext: data} for i in range(3)])
    reader = mmloader.VideoReader(path, ext, **options)
    size = options.get("size")
    reference = decode_all_video(data, size)
    times = sorted(reference)
    for seed in (0, 1):
        enter_batch(seed, False)
        for i in range(3):
            frames = reader[i]
            shown = reader.timestamps[i].numpy()
            assert frames.dtype == torch.uint8 and frames.shape[1] == 3
            assert frames.shape[0] == (options["frames"] or 10) == len(shown)
            asked, step = reader.targets(mmloader.mediainfo.probe(data), f"k{i}")
            for j, (t, a) in enumerate(zip(shown, asked)):
                expected = max((x for x in times if x <= a + 1e-6), default=times[0])
                assert abs(t - expected) < 1e-6, (j, t, a, expected)  # the frame shown at that time
                assert np.array_equal(frames[j].permute(1, 2, 0).numpy(), reference[round(t, 6)]), (ext, j, t)


def _garble_packets(data: bytes, lo: float, hi: float) -> bytes:
    """``data`` with the payload of every video packet shown in [lo, hi) overwritten."""
    c = av.open(io.BytesIO(data))
    s = c.streams.video[0]
    spans = [(p.pos, p.size) for p in c.demux(s) if p.pts is not None and lo <= float(p.pts * s.time_base) < hi]
    c.close()
    out = bytearray(data)
    rng = np.random.default_rng(0)
    for pos, size in spans:
        out[pos + 4:pos + size] = rng.integers(0, 256, size - 4, dtype=np.uint8).tobytes()
    return bytes(out)


def test_video_seeks_and_skips_what_the_clip_does_not_show(tmp_path):
    """GOPs without a frame of the clip are never decoded: garbage there does not matter to a clip
    after it (which still equals the reference), and is a DecodeError for a clip that shows it."""
    clean = make_video("mp4", seconds=6, fps=15, keyint=15)
    bad = _garble_packets(clean, 0.0, 2.0)  # the first two GOPs
    path = store_of(tmp_path, "g.lmdb", [{"__key__": "k", "mp4": bad}])
    reference = decode_all_video(clean)
    late = mmloader.VideoReader(path, "mp4", frames=4, fps=1, clip=2.5)
    frames, shown = late.decode_clip(bad, "k")
    assert np.allclose(shown, [2.4666667, 3.4666667, 4.4666667, 5.4666667]) or np.allclose(shown, [2.5, 3.5, 4.5, 5.5]) \
        or list(np.round(shown, 4)) == [2.4667, 3.4667, 4.4667, 5.4667], shown
    for j, t in enumerate(shown):
        assert np.array_equal(frames[j].permute(1, 2, 0).numpy(), reference[round(t, 6)])
    with pytest.raises(DecodeError, match="key='k'.*field='mp4'|corrupt"):
        mmloader.VideoReader(path, "mp4", frames=4, clip="start")[0]
