"""Small real media files made with PyAV (FFmpeg's encoders) for the tests: a few seconds, a few
dozen pixels, so every test is fast. Every frame differs (a bar moves and the background level
follows the frame number), so a wrong frame cannot pass for the right one."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

VIDEO_CODECS = {"mp4": "libx264", "mkv": "libx264", "webm": "libvpx-vp9", "mov": "mpeg4"}
AUDIO_CODECS = {"flac": "flac", "wav": "pcm_s16le", "mp3": "libmp3lame", "m4a": "aac", "opus": "libopus"}
CONTAINER = {
    "mp4": "mp4",
    "mkv": "matroska",
    "webm": "webm",
    "mov": "mov",
    "flac": "flac",
    "wav": "wav",
    "mp3": "mp3",
    "m4a": "mp4",
    "opus": "ogg",
    "ogg": "ogg",
}


def frame_image(i: int, width: int, height: int) -> np.ndarray:
    img = np.empty((height, width, 3), np.uint8)
    img[:] = (40 + (i * 7) % 180, 90, 200 - (i * 5) % 150)
    x = (i * 3) % max(1, width - 8)
    img[:, x : x + 8] = (250, 250, 30)
    img[(i * 2) % max(1, height - 4) : (i * 2) % max(1, height - 4) + 4, :] = (10, 200, 10)
    return img


def signal(seconds: float, rate: int, channels: int, freq: float = 440.0) -> np.ndarray:
    """float32 (C, N): a tone plus a slow chirp; channel c at amplitude 1/(c+1)."""
    t = np.arange(int(round(seconds * rate))) / rate
    x = 0.3 * np.sin(2 * np.pi * freq * t) + 0.2 * np.sin(2 * np.pi * (150 + 200 * t) * t)
    return np.stack([x / (c + 1) for c in range(channels)]).astype(np.float32)


def _encode_audio(container, stream, x: np.ndarray, rate: int) -> None:
    import av

    layout = "mono" if x.shape[0] == 1 else "stereo"
    step = 1024
    for i in range(0, x.shape[1], step):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + step]), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts = i
        frame.time_base = Fraction(1, rate)
        for p in stream.encode(frame):
            container.mux(p)
    for p in stream.encode(None):
        container.mux(p)


def make_video(
    ext: str = "mp4",
    seconds: float = 2.0,
    fps: int = 15,
    width: int = 64,
    height: int = 48,
    keyint: int = 10,
    audio_rate: int | None = None,
    bframes: bool = True,
    audio_codec: str | None = None,
) -> bytes:
    """A small video (and, with ``audio_rate``, a stereo track of :func:`signal`: AAC, or Opus in
    WebM, or ``audio_codec``)."""
    import av

    out = io.BytesIO()
    c = av.open(out, "w", format=CONTAINER[ext])
    codec = VIDEO_CODECS[ext]
    s = c.add_stream(codec, rate=fps)
    s.width, s.height, s.pix_fmt = width, height, "yuv420p"
    s.codec_context.gop_size = keyint
    if codec == "libx264":
        s.options = {
            "preset": "veryfast",
            "bf": "2" if bframes else "0",
            "sc_threshold": "0",
            "keyint_min": str(keyint),
        }
    elif codec == "libvpx-vp9":
        s.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
    a = None
    if audio_rate:
        acodec = audio_codec or ("libopus" if ext == "webm" else "aac")
        a = c.add_stream(acodec, rate=48000 if acodec == "libopus" else audio_rate)
        a.layout = "stereo"
        if acodec == "vorbis":
            a.codec_context.options = {"strict": "-2"}  # FFmpeg's own Vorbis encoder is "experimental"
    for i in range(int(seconds * fps)):
        frame = av.VideoFrame.from_ndarray(frame_image(i, width, height), format="rgb24")
        frame.pts = i
        frame.time_base = Fraction(1, fps)
        for p in s.encode(frame):
            c.mux(p)
    for p in s.encode(None):
        c.mux(p)
    if a is not None:
        rate = a.codec_context.sample_rate
        _encode_audio(c, a, signal(seconds, rate, 2), rate)
    c.close()
    return out.getvalue()


def make_audio(
    ext: str = "flac", seconds: float = 2.0, rate: int = 44100, channels: int = 2, freq: float = 440.0
) -> bytes:
    """A small audio file of :func:`signal`; Ogg Vorbis through libsndfile (FFmpeg's own Vorbis
    encoder is experimental)."""
    x = signal(seconds, rate, channels, freq)
    if ext == "ogg":
        import soundfile as sf

        buf = io.BytesIO()
        sf.write(buf, x.T, rate, format="OGG", subtype="VORBIS")
        return buf.getvalue()
    import av

    out = io.BytesIO()
    c = av.open(out, "w", format=CONTAINER[ext])
    s = c.add_stream(AUDIO_CODECS[ext], rate=rate if ext != "opus" else 48000)
    s.layout = "mono" if channels == 1 else "stereo"
    if ext == "opus":
        x = signal(seconds, 48000, channels, freq)
        rate = 48000
    _encode_audio(c, s, x, rate)
    c.close()
    return out.getvalue()


def index_image(i: int, width: int = 32, height: int = 32) -> np.ndarray:
    """Frame ``i`` with its index in the pixels: the top half's level is ``i % 16``, the bottom
    half's ``i // 16`` (steps of 14 levels, far wider than a codec's error on flat areas)."""
    img = np.empty((height, width, 3), np.uint8)
    img[: height // 2] = 16 + 14 * (i % 16)
    img[height // 2 :] = 16 + 14 * (i // 16)
    return img


def read_index(img: np.ndarray) -> int:
    """The frame index :func:`index_image` drew, from an (H, W, 3) or (3, H, W) decoded frame."""
    a = np.asarray(img, dtype=np.float64)
    if a.shape[0] == 3 and a.shape[-1] != 3:
        a = a.transpose(1, 2, 0)
    h = a.shape[0]
    top, bottom = a[h // 8 : h * 3 // 8].mean(), a[h * 5 // 8 : h * 7 // 8].mean()
    return int(round((top - 16) / 14)) + 16 * int(round((bottom - 16) / 14))


def make_indexed_video(
    ext: str,
    fps: float = 30,
    frames: int = 24,
    times: list[Fraction] | None = None,
    bframes: bool = True,
    keyint: int = 12,
    start: Fraction = Fraction(0),
    open_gop: bool = False,
) -> bytes:
    """A 32x32 video whose frame ``i`` shows its index (:func:`index_image`), at ``i / fps``
    seconds (29.97: ``30000/1001``), or at ``times`` (seconds, exact fractions: variable rate),
    the first at ``start``. H.264 in mp4/mkv/mov (``bframes``: two B-frames between references,
    or none; ``open_gop``: x264's open GOPs, three B-frames, so every keyframe after the first is
    a recovery point whose leading B-frames reference the GOP before), VP9 in WebM."""
    import av

    out = io.BytesIO()
    c = av.open(out, "w", format=CONTAINER[ext])
    rate = Fraction(fps).limit_denominator(1001)
    tb = Fraction(1, 1000) if times is not None else 1 / rate  # a phone's VFR: millisecond times
    codec = "libvpx-vp9" if ext == "webm" else "libx264"
    s = c.add_stream(codec, rate=rate)
    s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
    s.codec_context.gop_size = keyint
    if times is not None:
        s.codec_context.time_base = tb
    if codec == "libx264":
        s.options = {
            "preset": "ultrafast",
            "bf": "2" if bframes else "0",
            "sc_threshold": "0",
            "keyint_min": str(keyint),
            "crf": "18",
        }
        if open_gop:
            s.options["x264-params"] = f"open-gop=1:keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes=3:b-adapt=0"
    else:
        s.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
    stamps = (
        [int((t + start) / tb) for t in times] if times is not None else [i + int(start / tb) for i in range(frames)]
    )
    for i, pts in enumerate(stamps):
        frame = av.VideoFrame.from_ndarray(index_image(i), format="rgb24")
        frame.pts, frame.time_base = pts, tb
        for p in s.encode(frame):
            c.mux(p)
    for p in s.encode(None):
        c.mux(p)
    c.close()
    return out.getvalue()


def decode_indexed(data: bytes) -> list[tuple[float, int]]:
    """The reference: PyAV decoding every frame, in presentation order: (time in seconds from the
    stream's start, the index its pixels show)."""
    import av

    c = av.open(io.BytesIO(data))
    s = c.streams.video[0]
    start = float(s.start_time * s.time_base) if s.start_time is not None else 0.0
    out = sorted((float(f.pts * s.time_base) - start, read_index(f.to_ndarray(format="rgb24"))) for f in c.decode(s))
    c.close()
    return out


def decode_all_video(data: bytes, size: tuple[int, int] | None = None) -> dict[float, np.ndarray]:
    """The reference: PyAV decoding the whole file, every frame, by presentation time."""
    import av

    c = av.open(io.BytesIO(data))
    s = c.streams.video[0]
    start = float(s.start_time * s.time_base) if s.start_time is not None else 0.0
    out = {}
    for f in c.decode(s):
        if size is None:
            img = f.to_ndarray(format="rgb24")
        else:
            img = f.reformat(width=size[1], height=size[0], format="rgb24", interpolation="AREA").to_ndarray()
        out[round(f.time - start, 6)] = img
    c.close()
    return out


def decode_all_audio(data: bytes) -> tuple[np.ndarray, int]:
    """The reference: PyAV decoding the whole first audio stream, float32 (C, N) at its own rate."""
    import av

    c = av.open(io.BytesIO(data))
    s = c.streams.audio[0]
    parts = []
    for f in c.decode(s):
        a = f.to_ndarray()
        if not f.format.is_planar:
            a = a.reshape(-1, len(f.layout.channels)).T
        if f.format.name.startswith("s16"):
            a = a.astype(np.float32) / 32768
        parts.append(a.astype(np.float32))
    rate = s.codec_context.sample_rate
    c.close()
    return np.concatenate(parts, 1), rate
