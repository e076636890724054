"""The decoding of a planned clip's frames from an open container with PyAV: GOP by GOP, skipping
what shows no frame asked for, tolerant of an open GOP's missing references, checked for
truncation. Apart from :mod:`.video`, which plans the clip and shapes the frames, since this is
the one part that drives FFmpeg's decoder packet by packet."""

from __future__ import annotations

import bisect
from typing import Any, Callable

from ..errors import DecodeError
from ..media.mediainfo import MediaInfo, import_av
from .clips import _Plan, _seek, _start, _tolerance


class Overshoot(Exception):
    """The keyframe the demuxer seeked to lies after the first asked time."""


#: What a decoder that starts at a keyframe after a seek (or a skipped GOP) may report for the
#: pictures it never saw: an open GOP's recovery point (x264 ``open-gop``) is followed by leading
#: B-frames that reference the previous GOP, and the frames after it may unmark (MMCO) pictures
#: of that GOP. Only these are let through, and only in the first GOP after a fresh start.
_MISSING_REFERENCE = (
    "mmco: unref short failure",
    "mmco: unref long failure",
    "reference picture missing during reorder",
    "missing reference picture",
    "reference count overflow",
    "co located pocs unavailable",
    "could not find ref with poc",
)
#: Of those, what a frame shown from the keyframe on may report without its pixels being wrong:
#: unmarking a picture from before the keyframe changes no sample.
_UNMARK = ("mmco: unref short failure", "mmco: unref long failure")


def _missing_reference(error, leading: bool) -> bool:
    """``error`` (from sending a packet of the first GOP after a fresh start) is a reference the
    decoder never saw, not damage: any of :data:`_MISSING_REFERENCE` for a leading frame (shown
    before its keyframe, never chosen), only an unmarking for the others."""
    log = getattr(error, "log", None)
    message = str(log[2]).strip().lower() if isinstance(log, tuple) and len(log) >= 3 else ""
    return bool(message) and any(m in message for m in (_MISSING_REFERENCE if leading else _UNMARK))


def decode_targets(
    container, stream, plan: _Plan, threads: int, convert: Callable, seek: bool = True
) -> tuple[list[tuple[float, Any]], float | None]:
    """The frames ``plan`` asks for, decoding only what they need: GOPs (a keyframe and the
    packets up to the next) that show none of them are skipped; in the others, decoding stops
    after the last frame needed, and a non-reference frame is not decoded when a later frame of
    its GOP is shown before the next time needed (``skip_frame``).

    Returns ``([(time, convert(frame)), ...], reached)``: a frame is converted when it is chosen,
    while the decoder still holds it, and once however many times it repeats. ``reached`` is None
    when the clip was complete before the end of the data was read, else the end (seconds from
    the start: the latest packet time plus its duration) of what the stream holds."""
    av = import_av()
    cc = stream.codec_context
    cc.thread_count = threads
    cc.options = {"err_detect": "explode"}  # corrupt data raises instead of being concealed
    tb = stream.time_base
    # comparisons in float seconds (a Fraction product per frame and packet was 7% of a clip's
    # CPU); ulp differences sit far inside the tolerance; reported times stay exact
    tbf = float(tb)
    origin = _start(stream)
    tol = _tolerance(stream)
    pending = [origin + float(t) for t in plan.times]  # absolute seconds, ascending
    until = origin + plan.until if plan.until is not None else None
    count = None if until is not None else len(pending)
    chosen: list[tuple[float, Any]] = []
    last: list = [None, None]  # the last decoded frame (shown up to the next one), converted or None
    state: dict[str, Any] = {"fed": False, "skipping": False, "started": False, "end": None, "stop": False}

    def done() -> bool:
        if plan.consecutive:
            return state["stop"] or (count is not None and len(chosen) >= count)
        return len(chosen) == len(pending)

    def need() -> float:
        """The earliest presentation time still needed (-inf: every frame from here on)."""
        if plan.consecutive:
            return -float("inf") if state["started"] else pending[0]
        return pending[len(chosen)]

    def choose(frame, converted: list) -> tuple[float, Any]:
        if converted[0] is None:
            converted[0] = (float(frame.pts * tb) - origin, convert(frame))
        return converted[0]

    def take(frame) -> None:
        """Consecutive frames: ``frame`` is the next one, unless the clip is complete."""
        t = frame.pts * tbf
        if until is not None and chosen and t >= until - tol:
            state["stop"] = True
        elif not done():
            chosen.append(choose(frame, [None]))

    def on_frame(frame) -> None:
        if frame.pts is None or done():
            return
        t = frame.pts * tbf  # frame.time is unset on frames a drain hands out
        if plan.consecutive:
            if state["started"]:
                take(frame)
            elif pending[0] < t - tol:  # the frame before this one is the one shown at t0
                state["started"] = True
                if last[0] is not None:
                    chosen.append(choose(last[0], last[1]))
                take(frame)
            last[0], last[1] = frame, [None]
            return
        while len(chosen) < len(pending) and pending[len(chosen)] < t - tol:
            if last[0] is None:  # asked before the first frame: the first frame
                last[0], last[1] = frame, [None]
            chosen.append(choose(last[0], last[1]))
        last[0], last[1] = frame, [None]

    def drain(flush: bool = True) -> None:
        if state["fed"]:
            for frame in cc.decode(None):
                on_frame(frame)
            if flush:
                cc.flush_buffers()
                state["fed"] = False

    def send(p, fresh: bool, keyframe_pts) -> list:
        try:
            return cc.decode(p)
        except av.error.InvalidDataError as e:
            # err_detect=explode also raises for the references a decoder that starts at this
            # keyframe never saw (an open GOP): only those, only here, are not damage
            if fresh and _missing_reference(
                e, leading=p.pts is not None and keyframe_pts is not None and p.pts < keyframe_pts
            ):
                return []
            raise

    def feed(gop: list, next_keyframe: float) -> None:
        shown = sorted(p.pts * tbf for p in gop if p.pts is not None)
        fresh = not state["fed"]  # the decoder starts at this GOP's keyframe
        for p in gop:
            if done() or need() + tol >= next_keyframe:
                break  # what is left of this GOP shows no frame asked for
            # skippable: a later frame of this GOP is shown before the next time needed
            later = bisect.bisect_right(shown, p.pts * tbf) if p.pts is not None else len(shown)
            far = later < len(shown) and shown[later] <= need()
            if far != state["skipping"]:
                cc.skip_frame = "NONREF" if far else "DEFAULT"
                state["skipping"] = far
            for frame in send(p, fresh, gop[0].pts):
                on_frame(frame)
            state["fed"] = True
        if not done() and need() + tol >= next_keyframe:
            drain()  # the next frame asked for is in a later GOP: start that one fresh

    if seek:
        _seek(container, stream, float(plan.times[0]))
    gop: list = []
    seen_keyframe = False
    for packet in container.demux(stream):
        if packet.size == 0 and packet.pts is None:
            continue  # the demuxer's end-of-stream marker
        if packet.pts is not None:
            end = float((packet.pts + (packet.duration or 0)) * tb)
            state["end"] = end if state["end"] is None else max(state["end"], end)
        if packet.is_keyframe and packet.pts is not None:
            k_time = float(packet.pts * tb)
            if not seen_keyframe and seek and k_time > pending[0] + tol and k_time > origin + tol:
                raise Overshoot()
            seen_keyframe = True
            if gop:
                feed(gop, k_time)
                if done():
                    return chosen, None
            gop = [packet]
        elif seen_keyframe:
            gop.append(packet)
        # packets before the first keyframe cannot be decoded on their own: dropped
    if gop:
        feed(gop, float("inf"))
    if not done():
        drain(flush=False)  # the frames still inside the decoder; the last one stays valid
    if last[0] is None:
        raise DecodeError("no frame could be decoded")
    if plan.consecutive and not chosen:  # t0 at or after the last frame: that frame
        chosen.append(choose(last[0], last[1]))
    target = len(pending) if count is None or not plan.consecutive else count
    if not plan.consecutive or count is not None:
        while len(chosen) < target:  # past the end: the last frame repeats
            chosen.append(choose(last[0], last[1]))
    reached = None if state["end"] is None else state["end"] - origin
    return chosen, reached


def check_not_truncated(reached: float | None, plan: _Plan, info: MediaInfo) -> None:
    """The clip read to the end of the data, and the data ends before the stream's declared
    duration: truncated (a cut file loses its last frames, and with B-frames also frames shown
    before the last one it holds, so neither the frames found nor a repeated last frame can be
    trusted). A long gap between frames of a stream that reaches its declared end is not.

    With the stream's own duration (mp4's track, Matroska's track tag) the end must be reached to
    within half a frame; with only the container's (which may be an audio track's), the clip's
    nominal end must be, to within two frames."""
    v = info.video
    assert v is not None  # a video stream: checked as the file is opened
    if reached is None:
        return
    period = 1.0 / (v.fps or 25.0)
    if v.duration is not None:
        if reached + period / 2 + 2e-3 < v.duration:
            raise DecodeError(
                f"truncated video: the stream ends at {reached:.3f} s, its header says "
                f"{v.duration:.3f} s (the clip asks for {plan.last:.2f} s)"
            )
        return
    declared = info.duration
    if declared is not None and reached + 2 * period + 1e-6 < min(plan.last, declared):
        raise DecodeError(
            f"truncated video: the stream ends at {reached:.2f} s, the clip asks for "
            f"{plan.last:.2f} s and the header says {declared:.2f} s"
        )
