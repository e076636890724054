"""VideoReader: a clip of N frames from stored video bytes, decoded lazily with PyAV (FFmpeg).

Only what the clip needs is decoded. The demuxer seeks to the keyframe before the clip (the
container's index: mp4 sample tables, Matroska/WebM cues); packets are read group of pictures
(GOP) by GOP, and a GOP that holds no frame of the clip is skipped without decoding (the next
keyframe decodes on its own), so frames far apart cost a seek each, not a decode of everything
between them. Only the chosen frames are converted to RGB, in the same swscale pass that
resizes them (``size=``), never at full resolution first. Nothing is written to a temp file:
FFmpeg reads the bytes from memory.

Frame selection, the same everywhere (the reader, its ``timestamps`` companion, its ``audio``
companion), on the container's own timestamps whatever their time base (mp4: often 1/15360 s,
Matroska/WebM: milliseconds), in presentation order. ``t0`` comes from ``clip``: ``"start"``
(0), ``"center"``, a number of seconds, or ``"random"``: uniform over the positions where the
clip fits, drawn from the batch's seed (:func:`mmloader.rng`) and the sample's key, so it is the
same on both backends, for any worker count, after a resume, and for the companions of one
reader; another epoch draws another position. The first frame is the one *shown* at ``t0``.

* ``fps=None``: that frame and the next ``frames - 1`` decoded frames, consecutive whatever the
  spacing (constant or variable frame rate); with ``frames=None``, every frame shown before
  ``max_seconds``.
* ``fps=k``: for each asked time ``t0 + j / k``, the frame shown at that time: the last one whose
  presentation time is <= it, give or take half the stream's timestamp resolution (a 30 fps frame
  2 stored at 67 ms in Matroska is the frame shown at 2/30 s = 66.7 ms, not the one before).
  Where a variable-rate video holds one frame longer than ``1 / k``, that frame repeats.

The ``timestamps`` companion reports each returned frame's own presentation time as stored
(seconds from the stream's start), not the time asked: uneven for variable-rate video, in
millisecond steps for Matroska, and repeated with a repeated frame.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch

from ..errors import DecodeError, SampleError, SizeLimitError
from ..media.mediainfo import (
    DEFAULT_MAX_DURATION,
    DEFAULT_MAX_FRAME_PIXELS,
    VIDEO_EXTENSIONS,
    Limits,
    MediaInfo,
    import_av,
    info_of,
    open_container,
    scale_options,
)
from ..storage import Store
from .audio import AudioReader
from .base import Reader
from .clips import ClipSource, _demux_times, _Plan, _start, check_clip, clip_start
from .video_decode import Overshoot, check_not_truncated, decode_targets

#: swscale's area averaging: antialiased when shrinking (what a resize for training wants), and
#: measured here at 0.49 ms per 480p frame to 224x224 against 0.59 ms for bilinear.
INTERPOLATION = "AREA"


class VideoReader(ClipSource):
    """A video field as a uint8 ``(T, C, H, W)`` tensor of ``frames`` RGB frames, in channels-last
    memory (``(T, H, W, C)``, as decoded; ``.contiguous()`` gives planar frames).

    ``fps``: the clip's frame rate (None: the video's own, i.e. consecutive frames).
    ``clip``: where the clip starts: ``"random"`` (default), ``"start"``, ``"center"`` or
    seconds. ``size``: ``(height, width)`` (stacks into ``(B, T, C, H, W)``), or an int for the
    shorter side (aspect kept: batches of several aspect ratios are padded, with a mask).
    ``max_seconds``: only the first seconds of a video are used; with ``frames=None`` every frame
    of them is returned (at ``fps``), so ``T`` varies and batches pad it, with a mask.
    A video shorter than the clip gives its last frame for the times past its end.

    Companions, zipped beside it under names of your choice: ``reader.timestamps`` (float64
    ``(T,)`` presentation times of the frames, in seconds) and, with ``audio=dict(...)``
    (:class:`AudioReader` options), ``reader.audio``: the file's own audio track over the clip's
    time span, from the first frame's time for ``T * step`` seconds.

    ``threads``: FFmpeg threads that decode and scale a clip (default 1: the loader's workers are
    the parallelism; 0: FFmpeg's choice, a thread per CPU in every worker).

    Guards, from the header before decoding: ``max_duration`` (seconds), ``max_pixels`` (per
    frame). Corrupt or truncated data is a :class:`DecodeError` naming key and field.

    >>> video = VideoReader("clips.lmdb", "mp4", frames=8, fps=4, size=(224, 224),
    ...                     audio=dict(sample_rate=16000))                       # doctest: +SKIP
    >>> ds = mmloader.zip(video=video, audio=video.audio, times=video.timestamps,
    ...                   caption=mmloader.TextReader("clips.lmdb"))              # doctest: +SKIP
    """

    default_field = "mp4"
    field_extensions = VIDEO_EXTENSIONS
    releases_gil = True  # FFmpeg decodes and converts without the GIL
    python_per_sample = True  # but PyAV calls into it per packet: processes measured faster
    decoder = "pyav"

    def __init__(
        self,
        source: str | os.PathLike | Store,
        field: str | None = None,
        *,
        frames: int | None = 8,
        fps: float | None = None,
        clip: Any = "random",
        size: int | Sequence[int] | None = None,
        max_seconds: float | None = None,
        audio: dict | None = None,
        max_duration: float | None = DEFAULT_MAX_DURATION,
        max_pixels: int | None = DEFAULT_MAX_FRAME_PIXELS,
        threads: int = 1,
        transform: Callable[[Any], Any] | None = None,
        decode: Callable | None = None,
        **kwargs,
    ):
        if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 1):
            raise ValueError(f"frames={frames!r}: expected a positive int, or None (every frame of max_seconds)")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < 1e4):
            raise ValueError(f"fps={fps!r}: expected a positive number or None (the video's own rate)")
        check_clip(clip)
        if size is not None:
            sizes = (size,) if isinstance(size, int) else tuple(size)
            if len(sizes) not in (1, 2) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
                raise ValueError(f"size={size!r}: expected a positive int (shorter side) or (height, width)")
            size = sizes[0] if len(sizes) == 1 and isinstance(size, int) else sizes
        if max_seconds is not None and (
            isinstance(max_seconds, bool)
            or not isinstance(max_seconds, (int, float))
            or not 0 < max_seconds < float("inf")
        ):
            raise ValueError(f"max_seconds={max_seconds!r}: expected a positive number or None")
        if frames is None and max_seconds is None:
            raise ValueError("frames=None (every frame) needs max_seconds: a long video would be decoded whole")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads={threads!r}: expected an int >= 0 (0: FFmpeg's choice)")
        if audio is not None and not isinstance(audio, dict):
            raise ValueError(f"audio={audio!r}: expected a dict of AudioReader options, e.g. dict(sample_rate=16000)")
        super().__init__(source, field, transform=transform, decode=decode, **kwargs)
        self.frames, self.fps, self.clip, self.size, self.max_seconds = frames, fps, clip, size, max_seconds
        self.limits = Limits(max_duration=max_duration, max_pixels=max_pixels)
        self.threads = threads
        self._audio_options = audio
        self._audio: Reader | None = None
        if self._decode_fn is None:
            import_av()  # fail here, naming the extra, not at the first sample

    # -- companions -----------------------------------------------------------
    @property
    def timestamps(self) -> "VideoTimestamps":
        """A reader of the frames' presentation times (float64 ``(T,)``, seconds), found by
        demuxing only: zip it beside this reader."""
        return VideoTimestamps(self)

    @property
    def audio(self) -> Reader:
        """The audio track over this reader's clip (an :class:`AudioReader` with ``clip=`` this
        reader and the options given as ``audio=``)."""
        if self._audio is None:
            self._audio = AudioReader(
                self.store, self.field, clip=self, **(self._audio_options if self._audio_options is not None else {})
            )
        return self._audio

    # -- planning a clip (header and demuxing only) ----------------------------
    def targets(self, info: MediaInfo, key: str, container=None) -> tuple[np.ndarray, float]:
        """(times in seconds from the stream's start, step) of the frames to return: the asked
        times with ``fps=k``; with ``fps=None``, ``times[0]`` is where the consecutive frames
        start and the rest are nominal (at the average rate: what the audio companion spans).

        With ``fps=None`` a clip fits in frames, not seconds: given the open ``container``, the
        latest start is the time of the ``frames``-th frame from the end (found by demuxing the
        last GOPs), so a start always leaves ``frames`` real frames, whatever the spacing."""
        v = info.video
        assert v is not None  # a video stream: checked as the file is opened
        duration = v.duration if v.duration is not None else info.duration
        native = v.fps or 25.0
        step = 1.0 / (self.fps or native)
        usable = duration if duration is not None else float(self.max_seconds or 0.0)
        if self.max_seconds is not None:
            usable = min(usable, float(self.max_seconds)) if duration is not None else float(self.max_seconds)
        if self.frames is None:
            count = max(1, int(np.ceil(usable / step - 1e-9)))
            return np.arange(count) * step, step
        room = usable - self.frames * step if duration is not None else 0.0
        if self.fps is None and duration is not None and container is not None and self.clip != "start":
            latest = _last_start(container, container.streams.video[0], self.frames, duration, step)
            room = latest if self.max_seconds is None else min(latest, float(self.max_seconds) - self.frames * step)
        t0 = clip_start(self.clip, key, room)
        return t0 + np.arange(self.frames) * step, step

    def plan(self, info: MediaInfo, key: str, container=None) -> "_Plan":
        """What :func:`~mmloader.readers.video_decode.decode_targets` and :func:`_demux_times` look
        for (``container``: see :meth:`targets`)."""
        times, step = self.targets(info, key, container)
        if self.fps is not None:
            return _Plan(times, step=step)
        until = None
        if self.frames is None:
            assert self.max_seconds is not None  # __init__: frames=None needs max_seconds
            until = float(self.max_seconds)
        return _Plan(times, consecutive=True, until=until, step=step)

    def _open(self, data, key: str):
        container = open_container(data)
        try:
            info = info_of(container)
            if info.video is None:
                raise DecodeError(f"no video stream ({info.describe()})")
            self.limits.check(info)
            stream = container.streams.video[0]
            return container, stream, info
        except BaseException:
            container.close()
            raise

    # -- decoding -------------------------------------------------------------
    def decode(self, data, key: str) -> Any:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        return self.decode_clip(data, key)[0]

    def decode_clip(self, data, key: str) -> tuple[torch.Tensor, np.ndarray]:
        """(frames uint8 ``(T, C, H, W)``, their presentation times in seconds)."""
        av = import_av()
        container, stream, info = self._open(data, key)
        try:
            plan = self.plan(info, key, container)
            v = info.video
            hw = self._output_hw(v.height, v.width)
            scale = scale_options(av, self.threads)  # (PyAV's default, a thread per CPU, hung a forked worker)
            convert = lambda frame: frame.reformat(
                width=hw[1],
                height=hw[0],
                format="rgb24",  # noqa: E731
                interpolation=INTERPOLATION,
                **scale,
            ).to_ndarray()
            try:
                chosen, reached = decode_targets(container, stream, plan, self.threads, convert)
            except Overshoot:  # the seek landed after the clip: read from the start instead
                container.close()
                container, stream, info = self._open(data, key)
                chosen, reached = decode_targets(container, stream, plan, self.threads, convert, seek=False)
            shown = np.array([t for t, _ in chosen], dtype=np.float64)
            check_not_truncated(reached, plan, info)
            if len({a.shape for _, a in chosen}) != 1:
                raise DecodeError(
                    "the frames of the clip differ in size (a resolution change mid-stream): give size=(height, width)"
                )
            # (T, H, W, C) as swscale writes it, seen as (T, C, H, W): channels-last memory, the
            # layout batches keep (collate) and GPUs prefer; a planar copy (torch's permute-copy)
            # was 8 ms of a consecutive 8-frame 480p clip's 42 ms of CPU (cProfile)
            return torch.from_numpy(np.stack([a for _, a in chosen])).permute(0, 3, 1, 2), shown
        except av.error.FFmpegError as e:
            raise DecodeError(f"corrupt video: {e}") from None
        finally:
            container.close()

    def _output_hw(self, height: int, width: int) -> tuple[int, int]:
        if self.size is None:
            return height, width
        if isinstance(self.size, int):
            from .image_decode import target_hw

            return target_hw(self.size, height, width)
        return cast("tuple[int, int]", tuple(self.size))  # size as given: checked in __init__

    def frame_times(self, data, key: str) -> np.ndarray:
        """The presentation times of the frames :meth:`decode` returns, by demuxing only."""
        av = import_av()
        container, stream, info = self._open(data, key)
        try:
            return _demux_times(container, stream, self.plan(info, key, container))
        except av.error.FFmpegError as e:
            raise DecodeError(f"corrupt video: {e}") from None
        finally:
            container.close()

    def describe_decoder(self) -> str:
        return "pyav (FFmpeg)"


def _last_start(container, stream, count: int, duration: float, step: float) -> float:
    """The time (seconds from the stream's start) of the ``count``-th frame from the end, by
    demuxing from a keyframe before the end (further back until ``count`` frames are seen); 0 when
    the stream holds fewer. The demuxer is left back at the stream's start."""
    tb = stream.time_base
    origin = _start(stream)
    back = 2 * count * step + 1.0
    try:
        while True:
            at = max(0.0, duration - back)
            container.seek(
                int((at + origin) / tb) if at > 0 else (stream.start_time or 0),
                stream=stream,
                backward=True,
                any_frame=False,
            )
            pts: list[int] = []
            first = None
            for packet in container.demux(stream):
                if packet.pts is None or (first is None and not packet.is_keyframe):
                    continue
                first = packet.pts if first is None else first
                if packet.pts >= first:  # an open GOP's leading frames belong before the keyframe
                    pts.append(packet.pts)
            if len(pts) >= count or at <= 0 or first is None or float(first * tb) - origin <= 0:
                break
            back *= 4
    finally:
        container.seek(stream.start_time or 0, stream=stream, backward=True, any_frame=False)
    if len(pts) < count:
        return 0.0
    pts.sort()
    return float(pts[-count] * tb) - origin


class VideoTimestamps(Reader):
    """The presentation times (float64 ``(T,)``, seconds) of the frames a :class:`VideoReader`
    returns for the same sample: its ``timestamps`` companion. Found by demuxing (no decoding)."""

    releases_gil = True
    python_per_sample = True  # PyAV reads packet headers in Python

    def __init__(self, video: VideoReader):
        super().__init__(video.store, video.field, max_field_bytes=video.max_field_bytes)
        self.video = video

    def decode(self, data, key: str) -> torch.Tensor:
        return torch.from_numpy(self.video.frame_times(data, key))

    def __reduce__(self):
        return VideoTimestamps, (self.video,)


__all__ = ["VideoReader", "VideoTimestamps", "SizeLimitError", "SampleError"]
