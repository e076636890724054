"""AudioReader: stored audio (or a video's audio track) -> float32 ``(C, N)`` at one sample rate.

Decoding and resampling run in C: libsndfile (soundfile) or FFmpeg (PyAV) decodes, only the
window asked for (a seek, then that many samples), and FFmpeg's resampler (libswresample)
converts the rate in one call over the whole window. Nothing is written to a temp file.

Which decoder, per format, was chosen by measurement (``benchmarks/av.py``; README, "Video and
audio"): libsndfile for WAV, FLAC, MP3 and Ogg Vorbis, where it was faster (WAV: 2.2 ms per 10 s
of 44.1 kHz stereo against 30 ms for PyAV, whose demuxer hands out 1,024-sample packets),
FFmpeg for the rest (AAC/m4a, Opus, audio tracks of videos) and for everything when soundfile
is not installed. ``decoder="pyav"`` or ``"soundfile"`` forces one.
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable

import numpy as np
import torch

from ..errors import DecodeError, SizeLimitError
from ..media.mediainfo import (
    AUDIO_EXTENSIONS,
    DEFAULT_MAX_CHANNELS,
    DEFAULT_MAX_DURATION,
    DEFAULT_MAX_SAMPLE_RATE,
    VIDEO_EXTENSIONS,
    Limits,
    MediaInfo,
    StreamInfo,
    import_av,
    import_soundfile,
    info_of,
    open_container,
)
from ..storage import Store
from .base import Reader
from .clips import CLIPS, ClipSource, _demux_times, _start, check_clip, clip_start

DECODERS = ("auto", "pyav", "soundfile")
#: The decoder measured fastest for each format that libsndfile reads (the others: FFmpeg).
SOUNDFILE_FORMATS = ("wav", "flac", "mp3", "ogg-vorbis")
#: Decoded from a seek point exactly; the others decode PREROLL_S before a window and drop it.
LOSSLESS_CODECS = ("flac", "alac", "wavpack") + tuple(
    f"pcm_{t}" for t in ("s16le", "s24le", "s32le", "f32le", "f64le", "u8", "s16be", "mulaw", "alaw")
)
PREROLL_S = 0.2
#: Opus needs longer for its decoder state (CELT's energy and pitch filters) to match a whole-file
#: decode's: measured 1.6e-3 off after 0.2 s, 1e-7 after 0.5 s (48 kHz stereo, tests/readers/test_av.py).
PREROLL_BY_CODEC = {"opus": 0.5, "libopus": 0.5}


def preroll(codec: str) -> float:
    """Seconds decoded and dropped before a window of this codec (0: it decodes from a seek exactly)."""
    return 0.0 if codec in LOSSLESS_CODECS else PREROLL_BY_CODEC.get(codec, PREROLL_S)


#: Codecs whose frames carry checksums: FFmpeg checks them and stops at a mismatch.
STRICT_CODECS = ("flac", "alac", "wavpack")
#: FFmpeg's default channel layouts by channel count (swresample needs a layout).
LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}


def sniff(data) -> str | None:
    """The audio format from its first bytes: ``wav``, ``flac``, ``mp3``, ``ogg-vorbis``,
    ``ogg-opus``, ``ogg`` or None (then FFmpeg probes it).

    >>> sniff(b"fLaC\\0\\0\\0\\x22"), sniff(b"RIFF\\0\\0\\0\\0WAVEfmt "), sniff(b"ID3\\x04")
    ('flac', 'wav', 'mp3')
    """
    head = bytes(data[:96])
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"OggS":
        return "ogg-vorbis" if b"\x01vorbis" in head else "ogg-opus" if b"OpusHead" in head else "ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def _planar_float(frame) -> np.ndarray:
    """A decoded PyAV audio frame as float32 ``(C, n)``, whatever its sample format."""
    a = frame.to_ndarray()
    name = frame.format.name
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:
        a = a.reshape(-1, channels).T
    if name.startswith("s16"):
        return a.astype(np.float32) / 32768.0
    if name.startswith("s32"):
        return (a / 2147483648.0).astype(np.float32)
    if name.startswith("u8"):
        return (a.astype(np.float32) - 128.0) / 128.0
    if name.startswith("s64"):
        return (a / 9223372036854775808.0).astype(np.float32)
    return a.astype(np.float32, copy=False)


def resample(x: np.ndarray, rate: int, out_rate: int) -> np.ndarray:
    """float32 ``(C, N)`` at ``rate`` -> ``(C, round(N * out_rate / rate))`` at ``out_rate`` with
    FFmpeg's resampler (one call over the whole signal: no Python per sample or per frame)."""
    if rate == out_rate or x.shape[1] == 0:
        return x
    av = import_av()
    n_out = int(round(x.shape[1] * out_rate / rate))
    layout = LAYOUTS.get(x.shape[0])
    if layout is None:  # no default layout for this count: channel by channel
        return np.concatenate([resample(x[c : c + 1], rate, out_rate) for c in range(x.shape[0])])
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x, dtype=np.float32), format="fltp", layout=layout)
    frame.sample_rate = rate
    frame.pts = None
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=out_rate)
    parts = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    y = np.concatenate(parts, axis=1) if parts else np.zeros((x.shape[0], 0), np.float32)
    if y.shape[1] < n_out:
        y = np.pad(y, ((0, 0), (0, n_out - y.shape[1])))
    return np.ascontiguousarray(y[:, :n_out])


class AudioReader(Reader):
    """An audio field (or a video's audio track) as a float32 ``(C, N)`` tensor.

    ``sample_rate``: the output rate (None: the file's own); ``mono``: average the channels
    (``C == 1``). ``max_seconds``: at most this much audio, from where ``clip`` says
    (``"start"``, the default; ``"random"``, ``"center"``, seconds); without it the whole file.
    ``clip=video_reader`` (what ``VideoReader(..., audio=dict(...)).audio`` builds): the audio
    track over that reader's clip, from its first frame's time for ``T * step`` seconds.
    Lengths differ between files: batches pad them, with ``batch["__mask__"][name]``.

    Guards, from the header before decoding: ``max_duration`` (seconds), ``max_sample_rate``,
    ``max_channels``; while decoding, never more than ``max_duration`` of samples (a header that
    understates the length). Corrupt or truncated data is a :class:`DecodeError`.

    >>> speech = AudioReader("speech.lmdb", "flac", sample_rate=16000, max_seconds=10, clip="random")  # doctest: +SKIP
    >>> speech[0].shape                                                                           # doctest: +SKIP
    torch.Size([1, 160000])
    """

    default_field = "flac"
    field_extensions = AUDIO_EXTENSIONS
    releases_gil = True  # libsndfile (cffi) and FFmpeg run without the GIL
    python_per_sample = True  # per-packet Python in PyAV: processes measured faster

    def __init__(
        self,
        source: str | os.PathLike | Store,
        field: str | None = None,
        *,
        sample_rate: int | None = 16000,
        mono: bool = True,
        max_seconds: float | None = None,
        clip: Any = "start",
        decoder: str = "auto",
        max_duration: float | None = DEFAULT_MAX_DURATION,
        max_sample_rate: int | None = DEFAULT_MAX_SAMPLE_RATE,
        max_channels: int | None = DEFAULT_MAX_CHANNELS,
        transform: Callable[[Any], Any] | None = None,
        decode: Callable | None = None,
        **kwargs,
    ):
        if sample_rate is not None and (
            isinstance(sample_rate, bool)
            or not isinstance(sample_rate, int)
            or not 0 < sample_rate <= DEFAULT_MAX_SAMPLE_RATE
        ):
            raise ValueError(f"sample_rate={sample_rate!r}: expected a positive int (Hz) or None (the file's own)")
        if not isinstance(mono, bool):
            raise ValueError(f"mono={mono!r}: expected True or False")
        if max_seconds is not None and (
            isinstance(max_seconds, bool)
            or not isinstance(max_seconds, (int, float))
            or not 0 < max_seconds < float("inf")
        ):
            raise ValueError(f"max_seconds={max_seconds!r}: expected a positive number or None")
        if not isinstance(clip, ClipSource):
            check_clip(clip)
            if clip != "start" and max_seconds is None:
                raise ValueError(f"clip={clip!r} places a window of max_seconds: give max_seconds too")
        if decoder not in DECODERS:
            raise ValueError(f"decoder={decoder!r}: expected one of {', '.join(map(repr, DECODERS))}")
        super().__init__(source, field, transform=transform, decode=decode, **kwargs)
        self.sample_rate, self.mono, self.max_seconds, self.clip = sample_rate, mono, max_seconds, clip
        self.decoder = decoder
        self.limits = Limits(
            max_duration=max_duration, max_pixels=None, max_sample_rate=max_sample_rate, max_channels=max_channels
        )
        if self._decode_fn is None:
            if decoder == "soundfile" and import_soundfile() is None:
                raise ImportError("decoder='soundfile' needs soundfile: pip install 'mmloader[av]'")
            import_av()  # the resampler (and every format libsndfile does not read)

    # -- which decoder --------------------------------------------------------
    def decoder_for(self, data) -> str:
        """``"soundfile"`` or ``"pyav"``: the decoder this reader uses for these bytes."""
        if isinstance(self.clip, ClipSource) or self.decoder == "pyav":
            return "pyav"
        if self.decoder == "soundfile":
            return "soundfile"
        return "soundfile" if sniff(data) in SOUNDFILE_FORMATS and import_soundfile() is not None else "pyav"

    # -- the window -----------------------------------------------------------
    def window(self, duration: float | None, key: str) -> tuple[float, float | None]:
        """(start, length) in seconds of the audio to return (length None: to the end)."""
        if self.max_seconds is None:
            return 0.0, None
        room = (duration - self.max_seconds) if duration is not None else 0.0
        return clip_start(self.clip, key, room), float(self.max_seconds)

    # -- decoding -------------------------------------------------------------
    def decode(self, data, key: str) -> Any:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        x, rate = self.decode_native(data, key)
        if self.mono and x.shape[0] > 1:
            x = x.mean(axis=0, keepdims=True, dtype=np.float32)
        if self.sample_rate is not None:
            x = resample(x, rate, self.sample_rate)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def decode_native(self, data, key: str) -> tuple[np.ndarray, int]:
        """(float32 ``(C, N)`` at the file's own rate, that rate): the window, decoded."""
        if self.decoder_for(data) == "soundfile":
            try:
                return self._soundfile(data, key)
            except DecodeError:
                if self.decoder == "soundfile":
                    raise
                # a file libsndfile rejects (an odd WAV subtype, say) may still be one FFmpeg reads
                return self._pyav(data, key)
        return self._pyav(data, key)

    def _soundfile(self, data, key: str) -> tuple[np.ndarray, int]:
        sf = import_soundfile()
        try:
            f = sf.SoundFile(io.BytesIO(data))
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise DecodeError(f"not a readable audio file (libsndfile: {e})") from None
        with f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
            duration = frames / rate if rate and frames >= 0 else None
            info = MediaInfo(
                f.format.lower(),
                duration,
                [StreamInfo("audio", f.subtype.lower(), duration, sample_rate=rate, channels=channels, frames=frames)],
                decoder="soundfile",
            )
            self.limits.check(info)
            start_s, length_s = self.window(duration, key)
            start = min(int(round(start_s * rate)), max(frames, 0))
            want = frames - start if length_s is None else min(int(round(length_s * rate)), frames - start)
            try:
                if start:
                    f.seek(start)
                x = f.read(want, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as e:
                raise DecodeError(f"corrupt audio (libsndfile: {e})") from None
        _check_length(len(x), want, rate, info)
        return np.ascontiguousarray(x.T), rate

    def _pyav(self, data, key: str) -> tuple[np.ndarray, int]:
        av = import_av()
        container = open_container(data)
        try:
            info = info_of(container)
            self.limits.check(info)
            if isinstance(self.clip, ClipSource):
                self.clip.limits.check(info)
            if info.audio is None:
                raise DecodeError(f"no audio stream ({info.describe()})")
            length_s: float | None
            if isinstance(self.clip, ClipSource):
                if info.video is None:
                    raise DecodeError(f"no video stream to align the audio with ({info.describe()})")
                plan = self.clip.plan(info, key, container)
                shown = _demux_times(container, container.streams.video[0], plan)
                # The frames' times count from the video stream's start, the audio's from its own:
                # the two tracks may start apart (a stream copy cut, a late track).
                offset = _start(container.streams.video[0]) - _start(container.streams.audio[0])
                start_s, length_s = float(shown[0]) + offset, len(plan.times) * plan.step
            else:
                start_s, length_s = self.window(info.audio.duration or info.duration, key)
            lead = preroll(container.streams.audio[0].codec_context.name)
            if isinstance(self.clip, ClipSource) and start_s <= lead:
                # from the start: a fresh demuxer (after a seek to 0 the mp4 demuxer no longer drops
                # the encoder's priming samples, so the first samples would differ from a full decode)
                container.close()
                container = open_container(data)
            silence = 0.0
            if start_s < 0:  # the clip starts before the audio does: silence until it starts
                silence, start_s = -start_s, 0.0
                length_s = max(0.0, (length_s or 0.0) - silence)
            x, rate = _decode_audio(
                container,
                container.streams.audio[0],
                info,
                start_s,
                length_s,
                self.limits,
                rewind=isinstance(self.clip, ClipSource) and start_s > lead,
            )
            if silence:
                x = np.concatenate([np.zeros((x.shape[0], int(round(silence * rate))), x.dtype), x], axis=1)
            return x, rate
        except av.error.FFmpegError as e:
            raise DecodeError(f"corrupt audio: {e}") from None
        finally:
            container.close()

    def probe(self, data) -> MediaInfo:
        """What the header says, with the decoder this reader would use."""
        if self.decoder_for(data) == "soundfile":
            sf = import_soundfile()
            with sf.SoundFile(io.BytesIO(data)) as f:
                d = f.frames / f.samplerate if f.samplerate else None
                return MediaInfo(
                    f.format.lower(),
                    d,
                    [
                        StreamInfo(
                            "audio",
                            f.subtype.lower(),
                            d,
                            sample_rate=f.samplerate,
                            channels=f.channels,
                            frames=f.frames,
                        )
                    ],
                    decoder="soundfile",
                )
        container = open_container(data)
        try:
            return info_of(container)
        finally:
            container.close()


def _check_length(got: int, want: int, rate: int, info: MediaInfo) -> None:
    """Fewer samples than the header promised for the window: truncated or corrupt data."""
    if want > 0 and got < want - max(int(0.01 * want), rate // 10):
        declared = info.duration
        raise DecodeError(
            f"truncated or corrupt audio: decoded {got / rate:.2f} s of the {want / rate:.2f} s "
            f"asked" + (f" (the header says {declared:.2f} s)" if declared else "")
        )


def _frame_grid(stream, rate: int) -> tuple[int, int] | None:
    """(period, offset) in samples of the positions where this codec's frames can start, when the
    container's packet times are too coarse to place a frame to the sample (Matroska/WebM store
    milliseconds: 48 samples at 48 kHz) and the grid is fine enough to round to; else None.

    Opus frames last multiples of 2.5 ms (120 samples at 48 kHz) from the first packet, which
    starts ``pre_skip`` samples (OpusHead) before the first sample a decode returns; Vorbis
    frames hop by multiples of a quarter of its short block (identification header) from 0."""
    tb = stream.time_base
    resolution = float(tb) * rate if tb else 0.0
    if resolution <= 1.0:
        return None
    cc = stream.codec_context
    extra = bytes(cc.extradata or b"")
    grid = None
    if cc.name in ("opus", "libopus") and rate == 48000:
        head = extra.find(b"OpusHead")
        pre_skip = (
            int.from_bytes(extra[head + 10 : head + 12], "little")
            if head >= 0 and len(extra) >= head + 12
            else int(getattr(cc, "delay", 0) or 0)
        )
        grid = (120, -pre_skip % 120)
    elif cc.name in ("vorbis", "libvorbis"):
        ident = extra.find(b"\x01vorbis")
        if ident >= 0 and len(extra) > ident + 28:
            grid = ((1 << (extra[ident + 28] & 0x0F)) // 4, 0)
    if grid is None or grid[0] <= resolution + 2:  # the rounding could land on the wrong boundary
        return None
    return grid


def _decode_audio(
    container, stream, info: MediaInfo, start_s: float, length_s: float | None, limits: Limits, rewind: bool = False
) -> tuple[np.ndarray, int]:
    """Samples of ``stream`` from ``start_s`` (seconds from its start) for ``length_s`` seconds."""
    cc = stream.codec_context
    cc.thread_count = 1
    if cc.name in STRICT_CODECS:  # lossless: a frame that fails its CRC is an error, not skipped quietly
        cc.options = {"err_detect": "crccheck+explode"}
    rate = int(cc.sample_rate)
    if not rate:
        raise DecodeError("audio stream without a sample rate")
    origin = _start(stream)
    lead = preroll(cc.name)
    if start_s > lead or rewind:
        # Lossy decoders need the frames before a position to decode it exactly (AAC and MP3 overlap
        # frames, Opus asks for 80 ms): seek earlier and drop what precedes the window. Windows that
        # start within the pre-roll are decoded from the start (a seek to 0 would keep the encoder's
        # priming samples that a fresh demuxer drops).
        container.seek(int((max(0.0, start_s - lead) + origin) / stream.time_base), stream=stream, backward=True)
    first = int(round(start_s * rate))
    want = None if length_s is None else int(round(length_s * rate))
    cap = int(limits.max_duration * rate) if limits.max_duration else None
    grid = _frame_grid(stream, rate)
    parts: list[np.ndarray] = []
    have = 0
    position = None  # sample index (from the stream's start) of the next decoded sample
    for frame in container.decode(stream):
        x = _planar_float(frame)
        if frame.pts is not None:
            position = int(round((float(frame.pts * stream.time_base) - origin) * rate))
            if grid is not None:  # a coarse packet time: the frame boundary it rounds
                period, offset = grid
                position = offset + int(round((position - offset) / period)) * period
        elif position is None:
            position = first
        begin = position
        position = begin + x.shape[1]
        if position <= first:
            continue
        if begin < first:
            x = x[:, first - begin :]
        if want is not None and have + x.shape[1] >= want:
            parts.append(x[:, : want - have])
            have = want
            break
        parts.append(x)
        have += x.shape[1]
        if cap is not None and have > cap:
            raise SizeLimitError(
                f"decoded more than max_duration={limits.max_duration:,.0f} s of audio "
                "(the header understates the length)"
            )
    channels = parts[0].shape[0] if parts else max(int(cc.channels or 1), 1)
    x = np.concatenate(parts, axis=1) if parts else np.zeros((channels, 0), np.float32)
    assert info.audio is not None  # the caller checked for an audio stream
    declared = info.audio.duration if info.audio.duration is not None else info.duration
    expected = want
    if declared is not None:
        rest = max(0, int(declared * rate) - first)
        expected = rest if want is None else min(want, rest)
    if expected is not None:
        _check_length(x.shape[1], expected, rate, info)
    return x, rate


__all__ = ["AudioReader", "resample", "sniff", "CLIPS", "VIDEO_EXTENSIONS"]
