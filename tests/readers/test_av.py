"""Video and audio: real codecs (H.264, VP9, FLAC, MP3, Vorbis, Opus, AAC) on files made by the tests."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import mmloader
from mmloader.errors import DecodeError, SizeLimitError
from mmloader.readers.seeding import enter_batch

av = pytest.importorskip("av")
sf = pytest.importorskip("soundfile")

from media import (  # noqa: E402
    decode_all_audio,
    decode_all_video,
    decode_indexed,
    make_audio,
    make_indexed_video,
    make_video,
    read_index,
    signal,
)


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    return {
        "mp4": make_video("mp4", seconds=3, fps=15, keyint=10),
        "webm": make_video("webm", seconds=3, fps=15, keyint=10),
        "mkv": make_video("mkv", seconds=3, fps=15, keyint=10, bframes=False),
        "av": make_video("mp4", seconds=3, fps=15, keyint=15, audio_rate=44100),
    }


def store_of(tmp_path: Path, name: str, samples: list[dict]) -> Path:
    path = tmp_path / name
    with mmloader.writer_for(path) as w:
        for s in samples:
            w.write(s)
    return path


# -- video: frames equal a whole-file reference decode ---------------------------------------------
@pytest.mark.parametrize("ext", ["mp4", "webm", "mkv"])
@pytest.mark.parametrize(
    "options",
    [
        dict(frames=8, clip="start"),
        dict(frames=6, clip="center", size=(24, 32)),
        dict(frames=5, fps=3, clip="random"),
        dict(frames=4, fps=2, clip=1.3),
        dict(frames=None, fps=5, max_seconds=2.0, size=(16, 20)),
        dict(frames=4, fps=40, clip=2.9),
    ],
)
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
            asked, step = reader.targets(mmloader.media.mediainfo.probe(data), f"k{i}")
            for j, (t, a) in enumerate(zip(shown, asked)):
                # frame n was encoded for n / 15 s (the container may round its time): the one
                # shown at an asked time, or, with fps=None, consecutive frames from the first
                n = (
                    int(np.floor(asked[0] * 15 + 1e-6)) + j
                    if options.get("fps") is None
                    else int(np.floor(a * 15 + 1e-6))
                )
                expected = times[min(n, len(times) - 1)]
                assert abs(t - expected) < 1e-6, (j, t, a, expected)
                assert np.array_equal(frames[j].permute(1, 2, 0).numpy(), reference[round(t, 6)]), (ext, j, t)


@pytest.mark.process
def test_clips_keep_the_decoded_layout_through_collate_and_worker_processes(tmp_path, clips):
    """FFmpeg writes (H, W, C) frames: a clip is a (T, C, H, W) view of them, and batches keep
    that memory, (B, T, H, W, C): copied, never transposed, also through the process backend."""
    path = store_of(tmp_path, "v.lmdb", [{"__key__": f"k{i}", "mp4": clips["mp4"]} for i in range(4)])
    clip = mmloader.VideoReader(path, "mp4", frames=3, clip="start")[0]
    assert clip.shape == (3, 3, 48, 64) and clip.permute(0, 2, 3, 1).is_contiguous()
    for backend in ("thread", "process"):
        ds = mmloader.zip(v=mmloader.VideoReader(path, "mp4", frames=3, clip="start"))
        loader = mmloader.loader(mmloader.Stream(ds, batch_size=2, seed=0), num_workers=1, backend=backend)
        batches = [b["v"] for b in loader]
        assert len(batches) == 2, backend
        for v in batches:
            assert v.shape == (2, 3, 3, 48, 64) and v.permute(0, 1, 3, 4, 2).is_contiguous(), backend
            assert torch.equal(v[0], clip) and torch.equal(v[1], clip), backend


# -- frame selection on the containers' own timestamps (indices drawn in the pixels) -------------------
#: A phone's variable frame rate: bursts at 30 fps, frames held for up to 0.4 s (milliseconds).
PHONE_MS = [0, 33, 66, 200, 233, 500, 533, 566, 900, 933, 966, 1000, 1033, 1500, 1533, 1900]
VFR = [Fraction(t, 1000) for t in PHONE_MS]


def _shown_at(times: list[Fraction], t: Fraction) -> int:
    """The index of the frame shown at ``t`` on the timeline the clip was encoded with."""
    return max([i for i, x in enumerate(times) if x <= t] or [0])


def _exact(x: float) -> Fraction:
    return Fraction(x).limit_denominator(1 << 20)


@pytest.mark.parametrize(
    "ext,rate,bframes",
    [
        ("webm", 30, False),
        ("webm", 15, False),
        ("mkv", 30, True),
        ("mkv", 15, False),
        ("mkv", 25, True),
        ("mp4", 29.97, True),
        ("mp4", 60, False),
        ("mov", 24, True),
        ("webm", "vfr", False),
        ("mkv", "vfr", True),
        ("mp4", "vfr", True),
        ("mov", "vfr", False),
    ],
)
def test_frames_are_the_ones_encoded_at_the_asked_times_in_every_container(tmp_path, ext, rate, bframes):
    """Each frame shows its index; the expected indices come from the times the clip was encoded
    with (not from the container's rounded timestamps, nor the reader's rule), the expected
    timestamps from PyAV decoding every frame. Matroska/WebM store milliseconds: a 30 fps frame
    2 at 67 ms is still the frame for 2/30 s (it was taken for frame 1 there)."""
    if rate == "vfr":
        times, data, fast = VFR, make_indexed_video(ext, times=VFR, bframes=bframes), Fraction(5)
    else:
        period = 1 / _exact(30000 / 1001 if rate == 29.97 else rate)
        times = [i * period for i in range(int(rate))]  # one second
        data, fast = make_indexed_video(ext, rate, frames=len(times), bframes=bframes), Fraction(round(rate), 2)
    reference = decode_indexed(data)
    assert [i for _, i in reference] == list(range(len(times)))  # every frame decodes to its index
    when = {i: t for t, i in reference}
    path = store_of(tmp_path, "x.lmdb", [{"__key__": "k", ext: data}])
    third = float(times[3])  # exactly on frame 3's time (rounded by the container)
    cases = [
        (dict(frames=8, fps=None, clip="start"), list(range(8))),
        (dict(frames=5, fps=None, clip=third), list(range(3, 8))),
        (dict(frames=None, fps=None, max_seconds=0.5), [i for i, t in enumerate(times) if t < Fraction(1, 2)]),
        (dict(frames=6, fps=float(fast), clip="start"), [_shown_at(times, j / fast) for j in range(6)]),
        (dict(frames=4, fps=float(fast), clip=third), [_shown_at(times, times[3] + j / fast) for j in range(4)]),
    ]
    for options, expected in cases:
        reader = mmloader.VideoReader(path, ext, **options)
        got = [read_index(f.numpy()) for f in reader[0]]
        assert got == expected, (options, got, expected)
        shown = reader.timestamps[0].numpy()
        assert np.allclose(shown, [when[i] for i in expected], atol=1e-9), (options, shown)


def test_a_gap_in_variable_rate_video_is_not_truncation(tmp_path):
    """Frames held 0.33 s (> 2 average frame periods) are valid: the file passes a full decode,
    so no clip over it is truncated, nor dropped under on_error="skip"; cutting the data still
    is a DecodeError."""
    data = make_indexed_video("mp4", times=VFR)
    mmloader.media.mediainfo.check_decodes(data)  # what convert --check-decode runs
    path = store_of(tmp_path, "g.lmdb", [{"__key__": f"k{i}", "mp4": data} for i in range(2)])
    for options, expected in (
        (dict(frames=2, fps=5, clip=0.6), [7, 7]),
        (dict(frames=None, fps=5, max_seconds=1.0), [0, 3, 4, 7, 7]),
    ):
        reader = mmloader.VideoReader(path, "mp4", **options)
        assert [read_index(f.numpy()) for f in reader[0]] == expected
        stream = mmloader.Stream(mmloader.zip(video=reader), batch_size=2, shuffle=False, errors="skip")
        batches = list(mmloader.loader(stream, num_workers=1, backend="thread"))
        assert stream.skipped == 0 and [b["__key__"] for b in batches] == [["k0", "k1"]]
    mkv = make_indexed_video("mkv", times=VFR)
    cut = store_of(tmp_path, "c.lmdb", [{"__key__": "cut", "mkv": mkv[: len(mkv) * 2 // 3]}])
    with pytest.raises(DecodeError, match="truncated video.*key='cut'"):
        mmloader.VideoReader(cut, "mkv", frames=4, fps=2, clip="start")[0]


def _garble_packets(data: bytes, lo: float, hi: float) -> bytes:
    """``data`` with the payload of every video packet shown in [lo, hi) overwritten."""
    c = av.open(io.BytesIO(data))
    s = c.streams.video[0]
    spans = [(p.pos, p.size) for p in c.demux(s) if p.pts is not None and lo <= float(p.pts * s.time_base) < hi]
    c.close()
    out = bytearray(data)
    rng = np.random.default_rng(0)
    for pos, size in spans:
        out[pos + 4 : pos + size] = rng.integers(0, 256, size - 4, dtype=np.uint8).tobytes()
    return bytes(out)


def _consecutive(reference: list[tuple[float, int]], t0: float, count: int) -> list[int]:
    """The indices of the frame shown at ``t0`` and the next ``count - 1`` ones of a reference."""
    i0 = max([i for i, (t, _) in enumerate(reference) if t <= t0 + 1e-6] or [0])
    return [i for _, i in reference[i0 : i0 + count]]


def test_matroska_video_that_starts_late_lasts_from_its_first_timestamp(tmp_path):
    """Matroska's DURATION tag and segment duration are end times on a clock from 0: a stream
    whose first frame is at 0.5 s and that holds 1.2 s of frames lasts 1.2 s, so clips fit in
    1.2 s (none is truncated, "center" is the middle of the frames), as in mp4."""
    data = make_indexed_video("mkv", 30, frames=36, start=Fraction(1, 2))
    reference = decode_indexed(data)  # times from the stream's start
    length = reference[-1][0] + 1 / 30
    assert abs(mmloader.media.mediainfo.probe(data).video.duration - length) < 2e-3
    mmloader.media.mediainfo.check_decodes(data)  # a complete file: a full decode agrees
    path = store_of(tmp_path, "late.lmdb", [{"__key__": "k", "mkv": data}])
    # the latest start leaving 8 frames is frame 28's (encoded for 28/30 s): the middle, 14/30 s,
    # is frame 14's time
    cases = [
        (dict(frames=8, fps=None, clip="center"), list(range(14, 22))),
        (dict(frames=4, fps=None, clip=1.0), [30, 31, 32, 33]),
        (dict(frames=4, fps=None, clip=1.5), [32, 33, 34, 35]),  # past the room: the last 4
        (dict(frames=4, fps=10, clip=1.3), [24, 27, 30, 33]),
    ]  # room: 1.2 - 4 / 10 = 0.8 s
    for options, expected in cases:
        assert [read_index(f.numpy()) for f in mmloader.VideoReader(path, "mkv", **options)[0]] == expected, options
    for seed in range(6):
        enter_batch(seed, False)
        got = [read_index(f.numpy()) for f in mmloader.VideoReader(path, "mkv", frames=4, clip="random")[0]]
        assert got == list(range(got[0], got[0] + 4)), (seed, got)


@pytest.mark.parametrize("ext", ["mp4", "mkv"])
def test_open_gop_h264_decodes_after_a_seek_and_damage_is_still_an_error(tmp_path, ext):
    """x264 open GOPs: a keyframe after the first is a recovery point whose leading B-frames
    reference the GOP before; a decoder that starts there (after a seek, or after skipping GOPs)
    never saw those references, which is not damage. Damaged packets still are."""
    data = make_indexed_video(ext, 30, frames=48, open_gop=True)
    reference = decode_indexed(data)
    assert [i for _, i in reference] == list(range(48))
    path = store_of(tmp_path, "og.lmdb", [{"__key__": "k", ext: data}])
    for clip in (0.35, 0.45, 1.3):
        for fps in (None, 30):
            reader = mmloader.VideoReader(path, ext, frames=3, fps=fps, clip=clip)
            assert [read_index(f.numpy()) for f in reader[0]] == _consecutive(reference, clip, 3), (clip, fps)
    sparse = mmloader.VideoReader(path, ext, frames=3, fps=2, clip="start")  # skips GOPs between frames
    assert [read_index(f.numpy()) for f in sparse[0]] == [0, 15, 30]
    bad = store_of(tmp_path, "bad.lmdb", [{"__key__": "bad", ext: _garble_packets(data, 1.25, 1.35)}])
    with pytest.raises(DecodeError, match="key='bad'"):
        mmloader.VideoReader(bad, ext, frames=3, fps=None, clip=1.3)[0]


def _cut_after_a_reference(data: bytes) -> bytes:
    """``data`` cut after the last packet that B-frames follow in decode order, save one (in the
    header of the block after it): frames shown before the last frame it keeps are lost too."""
    c = av.open(io.BytesIO(data))
    s = c.streams.video[0]
    packets = [(p.pts, p.pos, p.pos + p.size) for p in c.demux(s) if p.pts is not None]
    c.close()
    cuts = [
        (end + after_pos) // 2 + 1 for (pts, _, end), (after, after_pos, _) in zip(packets, packets[1:]) if after < pts
    ]
    return data[: cuts[-2]]


def test_a_cut_matroska_file_with_b_frames_is_truncated_not_a_gap(tmp_path):
    """Cut after a P-frame, a file with B-frames has lost frames shown before the last one it
    keeps: a clip that reads to the end of the data is truncated (the data ends before the
    header's duration), never frames skipped or the last one repeated; a clip before the cut
    still equals the reference."""
    data = make_indexed_video("mkv", 30, frames=36, bframes=True)
    cut = _cut_after_a_reference(data)
    kept = [i for _, i in decode_indexed(cut)]
    assert kept != list(range(len(kept))) and kept[-1] < 35  # frames lost before the last one kept
    path = store_of(tmp_path, "cut.lmdb", [{"__key__": "cut", "mkv": cut}])
    first_gap = next(i for i, j in enumerate(kept) if i != j)
    for options in (
        dict(frames=4, fps=None, clip=(first_gap - 1) / 30),
        dict(frames=36, fps=None, clip="start"),
        dict(frames=4, fps=30, clip=(first_gap - 0.5) / 30),
    ):
        with pytest.raises(DecodeError, match="truncated video.*key='cut'"):
            mmloader.VideoReader(path, "mkv", **options)[0]
    early = mmloader.VideoReader(path, "mkv", frames=4, fps=None, clip=0.2)
    assert [read_index(f.numpy()) for f in early[0]] == [6, 7, 8, 9]


@pytest.mark.parametrize("ext", ["mkv", "mp4"])
def test_consecutive_clips_fit_in_frames_not_seconds(tmp_path, ext):
    """fps=None: a clip start leaves ``frames`` real frames, whatever the spacing: frames every
    10 ms then one at 2 s (0.19 s of frames, a 2 s stream) never gives a repeated frame."""
    times = [Fraction(i, 100) for i in range(20)] + [Fraction(2)]
    data = make_indexed_video(ext, times=times)
    reference = decode_indexed(data)
    assert [i for _, i in reference] == list(range(21))
    path = store_of(tmp_path, "s.lmdb", [{"__key__": f"k{i}", ext: data} for i in range(8)])
    for clip in ("center", "random"):
        reader = mmloader.VideoReader(path, ext, frames=8, fps=None, clip=clip)
        for i in range(8):
            got = [read_index(f.numpy()) for f in reader[i]]
            assert got == list(range(got[0], got[0] + 8)), (clip, i, got)
            assert np.allclose(reader.timestamps[i].numpy(), [reference[j][0] for j in got], atol=1e-9)


def test_video_seeks_and_skips_what_the_clip_does_not_show(tmp_path):
    """Only what the clip shows is decoded: the GOPs before it (the seek), the rest of a GOP after
    the frame it needs, and whole GOPs between two of its frames are never decoded, so garbage
    there does not matter (the frames still equal the reference); a clip that shows it is a
    DecodeError."""
    clean = make_video("mp4", seconds=6, fps=15, keyint=15)  # a keyframe every second
    bad = _garble_packets(_garble_packets(clean, 0.0, 2.0), 2.4, 3.95)
    path = store_of(tmp_path, "g.lmdb", [{"__key__": "k", "mp4": bad}])
    reference = decode_all_video(clean)
    sparse = mmloader.VideoReader(path, "mp4", frames=2, fps=0.5, clip=2.0)
    frames, shown = sparse.decode_clip(bad, "k")
    assert np.allclose(shown, [2, 4]), shown
    for j, t in enumerate(shown):
        assert np.array_equal(frames[j].permute(1, 2, 0).numpy(), reference[round(t, 6)])
    for clip in ("start", 2.5):
        with pytest.raises(DecodeError, match="key='k'.*field='mp4'"):
            mmloader.VideoReader(path, "mp4", frames=4, fps=1, clip=clip)[0]


# -- audio ---------------------------------------------------------------------------------------------
def sinc_resample(x: np.ndarray, rate: int, out_rate: int, half_width: int = 64) -> np.ndarray:
    """A reference resampler in plain numpy: Kaiser-windowed sinc at the output times."""
    n_out = int(round(x.shape[-1] * out_rate / rate))
    cutoff = 0.95 * min(rate, out_rate) / 2
    t = np.arange(n_out) * rate / out_rate  # output times in input samples
    base = np.floor(t).astype(np.int64)
    taps = np.arange(-half_width * rate // out_rate, half_width * rate // out_rate + 1)
    idx = base[:, None] + taps[None, :]
    d = t[:, None] - idx
    w = np.kaiser(len(taps), 8.0)[None, :] * np.sinc(2 * cutoff / rate * d) * (2 * cutoff / rate)
    valid = (idx >= 0) & (idx < x.shape[-1])
    return (np.where(valid, x[..., np.clip(idx, 0, x.shape[-1] - 1)], 0) * w).sum(-1).astype(np.float32)


@pytest.mark.parametrize("decoder", ["soundfile", "pyav"])
@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_resampled_audio_equals_a_reference_resampler(tmp_path, ext, decoder):
    data = make_audio(ext, seconds=1.5, rate=44100, channels=2)
    path = store_of(tmp_path, "a.lmdb", [{"__key__": "a", ext: data}])
    got = mmloader.AudioReader(path, ext, sample_rate=16000, mono=True, decoder=decoder)[0].numpy()
    assert got.dtype == np.float32 and got.shape == (1, 24000)
    mono = signal(1.5, 44100, 2).mean(0)  # what was encoded (16-bit for wav, exact for flac)
    reference = sinc_resample(mono, 44100, 16000)
    ideal = signal(1.5, 16000, 2).mean(0)  # the band-limited signal at the new rate
    inner = slice(200, -200)
    assert np.abs(got[0, inner] - reference[inner]).max() < 2e-3
    assert np.abs(got[0, inner] - ideal[inner]).max() < 2e-3
    stereo = mmloader.AudioReader(path, ext, sample_rate=22050, mono=False, decoder=decoder)[0].numpy()
    assert stereo.shape == (2, 33075)
    assert np.abs(stereo[1, inner] - sinc_resample(signal(1.5, 44100, 2)[1], 44100, 22050)[inner]).max() < 2e-3


@pytest.mark.parametrize(
    "ext,decoder",
    [
        ("wav", "soundfile"),
        ("flac", "soundfile"),
        ("mp3", "soundfile"),
        ("ogg", "soundfile"),
        ("m4a", "pyav"),
        ("opus", "pyav"),
    ],
)
def test_every_format_decodes_with_the_measured_decoder(tmp_path, ext, decoder):
    data = make_audio(ext, seconds=1.0, rate=44100, channels=2)
    path = store_of(tmp_path, "f.lmdb", [{"__key__": "a", ext: data}])
    reader = mmloader.AudioReader(path, ext, sample_rate=16000)
    assert reader.decoder_for(data) == decoder
    x = reader[0].numpy()
    assert x.dtype == np.float32 and x.shape[0] == 1 and abs(x.shape[1] - 16000) <= 400, x.shape
    ideal = signal(1.0, 16000, 2).mean(0)
    n = min(x.shape[1], len(ideal))
    lags = range(-1200, 1201, 1)  # lossy codecs may shift by their priming samples
    best = max(np.corrcoef(x[0, 2000 + l : n - 2000 + l], ideal[2000 : n - 2000])[0, 1] for l in lags[::8])
    assert best > 0.95, (ext, best)
    if decoder == "soundfile":  # the other decoder reads it too, and the same signal
        y = mmloader.AudioReader(path, ext, sample_rate=16000, decoder="pyav")[0].numpy()
        assert abs(y.shape[1] - x.shape[1]) <= 1200


@pytest.mark.parametrize("decoder", ["soundfile", "pyav"])
def test_audio_windows_are_the_samples_of_a_full_decode(tmp_path, decoder):
    data = make_audio("flac", seconds=2.0, rate=22050, channels=2)
    full, rate = decode_all_audio(data)
    path = store_of(tmp_path, "w.lmdb", [{"__key__": f"k{i}", "flac": data} for i in range(4)])
    for clip in ("start", "center", "random", 0.7, 1.9):
        reader = mmloader.AudioReader(
            path, "flac", sample_rate=None, mono=False, max_seconds=0.5, clip=clip, decoder=decoder
        )
        for i in range(4):
            x = reader[i].numpy()
            start_s, length = reader.window(2.0, f"k{i}")
            a = int(round(start_s * rate))
            assert x.shape == (2, int(0.5 * rate)), (clip, x.shape)
            assert np.array_equal(x, full[:, a : a + x.shape[1]]), (clip, i, a)
    whole = mmloader.AudioReader(path, "flac", sample_rate=None, mono=False, decoder=decoder)[0].numpy()
    assert np.array_equal(whole, full)


def test_audio_clip_random_needs_max_seconds_and_pads_in_batches(tmp_path):
    with pytest.raises(ValueError, match="max_seconds"):
        mmloader.AudioReader(tmp_path, "flac", clip="random")
    samples = [
        {"__key__": f"k{i}", "flac": make_audio("flac", seconds=0.5 + 0.25 * i, rate=16000, channels=1)}
        for i in range(4)
    ]
    path = store_of(tmp_path, "p.lmdb", samples)
    stream = mmloader.Stream(mmloader.zip(audio=mmloader.AudioReader(path, "flac")), batch_size=4, shuffle=False)
    batch = next(iter(mmloader.loader(stream, num_workers=1, backend="thread")))
    assert batch["audio"].shape == (4, 1, 20000) and batch["audio"].dtype == torch.float32
    assert batch["__mask__"]["audio"].sum(-1).squeeze(1).tolist() == [8000, 12000, 16000, 20000]


# -- bad data -------------------------------------------------------------------------------------------
def _ten_hours_flac(data: bytes) -> bytes:
    """STREAMINFO's total-samples field (36 bits at byte 21) set to ten hours."""
    assert data[:4] == b"fLaC"
    rate = int.from_bytes(data[18:21], "big") >> 4
    total = 10 * 3600 * rate
    out = bytearray(data)
    out[21] = (out[21] & 0xF0) | (total >> 32)
    out[22:26] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(out)


def _ten_hours_mp4(data: bytes) -> bytes:
    """Every duration an mp4 header holds set to ten hours: mvhd, tkhd, mdhd, the edit list, and
    the sample table (stts: each frame shown for 10 h / frames), as a tiny file claiming a long
    video would (version-0 boxes, as FFmpeg writes them)."""
    out = bytearray(data)

    def boxes(name: bytes):
        at = 0
        while (at := out.find(name, at + 1)) > 0:
            yield at + 4  # the body

    movie_scale = struct.unpack(">I", out[next(boxes(b"mvhd")) + 12 :][:4])[0]
    for body in boxes(b"mvhd"):
        out[body + 16 : body + 20] = struct.pack(">I", 10 * 3600 * movie_scale)
    for body in boxes(b"tkhd"):
        out[body + 20 : body + 24] = struct.pack(">I", 10 * 3600 * movie_scale)
    for body in boxes(b"elst"):
        for e in range(struct.unpack(">I", out[body + 4 : body + 8])[0]):
            out[body + 8 + 12 * e : body + 12 + 12 * e] = struct.pack(">I", 10 * 3600 * movie_scale)
    track_scale = 1
    for body in boxes(b"mdhd"):
        track_scale = struct.unpack(">I", out[body + 12 : body + 16])[0]
        out[body + 16 : body + 20] = struct.pack(">I", 10 * 3600 * track_scale)
    for body in boxes(b"stts"):
        n = struct.unpack(">I", out[body + 4 : body + 8])[0]
        frames = sum(struct.unpack(">I", out[body + 8 + 8 * e : body + 12 + 8 * e])[0] for e in range(n))
        for e in range(n):
            out[body + 12 + 8 * e : body + 16 + 8 * e] = struct.pack(">I", 10 * 3600 * track_scale // frames)
    return bytes(out)


def test_a_ten_hour_header_is_refused_before_decoding(tmp_path, monkeypatch):
    video = _ten_hours_mp4(make_video("mp4", seconds=1, fps=10, keyint=5))
    audio = _ten_hours_flac(make_audio("flac", seconds=1, rate=16000, channels=1))
    assert mmloader.media.mediainfo.probe(video).duration > 9 * 3600
    assert mmloader.media.mediainfo.probe(audio).duration > 9 * 3600
    path = store_of(tmp_path, "h.lmdb", [{"__key__": "long", "mp4": video, "flac": audio}])

    def no_decoding(*a, **k):
        raise AssertionError("decoding started")

    monkeypatch.setattr(mmloader.readers.video, "decode_targets", no_decoding)
    monkeypatch.setattr(mmloader.readers.audio, "_decode_audio", no_decoding)
    monkeypatch.setattr(sf.SoundFile, "read", no_decoding)
    for reader in (
        mmloader.VideoReader(path, "mp4", clip="start"),
        mmloader.AudioReader(path, "flac"),
        mmloader.AudioReader(path, "flac", decoder="pyav"),
        mmloader.VideoReader(path, "mp4", audio={}).audio,
        mmloader.VideoReader(path, "mp4").timestamps,
    ):
        with pytest.raises(SizeLimitError, match=r"duration of 36,000 s.*max_duration.*key='long'"):
            reader[0]
    # raised per reader, the file decodes (until the patched decoder)
    with pytest.raises(DecodeError, match="decoding started"):
        mmloader.VideoReader(path, "mp4", clip="start", max_duration=11 * 3600)[0]


def test_absurd_resolution_and_sample_rate_are_refused_from_the_header(tmp_path):
    path = store_of(
        tmp_path,
        "r.lmdb",
        [
            {
                "__key__": "big",
                "mp4": make_video("mp4", seconds=1, fps=5, width=320, height=240),
                "wav": make_audio("wav", seconds=0.2, rate=96000, channels=1),
            }
        ],
    )
    with pytest.raises(SizeLimitError, match=r"320x240 pixels.*max_pixels=10000.*key='big'.*field='mp4'"):
        mmloader.VideoReader(path, "mp4", max_pixels=10_000)[0]
    for decoder in ("soundfile", "pyav"):
        with pytest.raises(SizeLimitError, match=r"96,000 Hz exceeds max_sample_rate=48,000.*key='big'.*field='wav'"):
            mmloader.AudioReader(path, "wav", max_sample_rate=48_000, decoder=decoder)[0]


def _corrupt(data: bytes, at: float = 0.5) -> bytes:
    out = bytearray(data)
    i = int(len(out) * at)
    out[i : i + 400] = np.random.default_rng(1).integers(0, 256, 400, dtype=np.uint8).tobytes()
    return bytes(out)


def test_corrupt_and_truncated_mp4_and_flac_are_decode_errors_naming_key_and_field(tmp_path):
    mp4 = make_video("mp4", seconds=2, fps=15, keyint=10)
    mkv = make_video("mkv", seconds=2, fps=15, keyint=10)
    flac = make_audio("flac", seconds=2, rate=16000, channels=1)
    bad = {
        "trunc_mp4": {"mp4": mp4[: len(mp4) // 2]},  # the index (moov) is at the end: gone
        "trunc_mkv": {"mkv": mkv[: len(mkv) // 2]},  # header first, half the frames gone
        "corrupt_mp4": {"mp4": _garble_packets(mp4, 0.0, 2.0)},
        "trunc_flac": {"flac": flac[: len(flac) // 2]},
        "corrupt_flac": {"flac": _corrupt(flac, 0.4)},
    }
    for name, fields in bad.items():
        path = store_of(tmp_path, f"{name}.lmdb", [{"__key__": name, **fields}])
        field = next(iter(fields))
        readers = (
            [mmloader.VideoReader(path, field, frames=30, clip="start")]
            if field in ("mp4", "mkv")
            else [
                mmloader.AudioReader(path, "flac", decoder="soundfile"),
                mmloader.AudioReader(path, "flac", decoder="pyav"),
            ]
        )
        for reader in readers:
            with pytest.raises(DecodeError, match=rf"key='{name}', field='{field}'"):
                reader[0]


def test_skip_policy_keeps_batches_equal_with_bad_media(tmp_path):
    good_v, good_a = (
        make_video("mp4", seconds=1, fps=10, keyint=5),
        make_audio("flac", seconds=0.5, rate=16000, channels=1),
    )
    samples = []
    for i in range(12):
        v, a = good_v, good_a
        if i == 3:
            v = good_v[: len(good_v) // 2]
        if i == 7:
            a = a[: len(a) // 2]
        samples.append({"__key__": f"k{i:02d}", "mp4": v, "flac": a})
    path = store_of(tmp_path, "skip.lmdb", samples)
    ds = mmloader.zip(
        video=mmloader.VideoReader(path, "mp4", frames=4, size=(24, 32)), audio=mmloader.AudioReader(path, "flac")
    )
    stream = mmloader.Stream(ds, batch_size=4, seed=0, errors="skip")
    batches = list(mmloader.loader(stream, num_workers=2, backend="thread"))
    assert [len(b["__key__"]) for b in batches] == [4, 4, 4]
    assert all(b["video"].shape == (4, 4, 3, 24, 32) for b in batches)
    assert stream.skipped == 2
    keys = [k for b in batches for k in b["__key__"]]
    assert "k03" not in keys and "k07" not in keys


# -- randomness, companions, batches --------------------------------------------------------------------
def _clip_times(loader, epoch):
    loader.set_epoch(epoch)
    out = {}
    for b in loader:
        for k, t in zip(b["__key__"], b["times"]):
            out.setdefault(k, []).append(t.tolist())
    return out


@pytest.mark.process
def test_random_clips_are_reproducible_per_seed_and_epoch_and_differ_across_epochs(tmp_path, clips):
    path = store_of(tmp_path, "r.lmdb", [{"__key__": f"k{i:02d}", "mp4": clips["mp4"]} for i in range(8)])
    video = mmloader.VideoReader(path, "mp4", frames=3, fps=5, size=(16, 16))
    ds = mmloader.zip(video=video, times=video.timestamps)
    make = lambda backend, seed=0: mmloader.loader(
        mmloader.Stream(ds, batch_size=4, seed=seed),  # noqa: E731
        num_workers=2,
        backend=backend,
    )
    threads, processes = make("thread"), make("process")
    e0, e1 = _clip_times(threads, 0), _clip_times(threads, 1)
    assert e0 == _clip_times(threads, 0) == _clip_times(processes, 0)  # same seed and epoch: same clips
    assert e1 == _clip_times(processes, 1)
    assert e0 != e1 and sum(e0[k] != e1[k] for k in e0) >= 6  # another epoch, other positions
    assert e0 != _clip_times(make("thread", seed=1), 0)
    starts = [v[0][0] for v in e0.values()]
    assert len(set(starts)) >= 6 and min(starts) >= 0 and max(starts) <= 3 - 3 / 5 + 1e-6
    batch = next(iter(make("thread")))  # the frames are the ones at those times (checked above per sample)
    assert batch["video"].shape == (4, 3, 3, 16, 16) and batch["times"].shape == (4, 3)


def test_video_with_its_audio_track_aligned_by_timestamps(tmp_path, clips):
    data = clips["av"]
    full, rate = decode_all_audio(data)
    path = store_of(tmp_path, "av.lmdb", [{"__key__": f"k{i}", "mp4": data} for i in range(4)])
    video = mmloader.VideoReader(path, "mp4", frames=6, fps=5, size=(24, 32), audio=dict(sample_rate=None, mono=False))
    ds = mmloader.zip(video=video, audio=video.audio, times=video.timestamps)
    for seed in (0, 3):
        enter_batch(seed, False)
        for i in range(4):
            s = ds[i]
            first = float(s["times"][0])
            a = int(round(first * rate))
            n = int(round(6 / 5 * rate))
            assert s["audio"].shape == (2, n)
            # AAC: a seek decodes 0.2 s before the window, after which the decoder's state equals the
            # whole-file decode's up to float rounding (-100 dB)
            assert np.abs(s["audio"].numpy() - full[:, a : a + n]).max() < 1e-4, (seed, i, first)
    resampled = mmloader.VideoReader(path, "mp4", frames=6, fps=5, audio=dict(sample_rate=16000)).audio
    assert resampled[0].shape == (1, int(round(6 / 5 * 16000)))
    stream = mmloader.Stream(ds, batch_size=4, seed=0)
    batch = next(iter(mmloader.loader(stream, num_workers=2, backend="thread")))
    assert batch["video"].shape == (4, 6, 3, 24, 32) and batch["audio"].shape == (4, 2, n)


@pytest.mark.parametrize("codec", ["libopus", "vorbis"])
def test_opus_and_vorbis_windows_in_webm_equal_a_whole_file_decode(tmp_path, codec):
    """Matroska stores packet times in milliseconds (24 samples at 48 kHz) and Opus starts
    ``pre_skip`` samples early: a window is placed on the codec's frame grid, not the rounded
    packet time (it was 24 samples off for Opus at 0.5 s and 1.0 s)."""
    data = make_video("webm", seconds=2, fps=5, width=32, height=32, audio_rate=44100, audio_codec=codec)
    full, rate = decode_all_audio(data)
    path = store_of(tmp_path, "o.lmdb", [{"__key__": "k", "webm": data}])
    for clip in (0.5, 1.0, 0.77):
        x = mmloader.AudioReader(path, "webm", sample_rate=None, mono=False, max_seconds=0.5, clip=clip)[0].numpy()
        a = int(round(clip * rate))
        assert x.shape == (2, int(0.5 * rate)) and np.abs(x - full[:, a : a + x.shape[1]]).max() < 1e-4, (clip,)
    video = mmloader.VideoReader(path, "webm", frames=4, fps=5, clip=1.0, audio=dict(sample_rate=None, mono=False))
    x, first = video.audio[0].numpy(), float(video.timestamps[0][0])
    a = int(round(first * rate))
    assert first == 1.0 and np.abs(x - full[:, a : a + x.shape[1]]).max() < 1e-4


# -- converters, inspect, preview, configs ------------------------------------------------------------
MM = str(Path(sys.executable).parent / "mmloader")


def _mm(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([MM, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def raw_media(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("rawmedia")
    (raw / "clips").mkdir()
    for i in range(3):
        (raw / "clips" / f"c{i}.mp4").write_bytes(make_video("mp4", seconds=1 + i, fps=10, keyint=5, audio_rate=16000))
        (raw / "clips" / f"c{i}.txt").write_text(f"clip {i}")
        (raw / "clips" / f"c{i}.flac").write_bytes(make_audio("flac", seconds=1, rate=16000, channels=1))
    return raw


@pytest.mark.process
def test_pairs_groups_clip_mp4_txt_flac_and_probes_headers(tmp_path, raw_media):
    done = _mm(
        "convert",
        "pairs",
        raw_media / "clips",
        tmp_path / "c.lmdb",
        "--require",
        "mp4,txt,flac",
        "--check-decode",
        "-q",
    )
    assert done.returncode == 0, done.stderr
    store = mmloader.open(tmp_path / "c.lmdb")
    assert len(store) == 3 and set(store.fields) == {"mp4", "txt", "flac"}
    (raw_media / "bad").mkdir(exist_ok=True)
    good = make_video("mp4", seconds=1, fps=10, keyint=5)
    (raw_media / "bad" / "ok.mp4").write_bytes(good)
    (raw_media / "bad" / "cut.mp4").write_bytes(good[: len(good) // 2])
    (raw_media / "bad" / "garbled.mp4").write_bytes(_garble_packets(good, 0.0, 1.0))
    (raw_media / "bad" / "long.mp4").write_bytes(_ten_hours_mp4(good))
    done = _mm("convert", "pairs", raw_media / "bad", tmp_path / "b.lmdb", "--on-error", "skip", "--check-decode")
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "b.lmdb.skipped.tsv").read_text()
    assert "cut\t" in report and "not a readable media file" in report
    assert "garbled\t" in report and "corrupt media" in report  # only a full decode finds this one
    assert "long\t" in report and "max_duration" in report
    assert len(mmloader.open(tmp_path / "b.lmdb")) == 1
    header_only = _mm("convert", "pairs", raw_media / "bad", tmp_path / "h.lmdb", "--on-error", "skip", "-q")
    assert header_only.returncode == 0 and len(mmloader.open(tmp_path / "h.lmdb")) == 2  # garbled passes a header check


@pytest.mark.process
def test_max_seconds_and_transcode(tmp_path, raw_media):
    done = _mm(
        "convert", "pairs", raw_media / "clips", tmp_path / "m.lmdb", "--max-seconds", "2.5", "--on-error", "skip", "-q"
    )
    assert done.returncode == 0 and len(mmloader.open(tmp_path / "m.lmdb")) == 2  # the 3-s clip is refused
    assert "longer than --max-seconds" in (tmp_path / "m.lmdb.skipped.tsv").read_text()
    done = _mm(
        "convert",
        "pairs",
        raw_media / "clips",
        tmp_path / "t.lmdb",
        "--max-seconds",
        "1.5",
        "--transcode",
        "fps=5,size=32,sample_rate=8000",
        "-q",
    )
    assert done.returncode == 0, done.stderr
    store = mmloader.open(tmp_path / "t.lmdb")
    for i in range(3):
        rec = store.read(i)
        info = mmloader.media.mediainfo.probe(rec["mp4"])
        v, a = info.video, info.audio
        assert (v.codec, v.height, v.width, v.fps) == ("h264", 32, 42, 5.0) and a.sample_rate == 8000
        assert info.duration <= 1.5 + 0.25
        assert mmloader.media.mediainfo.probe(rec["flac"]).audio.sample_rate == 8000
    bad = _mm("convert", "pairs", raw_media / "clips", tmp_path / "x.lmdb", "--transcode", "fps=0")
    assert bad.returncode == 2 and "--transcode" in bad.stderr


@pytest.mark.process
def test_manifest_takes_video_and_audio_columns(tmp_path, raw_media):
    rows = [{"video": f"clips/c{i}.mp4", "audio": f"clips/c{i}.flac", "caption": f"clip {i}"} for i in range(3)]
    manifest = raw_media / "clips.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _mm(
        "convert",
        "manifest",
        manifest,
        tmp_path / "man.lmdb",
        "--video-column",
        "video",
        "--audio-column",
        "audio",
        "--text-column",
        "caption",
        "-q",
    )
    assert done.returncode == 0, done.stderr
    store = mmloader.open(tmp_path / "man.lmdb")
    assert set(store.fields) == {"mp4", "flac", "txt"} and len(store) == 3


@pytest.mark.process
def test_inspect_and_preview_show_media(tmp_path, raw_media):
    assert _mm("convert", "pairs", raw_media / "clips", tmp_path / "c.lmdb", "-q").returncode == 0
    out = _mm("inspect", tmp_path / "c.lmdb", "-n", "1").stdout
    assert "h264 64x48 10 fps" in out and "aac 16000 Hz 2 ch" in out and "1.00 s" in out
    assert "flac 16000 Hz 1 ch; decoder soundfile" in out and "decoder pyav" in out
    done = _mm("preview", tmp_path / "c.lmdb", "-o", tmp_path / "p.png", "-n", "2")
    assert done.returncode == 0, done.stderr
    from PIL import Image

    sheet = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"))
    assert (sheet[:160] != 255).any(axis=-1).mean() > 0.2  # frames and waveforms drawn, not an empty sheet
    assert "caption" not in done.stdout or "clip 0" in done.stdout


@pytest.mark.process
def test_config_mixes_video_audio_and_image_with_presence_masks(tmp_path, raw_media):
    cfg = _av_config(tmp_path, raw_media)
    stream = mmloader.from_config(cfg)
    batch = next(iter(mmloader.loader(stream, num_workers=2, backend="thread")))
    _check_mixed_batch(batch)
    with pytest.raises(mmloader.ConfigError, match=r"modalities.audio.clip: 'nope' is not a video modality"):
        bad = json.loads(json.dumps(cfg))
        bad["sources"]["video_text"]["modalities"]["audio"]["clip"] = "nope"
        mmloader.from_config(bad)


def _av_config(tmp_path: Path, raw_media: Path) -> dict:
    clips = tmp_path / "clips.lmdb"
    if not clips.exists():
        assert _mm("convert", "pairs", raw_media / "clips", clips, "-q").returncode == 0
        with mmloader.writer_for(tmp_path / "images.lmdb") as w:
            from conftest import jpeg_bytes

            for i in range(5):
                w.write({"__key__": f"i{i}", "jpg": jpeg_bytes(i, size=(40, 30)), "txt": f"image {i}"})
    return {
        "seed": 0,
        "batch_size": 8,
        "mix": {"epoch_size": 32},
        "sources": {
            "video_text": {
                "path": str(clips),
                "weight": 0.4,
                "modalities": {
                    "video": {"field": "mp4", "frames": 3, "fps": 5, "size": [24, 32]},
                    "audio": {"clip": "video", "sample_rate": 8000},
                    "times": {"reader": "timestamps", "clip": "video"},
                    "caption": {"field": "txt"},
                },
            },
            "audio_text": {
                "path": str(clips),
                "weight": 0.3,
                "modalities": {
                    "audio": {"field": "flac", "sample_rate": 8000, "max_seconds": 0.6, "clip": "random"},
                    "caption": {"field": "txt"},
                },
            },
            "image_text": {
                "path": str(tmp_path / "images.lmdb"),
                "weight": 0.3,
                "modalities": {"image": {"field": "jpg", "size": [24, 32]}, "caption": {"field": "txt"}},
            },
        },
    }


def _check_mixed_batch(batch) -> None:
    present = batch["__present__"]
    sources = batch["__source__"]
    assert batch["video"].shape == (8, 3, 3, 24, 32) and batch["image"].shape == (8, 3, 24, 32)
    assert batch["audio"].shape[:2] == (8, 1) and batch["audio"].shape[2] in (4800, 4801)
    for j, src in enumerate(sources):
        assert bool(present["video"][j]) == (src == "video_text")
        assert bool(present["image"][j]) == (src == "image_text")
        assert bool(present["audio"][j]) == (src in ("video_text", "audio_text"))
        if src == "image_text":
            assert not batch["video"][j].any() and not batch["audio"][j].any()
    assert set(sources) == {"video_text", "audio_text", "image_text"}


# -- DDP and endurance ----------------------------------------------------------------------------------
def _rank_main(rank: int, init: str, cfg: dict, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    stream = mmloader.from_config(cfg)
    loader = mmloader.loader(
        stream, num_workers=2, backend="process", multiprocessing_context="fork", persistent_workers=False
    )
    result = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = []
        for batch in loader:
            _check_mixed_batch(batch)
            batches.append(
                {"keys": list(batch["__key__"]), "sources": list(batch["__source__"]), "times": batch["times"].tolist()}
            )
        result[epoch] = batches
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.process
def test_mixed_video_audio_image_batches_through_2_ranks_x_2_workers(tmp_path, raw_media):
    import torch.multiprocessing as tmp

    cfg = _av_config(tmp_path, raw_media)
    cfg["batch_size"] = 8
    tmp.spawn(_rank_main, args=(str(tmp_path / "init"), cfg, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        counts = [len(r[epoch]) for r in ranks]
        assert counts == [2, 2]  # 32 samples, 2 ranks, batches of 8: equal batches per rank
        delivered = [(s, k) for r in ranks for b in r[epoch] for s, k in zip(b["sources"], b["keys"])]
        assert len(delivered) == 32
        by_source = {s: sum(1 for x, _ in delivered if x == s) for s in ("video_text", "audio_text", "image_text")}
        assert sum(by_source.values()) == 32 and min(by_source.values()) >= 6
    # the same plan on a single process gives the same clips (times) for the same samples
    single = mmloader.loader(mmloader.from_config(cfg), num_workers=2, backend="thread")
    single.set_epoch(1)
    times = {}
    for b in single:
        for src, k, t, p in zip(b["__source__"], b["__key__"], b["times"].tolist(), b["__present__"]["times"]):
            if p:
                times.setdefault(k, []).append(t)
    ranked = {}
    for r in ranks:
        for b in r["1"]:
            for src, k, t in zip(b["sources"], b["keys"], b["times"]):
                if src == "video_text":
                    ranked.setdefault(k, []).append(t)
    assert ranked.keys() == times.keys()


@pytest.mark.process
def test_memory_stays_flat_over_20_epochs_of_video_decoding(tmp_path, capsys):
    """Persistent worker processes decode clips for 20 epochs; RSS, descriptors and mappings are
    read from outside the workers (/proc), so nothing in them changes to be observed."""
    from conftest import _proc_figures

    from mmloader.cli.bench import _children

    data = make_video("mp4", seconds=2, fps=15, keyint=10, audio_rate=16000, width=96, height=64)
    path = store_of(tmp_path, "m.lmdb", [{"__key__": f"k{i:02d}", "mp4": data, "txt": f"t{i}"} for i in range(24)])
    video = mmloader.VideoReader(path, "mp4", frames=4, fps=5, size=(32, 48), audio=dict(sample_rate=16000))
    ds = mmloader.zip(video=video, audio=video.audio, caption=mmloader.TextReader(path))
    loader = mmloader.loader(
        mmloader.Stream(ds, batch_size=8),
        num_workers=2,
        backend="process",
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    others = set(_children(os.getpid()))
    per_epoch = []
    for epoch in range(20):
        loader.set_epoch(epoch)
        assert sum(b["video"].shape[0] for b in loader) == 24
        per_epoch.append({pid: _proc_figures(pid) for pid in set(_children(os.getpid())) - others})
    first, last = per_epoch[2], per_epoch[-1]  # epochs 0-1: first touches, FFmpeg's one-time setup
    assert set(first) == set(last) and len(first) == 2
    with capsys.disabled():
        print("\n  worker   RSS kB (epoch 2 -> 20)   fds      maps")
        for pid in first:
            print(
                f"  {pid:>6}   {first[pid][0]:>7} -> {last[pid][0]:<7}   {first[pid][1]} -> {last[pid][1]}   "
                f"{first[pid][2]} -> {last[pid][2]}"
            )
    for pid in first:
        assert last[pid][0] - first[pid][0] < 4096, "worker RSS grew by more than 4 MB over 18 epochs"
        assert last[pid][1] == first[pid][1], "open file descriptors kept growing"
        assert last[pid][2] - first[pid][2] <= 2, "memory-mapped regions kept growing"


@pytest.mark.process
def test_import_mmloader_and_converters_without_av():
    code = (
        "import sys, mmloader, mmloader.converters.pairs, mmloader.converters.manifest, mmloader.converters.common\n"
        "mmloader.media.mediainfo.field_kind('mp4')\n"
        "assert not {'av', 'soundfile', 'torch'} & set(sys.modules), sorted({'av', 'soundfile', 'torch'} & set(sys.modules))\n"
        "import mmloader.readers\n"
        "assert not {'av', 'soundfile'} & set(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_auto_backend_picks_worker_processes_for_media_readers(tmp_path, clips):
    """PyAV runs Python per packet (it holds the GIL): the default loader uses processes for it."""
    from mmloader.loading.dataloader import choose_backend

    path = store_of(tmp_path, "m.lmdb", [{"__key__": "k0", "mp4": clips["av"], "txt": "a"}])
    text_only = mmloader.Stream(mmloader.zip(txt=mmloader.TextReader(path)), batch_size=1)
    video = mmloader.Stream(
        mmloader.zip(v=mmloader.VideoReader(path, "mp4", frames=2), txt=mmloader.TextReader(path)), batch_size=1
    )
    audio = mmloader.Stream(mmloader.zip(a=mmloader.AudioReader(path, "mp4")), batch_size=1)
    assert choose_backend(text_only)[0] == "thread"
    for stream, name in ((video, "VideoReader"), (audio, "AudioReader")):
        backend, why = choose_backend(stream)
        assert backend == "process" and name in why


def _av_clip(fmt: str, video_start_frames: int, audio_start_samples: int, rate: int = 16000, fps: int = 30) -> bytes:
    """H.264 + PCM whose tracks start apart; each audio sample's value is its time on the file's
    clock (value * 16 / rate seconds), so a window's first sample says where it starts."""
    import io
    from fractions import Fraction

    import av

    out = io.BytesIO()
    c = av.open(out, "w", format=fmt)
    s = c.add_stream("libx264", rate=fps)
    s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
    a = c.add_stream("pcm_s16le", rate=rate)
    a.layout = "mono"
    for i in range(45):
        f = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 8 * i % 255, np.uint8), format="rgb24")
        f.pts, f.time_base = i + video_start_frames, Fraction(1, fps)
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode(None):
        c.mux(p)
    x = (np.arange(2 * rate, dtype=np.int64) + audio_start_samples)[None] // 16
    x = x.astype(np.int16)
    for i in range(0, x.shape[1], 1024):
        fr = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + 1024]), format="s16", layout="mono")
        fr.sample_rate, fr.pts, fr.time_base = rate, i + audio_start_samples, Fraction(1, rate)
        for p in a.encode(fr):
            c.mux(p)
    c.close()
    return out.getvalue()


@pytest.mark.parametrize("fmt,ext", [("matroska", "mkv"), ("mp4", "mp4")])
def test_the_audio_companion_follows_the_picture_when_the_tracks_start_apart(tmp_path, fmt, ext):
    rate = 16000
    path = tmp_path / f"apart-{ext}.lmdb"
    with mmloader.LMDBWriter(path) as w:
        w.write({"__key__": "late-video", ext: _av_clip(fmt, 15, 0)})  # video from 0.5 s, audio from 0
        w.write({"__key__": "late-audio", ext: _av_clip(fmt, 0, int(0.3 * rate))})  # audio from 0.3 s
    reader = mmloader.VideoReader(str(path), ext, frames=6, clip=0.2, audio=dict(sample_rate=None, mono=False))
    for i, (video_start, audio_start) in enumerate([(0.5, 0.0), (0.0, 0.3)]):
        shown = video_start + float(reader.timestamps[i][0])  # the first frame, on the file's clock
        audio = reader.audio[i].numpy()[0] * 32768 * 16 / rate  # each sample's time on the file's clock
        heard = np.flatnonzero(audio)[0] if audio_start > shown else 0
        assert abs(heard / rate - max(0.0, audio_start - shown)) < 2 / rate, (ext, i)  # silence until it starts
        assert abs(audio[heard] - max(shown, audio_start)) < 2e-3, (ext, i, audio[heard], shown)
        assert audio.shape[0] == pytest.approx(6 / 30 * rate, abs=2)
