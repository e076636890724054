"""Where each reader slice of a live source is: its source's state after the last delivered
batch, kept per slice for ``state_dict()``, put back at a resume and handed to the slice's next
reader. Apart from :mod:`.stream` as the one state of a live stream that is not step arithmetic."""

from __future__ import annotations

import functools
import logging
from typing import Any

from .fetch import Fetcher
from .source import LiveSource

log = logging.getLogger("mmloader")


class SlicePositions:
    """The live slices' positions (``"rank/reader"`` -> the source's state, None when it cannot
    say), the reader layout they were saved for, and this process's open readers."""

    def __init__(self, source: LiveSource, live_name: str):
        self.source, self.live_name = source, live_name
        self.saved: dict[str, Any] = {}  # slice -> its source's state after the last delivered batch
        self.layout: dict | None = None  # {"world", "workers"} of the slices in `saved`
        self.saved_before_last: dict[str, Any] = {}  # `saved` before the last delivered batch
        self.delivered = 0  # batches delivered in the current pass
        self.fetchers: dict[str, Fetcher] = {}  # this process's open readers (closed when a pass ends)
        self.warned_layout = self.warned_resume = False
        self.restarted_passes = 0  # passes after which a source that cannot say where it is restarts

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["fetchers"] = {}  # threads stay in the process that started them
        return state

    def state(self, batches_seen: int) -> dict:
        """The ``"live"`` part of a state after ``batches_seen`` batches of this pass."""
        saved = self.saved_before_last if batches_seen == self.delivered - 1 else self.saved
        return {
            "source": self.live_name,
            "slices": dict(saved),
            "layout": self.layout,
            # None: no live batch delivered yet, so nothing to say
            "checkpointable": all(v is not None for v in saved.values()) if saved else None,
        }

    def load(self, live: dict) -> None:
        """Take the positions of a state's ``"live"`` part (at a resume)."""
        saved_slices = dict(live.get("slices") or {})
        # (a pass that continues its own epoch resumes from this stream's own state: no news)
        if live.get("checkpointable") is False and saved_slices != self.saved and not self.warned_resume:
            self.warned_resume = True
            log.warning(
                "resume: live source %r cannot say where it is (its iterables have no state_dict()): "
                "it goes on from its own position; samples in flight when the checkpoint was taken are "
                "not delivered again (at-most-once)",
                self.live_name,
            )
        self.saved, self.layout = saved_slices, live.get("layout")
        self.saved_before_last = dict(self.saved)

    def record(self, info: dict) -> None:
        """A batch was delivered: its slice is now where the batch's last sample left it."""
        self.saved_before_last = dict(self.saved)
        if info.get("layout") != self.layout:  # another worker count: the old slices are gone
            if any(v is not None for v in self.saved.values()) and not self.warned_layout:
                self.warned_layout = True
                log.warning(
                    "live source %r: its positions were saved for %s readers, this pass reads with %s, so "
                    "each reader started from the source's own position: pin num_workers= (its default "
                    "follows the CPU count) for an exact resume",
                    self.live_name,
                    self.layout,
                    info.get("layout"),
                )
            self.saved, self.layout = {}, info.get("layout")
        if info.get("slice") is not None:
            self.saved[info["slice"]] = info.get("state")
        self.delivered += 1

    def open(self, rank: int, world: int, part: int, workers: int, slice_key: str, layout: dict) -> Fetcher:
        """This reader's slice: a new iterable from the factory (made in the reader's thread, so
        its wait is bounded too), put back at the slice's last delivered position if it has one."""
        old = self.fetchers.pop(slice_key, None)
        if old is not None:
            old.close()
        where = f"live source {self.live_name!r} (rank {rank}, reader {part} of {workers})"
        same = self.layout == layout
        saved = self.saved.get(slice_key) if same else None
        deal = (rank * workers + part, world * workers) if self.source.split == "deal" else (0, 1)
        fetcher = Fetcher(
            functools.partial(self.source.open, rank, world, part, workers),
            where,
            self.source.buffer,
            deal,
            saved=saved,
            restarts=same and slice_key in self.saved and saved is None and self.restarted_passes == 1,
        )
        self.fetchers[slice_key] = fetcher
        return fetcher

    def close_readers(self) -> None:
        """Close this process's open readers (a producer waiting in one returns at once)."""
        for fetcher in list(self.fetchers.values()):
            fetcher.close()
        self.fetchers.clear()

    def end_pass(self) -> None:
        """A pass ended: a source that cannot say where it is restarts at the next one."""
        if any(state is None for state in self.saved.values()):
            self.restarted_passes += 1
