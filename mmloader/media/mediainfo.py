"""Video and audio containers from the header alone, before anything is decoded; torch-free.

The readers and the converters share this module: the field names that hold media, the
header probe (PyAV, or libsndfile for the formats it reads), the limits that refuse a bomb
before decoding (an absurd duration, frame size, sample rate or channel count), a strict full
decode for ``--check-decode``, and the one-time re-encode of ``--transcode``.

PyAV (FFmpeg) and soundfile (libsndfile) are imported when first used, so ``import mmloader``
and the converters start without them; a reader or converter that needs them and cannot import
them says which extra to install (``pip install 'mmloader[av]'``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..errors import DecodeError, SizeLimitError

#: Field names (file extensions) that hold video (possibly with an audio track).
VIDEO_EXTENSIONS = ("mp4", "webm", "mkv", "mov", "m4v", "avi", "ogv")
#: Field names that hold audio only.
AUDIO_EXTENSIONS = ("flac", "wav", "mp3", "ogg", "opus", "m4a", "aac")
MEDIA_EXTENSIONS = VIDEO_EXTENSIONS + AUDIO_EXTENSIONS

#: Default limits, checked from the header before any decoding. Four hours is longer than any
#: clip a sample should hold (a feature film is ~2 h); raise ``max_duration`` for long recordings.
DEFAULT_MAX_DURATION = 4 * 3600.0
#: Pixels per video frame: 8K UHD (7680 x 4320 = 33.2 M) fits.
DEFAULT_MAX_FRAME_PIXELS = 1 << 25
#: Sample rates above 768 kHz (twice the highest studio rate) are not audio a model trains on.
DEFAULT_MAX_SAMPLE_RATE = 768_000
#: Channels: 64 covers every surround and ambisonics layout in use.
DEFAULT_MAX_CHANNELS = 64

INSTALL_HINT = "pip install 'mmloader[av]' (PyAV bundles FFmpeg; soundfile bundles libsndfile)"


def import_av():
    """PyAV, or an ImportError that says how to install it."""
    try:
        import av
    except ImportError as e:
        raise ImportError(f"video and audio decoding needs PyAV: {INSTALL_HINT} ({e})") from None
    av.logging.set_level(av.logging.PANIC)  # errors are raised, not printed per frame
    return av


def scale_options(av, threads: int) -> dict:
    """``frame.reformat`` options that scale on ``threads`` threads (0: FFmpeg's choice), where
    PyAV takes them (17+; older ones scale on one). PyAV's own default is one per CPU: in each of
    several worker processes that oversubscribes the cores, and a forked worker was seen to hang
    for good inside such a scale (its thread pool), so readers pass their ``threads`` (1)."""
    try:
        major = int(str(av.__version__).split(".")[0])
    except ValueError:
        return {}
    return {"threads": threads} if major >= 17 else {}


def import_soundfile():
    """soundfile, or None when it is not installed (PyAV decodes every format then)."""
    try:
        import soundfile
    except (ImportError, OSError):  # OSError: the wheel's libsndfile cannot load
        return None
    return soundfile


def field_kind(field: str) -> str | None:
    """``"video"``, ``"audio"`` or None for a field name (``mp4`` -> video, ``flac.gz`` -> audio).

    >>> field_kind("mp4"), field_kind("FLAC"), field_kind("txt"), field_kind("clip.webm")
    ('video', 'audio', None, 'video')
    """
    ext = field.lower().removesuffix(".gz").rsplit(".", 1)[-1]
    return "video" if ext in VIDEO_EXTENSIONS else "audio" if ext in AUDIO_EXTENSIONS else None


@dataclass
class StreamInfo:
    kind: str  # "video" or "audio"
    codec: str
    duration: float | None  # seconds, from the header (None: not declared)
    width: int = 0
    height: int = 0
    fps: float = 0.0
    frames: int = 0  # declared frame (video) or sample (audio) count, 0 if unknown
    sample_rate: int = 0
    channels: int = 0


@dataclass
class MediaInfo:
    """What a media file's header says: container, duration and streams."""

    container: str
    duration: float | None
    streams: list[StreamInfo] = field(default_factory=list)
    decoder: str = "pyav"

    @property
    def video(self) -> StreamInfo | None:
        return next((s for s in self.streams if s.kind == "video"), None)

    @property
    def audio(self) -> StreamInfo | None:
        return next((s for s in self.streams if s.kind == "audio"), None)

    def describe(self) -> str:
        """One line: ``mp4 10.0 s; h264 854x480 30 fps; aac 44100 Hz 2 ch``."""
        parts = [f"{self.container} {_seconds(self.duration)}"]
        for s in self.streams:
            if s.kind == "video":
                parts.append(f"{s.codec} {s.width}x{s.height} {s.fps:g} fps")
            else:
                parts.append(f"{s.codec} {s.sample_rate} Hz {s.channels} ch")
        return "; ".join(parts)


def _seconds(d: float | None) -> str:
    return "duration unknown" if d is None else f"{d:.2f} s"


def _stream_duration(stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    # Matroska/WebM: the track's own length is a tag ("00:00:02.008000000"), the container's
    # duration covers every track (an audio track may outlast the video). The tag is where the
    # track ends on the segment's clock (from 0), not its length: a track whose first timestamp
    # is 0.5 s and that ends at 1.7 s lasts 1.2 s
    tag = (stream.metadata or {}).get("DURATION")
    if tag:
        try:
            h, m, sec = tag.split(":")
            end = int(h) * 3600 + int(m) * 60 + float(sec)
        except ValueError:
            return None
        return _from_start(end, _stream_start(stream))
    return None


def _stream_start(stream) -> float:
    return float(stream.start_time * stream.time_base) if stream.start_time is not None and stream.time_base else 0.0


def _from_start(end: float, start: float) -> float:
    """A Matroska end time as a length from the stream's first timestamp (an end at or before that
    start is taken as a length already: some muxers write one)."""
    return end - start if 0 < start < end else end


def open_container(data: Any):
    """An FFmpeg demuxer over bytes in memory (no temp file); a :class:`DecodeError` when it is
    not a media file FFmpeg can read."""
    av = import_av()
    try:
        return av.open(io.BytesIO(data) if not isinstance(data, io.IOBase) else data, mode="r")
    except av.error.FFmpegError as e:
        raise DecodeError(f"not a readable media file: {e.strerror if hasattr(e, 'strerror') else e}") from None
    except (ValueError, OSError, EOFError) as e:
        raise DecodeError(f"not a readable media file: {e}") from None


def info_of(container) -> MediaInfo:
    """:class:`MediaInfo` of an open PyAV container (header only)."""
    streams = []
    for s in container.streams:
        cc = s.codec_context
        if s.type == "video":
            rate = s.average_rate or s.guessed_rate or s.base_rate
            streams.append(
                StreamInfo(
                    "video",
                    cc.name if cc else "?",
                    _stream_duration(s),
                    width=cc.width,
                    height=cc.height,
                    fps=float(rate) if rate else 0.0,
                    frames=int(s.frames or 0),
                )
            )
        elif s.type == "audio":
            streams.append(
                StreamInfo(
                    "audio",
                    cc.name if cc else "?",
                    _stream_duration(s),
                    sample_rate=int(cc.sample_rate or 0),
                    channels=int(cc.channels or 0),
                    frames=int(s.duration or 0) if s.time_base and s.time_base.denominator == cc.sample_rate else 0,
                )
            )
    duration = container.duration / 1_000_000 if container.duration is not None else None
    if duration is not None and "matroska" in (container.format.name or "") and container.start_time:
        # Matroska's segment duration also runs from 0 (FFmpeg's other demuxers give a length)
        duration = _from_start(duration, container.start_time / 1_000_000)
    durations = [s.duration for s in streams if s.duration is not None]
    if durations:
        duration = max(durations + ([duration] if duration is not None else []))
    name = (container.format.name or "?").split(",")[0]
    return MediaInfo(name, duration, streams)


def probe(data: Any) -> MediaInfo:
    """Container, duration and streams from the header (FFmpeg's probe reads only the header and
    the index; nothing is decoded).

    >>> probe(open("clip.mp4", "rb").read()).describe()     # doctest: +SKIP
    'mov 10.00 s; h264 854x480 30 fps; aac 44100 Hz 2 ch'
    """
    container = open_container(data)
    try:
        return info_of(container)
    finally:
        container.close()


@dataclass
class Limits:
    """What a header may declare before a file is refused (every limit may be None: no limit)."""

    max_duration: float | None = DEFAULT_MAX_DURATION
    max_pixels: int | None = DEFAULT_MAX_FRAME_PIXELS
    max_sample_rate: int | None = DEFAULT_MAX_SAMPLE_RATE
    max_channels: int | None = DEFAULT_MAX_CHANNELS

    def check(self, info: MediaInfo) -> None:
        """Raise :class:`SizeLimitError` when the header declares more than the limits allow
        (the decompression-bomb guard of media: checked before any frame is decoded)."""
        durations = [d for d in [info.duration, *(s.duration for s in info.streams)] if d is not None]
        if (
            self.max_duration
            and durations
            and (max(durations) > self.max_duration or not all(math.isfinite(d) for d in durations))
        ):
            raise SizeLimitError(
                f"the header declares a duration of {max(durations):,.0f} s, over "
                f"max_duration={self.max_duration:,.0f} s (header guard; nothing decoded)"
            )
        for s in info.streams:
            if s.kind == "video" and self.max_pixels and s.width * s.height > self.max_pixels:
                raise SizeLimitError(
                    f"{s.codec} video of {s.width}x{s.height} pixels per frame exceeds "
                    f"max_pixels={self.max_pixels} (header guard; nothing decoded)"
                )
            if s.kind == "audio":
                if self.max_sample_rate and s.sample_rate > self.max_sample_rate:
                    raise SizeLimitError(
                        f"{s.codec} audio at {s.sample_rate:,} Hz exceeds max_sample_rate="
                        f"{self.max_sample_rate:,} (header guard; nothing decoded)"
                    )
                if self.max_channels and s.channels > self.max_channels:
                    raise SizeLimitError(
                        f"{s.codec} audio with {s.channels} channels exceeds "
                        f"max_channels={self.max_channels} (header guard; nothing decoded)"
                    )


def check_decodes(data: Any, limits: Limits | None = None) -> MediaInfo:
    """Probe, check the limits, then decode every packet of every stream once, strictly: a
    corrupt or truncated file raises :class:`DecodeError` (what ``--check-decode`` runs)."""
    av = import_av()
    container = open_container(data)
    try:
        info = info_of(container)
        (limits or Limits()).check(info)
        if not info.streams:
            raise DecodeError("no video or audio stream")
        streams = [s for s in container.streams if s.type in ("video", "audio")]
        for s in streams:
            s.codec_context.thread_count = 1
            s.codec_context.options = {"err_detect": "explode"}
        seen = {s.index: 0.0 for s in streams}  # where each stream's data ends (a frame's time + duration)
        for packet in container.demux(*streams):
            if packet.pts is not None and packet.duration:
                end = float((packet.pts + packet.duration) * packet.time_base)
                seen[packet.stream_index] = max(seen[packet.stream_index], end)
            for frame in packet.decode():
                if frame.time is not None:
                    seen[packet.stream_index] = max(seen[packet.stream_index], frame.time)
        for s, st in zip(streams, [x for x in info.streams]):
            short = _shortfall(
                st.duration, seen[s.index] - float(s.start_time * s.time_base if s.start_time else 0), st
            )
            if short:
                raise DecodeError(f"truncated {st.kind} stream: {short}")
        return info
    except av.error.FFmpegError as e:
        raise DecodeError(f"corrupt media: {e}") from None
    finally:
        container.close()


def _shortfall(declared: float | None, last_time: float, stream: StreamInfo) -> str | None:
    """A message when the decoded stream ends well before its declared duration."""
    if declared is None or declared <= 0:
        return None
    slack = 2.0 / stream.fps if stream.kind == "video" and stream.fps else 0.25
    if last_time + slack < declared * 0.98:
        return f"it ends at {last_time:.2f} s, its header says {declared:.2f} s"
    return None


# -- one-time re-encode (converters' --transcode) ------------------------------------------------
@dataclass
class Transcode:
    """``--transcode fps=8,size=256,sample_rate=16000,crf=23``: video re-encoded once to H.264
    (mp4) at a fixed frame rate and shorter side, audio tracks and files to the sample rate."""

    fps: float | None = None
    size: int | None = None
    sample_rate: int | None = None
    crf: int = 23

    @classmethod
    def parse(cls, text: str) -> "Transcode":
        """>>> Transcode.parse("fps=8,size=256")
        Transcode(fps=8.0, size=256, sample_rate=None, crf=23)
        """
        out = cls()
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep or name not in ("fps", "size", "sample_rate", "crf"):
                raise ValueError(f"{part!r}: expected fps=N, size=PX, sample_rate=HZ or crf=Q")
            try:
                number = float(value) if name == "fps" else int(value)
            except ValueError:
                raise ValueError(f"{part!r}: {value!r} is not a number") from None
            if number <= 0 or (name == "crf" and number > 51):
                raise ValueError(f"{part!r}: must be more than 0" + (" and at most 51" if name == "crf" else ""))
            setattr(out, name, number)
        if out.fps is None and out.size is None and out.sample_rate is None:
            raise ValueError(f"{text!r}: give at least one of fps=, size=, sample_rate=")
        return out


def _even(n: float) -> int:
    return max(2, int(round(n / 2)) * 2)


def transcode(data: bytes, kind: str, spec: Transcode, max_seconds: float | None = None) -> tuple[bytes, str]:
    """Re-encode once: video -> H.264 mp4 (yuv420p; AAC audio track kept), audio -> FLAC.
    ``max_seconds`` trims the output to the first seconds. Returns (bytes, field name)."""
    av = import_av()
    src = open_container(data)
    out = io.BytesIO()
    try:
        vin = src.streams.video[0] if kind == "video" and src.streams.video else None
        ain = src.streams.audio[0] if src.streams.audio else None
        if vin is None and ain is None:
            raise DecodeError("no stream to transcode")
        dst = av.open(out, "w", format="mp4" if vin is not None else "flac")
        vout = aout = None
        if vin is not None:
            rate = spec.fps or float(vin.average_rate or 25)
            w, h = vin.codec_context.width, vin.codec_context.height
            if spec.size:
                scale = spec.size / min(w, h)
                w, h = _even(w * scale), _even(h * scale)
            codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
            out_rate = Fraction(rate).limit_denominator(1001)
            vout = dst.add_stream(codec, rate=out_rate)
            vout.width, vout.height, vout.pix_fmt = _even(w), _even(h), "yuv420p"
            if codec == "libx264":
                vout.options = {"crf": str(spec.crf), "preset": "medium"}
        if ain is not None:
            rate = spec.sample_rate or ain.codec_context.sample_rate
            aout = dst.add_stream("aac" if vin is not None else "flac", rate=rate)
            aout.layout = "mono" if ain.codec_context.channels == 1 else "stereo"
        n_out = 0
        next_t = 0.0
        for packet in src.demux(*(s for s in (vin, ain) if s is not None)):
            for frame in packet.decode():
                t = frame.time or 0.0
                if max_seconds is not None and t >= max_seconds:
                    continue
                if packet.stream is vin:
                    assert vout is not None  # made with vin
                    # constant frame rate: keep the frame shown at each output tick
                    while t + 1e-6 >= next_t:
                        img = frame.reformat(
                            width=vout.width,
                            height=vout.height,
                            format="yuv420p",
                            interpolation="AREA",
                            **scale_options(av, 1),
                        )
                        img.pts = n_out
                        img.time_base = 1 / out_rate
                        for p in vout.encode(img):
                            dst.mux(p)
                        n_out += 1
                        next_t = float(n_out / out_rate)
                else:
                    assert aout is not None  # an audio packet: made with ain
                    frame.pts = None
                    for p in aout.encode(frame):
                        dst.mux(p)
        for s in (vout, aout):
            if s is not None:
                for p in s.encode(None):
                    dst.mux(p)
        dst.close()
    except (av.error.FFmpegError, ValueError, TypeError, AttributeError) as e:
        raise DecodeError(f"cannot transcode: {type(e).__name__}: {e}") from None
    finally:
        src.close()
    return out.getvalue(), "mp4" if kind == "video" else "flac"
