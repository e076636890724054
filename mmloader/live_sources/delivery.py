"""The ranks' agreement over a live pass, in the training process: each batch is delivered only
once every rank has one, and every rank ends the pass at one step, saying why in words. Apart
from :mod:`.stream`, which plans the pass: this is the loop around :func:`.agree.agree`."""

from __future__ import annotations

import logging
import sys
from typing import Any, Iterator

from ..errors import LiveSourceError
from .agree import ENDED, FAILED, READY, agree, agreement_group

log = logging.getLogger("mmloader")


def deliver(stream: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """:meth:`mmloader.LiveStream.deliver` of ``stream``: the batches of this pass, each only
    once every rank has one. A rank that leaves the pass early (a ``break``) says so to the
    others, which end it at the same step rather than wait for it."""
    rank, world = stream.where()
    group = agreement_group(stream.group) if world > 1 else None
    uncapped = stream._uncapped()
    total = stream._capped(uncapped)
    stream.slices.delivered, stream.ended = 0, None
    _warn_steps_cut(stream, total, uncapped)
    expected, last_short = 0, None
    try:
        while expected < total:
            code, error, batch, info, why = READY, None, None, None, ""
            try:
                batch, info = next(batches)
                if info.get("ended"):
                    code, why = ENDED, _why_ended(stream, info)
                elif info["step"] != expected:  # a reader ended: later steps must not go first
                    code, why = ENDED, f"a reader of the source ended before batch {expected + 1} of the pass"
            except StopIteration:  # the readers' last batches were short: the last one says why
                code, why = (
                    ENDED,
                    (
                        _why_ended(stream, {**last_short, "ended": last_short["short"]})
                        if last_short is not None
                        else "its readers ran out of samples or waited too long for one"
                    ),
                )
            except Exception as e:
                code, error = FAILED, e
            agreed, who = agree(code, group, world, rank)
            if agreed == READY:
                assert info is not None  # (READY: this rank had a batch, with its info)
                last_short = info if info.get("short") else last_short
                stream.slices.record(info)
                expected += 1
                yield batch
                continue
            if error is not None:
                raise error
            if agreed == FAILED:
                raise LiveSourceError(
                    f"live source {stream.live_name!r}: the loader of rank {who} failed (its error is in its "
                    f"log); rank {rank} ends its pass too, after {expected} batches"
                )
            stream.ended = (
                f"on rank {who}, {why}"
                if who == rank
                else f"rank {who}'s source ran out, waited too long for a sample, or its loop left the pass"
                " (its log says which)"
            )
            normal_end = stream.steps is None and who == rank and "ran out of samples" in why
            (log.info if normal_end else log.warning)(  # a pass without steps= ends with its source
                "live source %r: every rank ends this pass after %d of %s batches, together so that no "
                "rank waits for another: %s%s",
                stream.live_name,
                expected,
                total if total != sys.maxsize else "unbounded",
                stream.ended,
                "; the stored part's epoch goes on in the next pass, unless set_epoch chooses another"
                if stream.stored is not None
                else "",
            )
            return
    except GeneratorExit:
        if group is not None and expected < total:  # left early: the others must not wait for us
            agree(ENDED, group, world, rank)
        raise
    finally:
        # The thread backend's readers first (workers' die with them): a producer waiting in
        # one returns at once, so stopping the backend's producers waits for none of them.
        stream.slices.close_readers()
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        stream.slices.end_pass()  # its next pass starts sources that cannot say where they are


def _why_ended(stream: Any, info: dict) -> str:
    """What happened to the reader that could not fill its batch, and what to do, in words."""
    rank, part = info["slice"].split("/")
    if getattr(stream.source, "split", None) == "deal":  # one stream, dealt to every reader
        reader = f"the source's one stream (dealt to the readers; here rank={rank}, worker={part}'s turn)"
    else:
        reader = f"the source's reader for rank={rank}, worker={part} (what it yields for those arguments)"
    at = f"batch {info['step'] + 1} of the pass"
    if info["ended"] == "stalled":
        return (
            f"{reader} got no sample for {stream.source.timeout:g} s at {at} (the source's timeout=): "
            "its producer is slow or stuck; give live(..., timeout=) more seconds, or on_stall='raise' "
            "to fail instead of ending the pass"
        )
    if stream.steps is None:  # a pass that runs until the source ends: nothing to mend
        return f"{reader} ran out of samples at {at} (its iterable ended, or its queue closed)"
    more = "the stream" if getattr(stream.source, "split", None) == "deal" else "every reader"
    return (
        f"{reader} ran out of samples at {at}, before steps={stream.steps} (its iterable ended, or its "
        f"queue closed): give {more} enough samples for the pass, or fewer steps="
    )


def _warn_steps_cut(stream: Any, total: int, stored_steps: int) -> None:
    """Say once that ``steps=`` cuts the stored part's epoch (the rest of it is not delivered)."""
    if stream.stored is None or stream.steps is None or stream._warned_cut:
        return
    if stored_steps > total:
        stream._warned_cut = True
        log.warning(
            "live stream: steps=%d cuts each pass short of the stored part's epoch (%d batches here): "
            "the rest of each stored epoch is not delivered; steps=None makes a pass the stored epoch",
            stream.steps,
            stored_steps + stream._steps_before,
        )
