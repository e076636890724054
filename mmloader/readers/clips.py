"""What video and audio readers share: where a clip starts, and which frame times a clip asks for.

:class:`ClipSource` marks a reader whose clips other readers follow (a video modality's audio
companion takes the same window), so the audio reader needs nothing of the video reader's module
and neither imports the other.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DecodeError
from .base import Reader
from .seeding import rng

if TYPE_CHECKING:
    from ..media.mediainfo import Limits, MediaInfo

CLIPS = ("random", "start", "center")


def check_clip(clip: Any) -> None:
    if isinstance(clip, str):
        if clip not in CLIPS:
            raise ValueError(f"clip={clip!r}: expected one of {', '.join(map(repr, CLIPS))} or seconds")
    elif isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip >= 0 or clip == float("inf"):
        raise ValueError(f"clip={clip!r}: expected one of {', '.join(map(repr, CLIPS))} or seconds >= 0")


def draw(key: str) -> float:
    """Uniform in [0, 1) from the current batch's seed (:func:`mmloader.rng`) and ``key``.

    A function of both, not a draw from a shared sequence: whichever path builds the batch
    (whole-batch, sample by sample after an error) and whichever companion reader asks, one
    sample in one batch gets one position."""
    h = hashlib.blake2b(f"{rng().seed}/{key}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / float(1 << 53)


def clip_start(clip: Any, key: str, room: float) -> float:
    """The clip's first time in seconds: ``room`` is how far it may start (0 when it just fits)."""
    room = max(0.0, room)
    if clip == "start":
        return 0.0
    if clip == "center":
        return room / 2
    if clip == "random":
        return draw(key) * room
    return min(float(clip), room)


class ClipSource(Reader):
    """A reader whose clip positions companions follow (``VideoReader``): an audio reader given
    ``clip=`` one takes the same window of the same sample."""

    # what a companion uses (VideoReader sets and defines them); declarations only
    limits: Limits

    if TYPE_CHECKING:

        def plan(self, info: MediaInfo, key: str, container: Any = None) -> _Plan: ...


class _Plan:
    """The frames a clip asks for. ``times`` (seconds from the stream's start, ascending): with
    ``consecutive`` False, the frame shown at each; with it True, the frame shown at
    ``times[0]`` and the frames decoded after it: ``len(times)`` in all, or (``until`` given)
    every one shown before ``until``."""

    __slots__ = ("times", "consecutive", "until", "step")

    def __init__(self, times: np.ndarray, consecutive: bool = False, until: float | None = None, step: float = 0.0):
        self.times, self.consecutive, self.until = np.asarray(times, dtype=np.float64), consecutive, until
        self.step = step

    @property
    def last(self) -> float:
        """The latest time the clip asks to see (the nominal end of consecutive frames)."""
        return float(self.times[-1]) if self.until is None else max(float(self.times[-1]), self.until)


def _start(stream) -> float:
    return float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0


def _tolerance(stream) -> float:
    """Half the stream's timestamp resolution (0.5 ms in Matroska): a frame stored at the time
    asked, rounded to that resolution, is still the frame shown at it."""
    return float(stream.time_base) / 2 + 1e-9 if stream.time_base else 1e-9


def _seek(container, stream, first_time: float) -> None:
    if first_time > 0:
        target = int((first_time + _start(stream)) / stream.time_base)
        container.seek(target, stream=stream, backward=True, any_frame=False)


def _demux_times(container, stream, plan: _Plan) -> np.ndarray:
    """The presentation times of the frames :func:`~mmloader.readers.video_decode.decode_targets`
    picks, from packet times alone (no decoding)."""
    tb = stream.time_base
    origin = _start(stream)
    tol = _tolerance(stream)
    asked = np.asarray(plan.times, dtype=np.float64)
    count = len(asked) if plan.until is None else None

    def enough(pts: list[float]) -> bool:
        """Every frame the plan needs is known (closed GOPs: none later is shown before them)."""
        if not plan.consecutive:
            return pts[-1] > origin + asked[-1] + tol if pts else False
        ordered = np.sort(pts)
        i0 = max(0, int(np.searchsorted(ordered, origin + asked[0] + tol, side="right")) - 1)
        if count is not None:
            return len(ordered) - i0 > count
        assert plan.until is not None  # count is None only where until is given
        return bool(ordered[-1] >= origin + plan.until - tol)

    def collect(seek: bool) -> list[float] | None:
        if seek:
            _seek(container, stream, float(asked[0]))
        pts: list[float] = []
        seen_keyframe = False
        for packet in container.demux(stream):
            if packet.pts is None:
                continue
            t = float(packet.pts * tb)
            if packet.is_keyframe:
                if not seen_keyframe and seek and t > origin + asked[0] + tol and t > origin + tol:
                    return None
                seen_keyframe = True
                if pts and enough(pts):
                    break
            if seen_keyframe:
                pts.append(t)
        return pts

    pts = collect(True)
    if pts is None:
        container.seek(0, stream=stream, backward=True)
        pts = collect(False)
    if not pts:
        raise DecodeError("no frame in the video stream")
    ordered = np.sort(np.asarray(pts)) - origin
    if not plan.consecutive:
        idx = np.searchsorted(ordered, asked + tol, side="right") - 1
        return ordered[np.clip(idx, 0, None)]
    i0 = max(0, int(np.searchsorted(ordered, asked[0] + tol, side="right")) - 1)
    if count is None:
        assert plan.until is not None  # count is None only where until is given
        rest = ordered[i0:]
        keep = rest[1:][rest[1:] < plan.until - tol]
        return np.concatenate([rest[:1], keep])
    out = ordered[i0 : i0 + count]
    return np.concatenate([out, np.repeat(out[-1:], count - len(out))])
