"""The resume protocol both loader backends share: ``set_epoch``, ``state_dict``, ``load_state_dict``."""
from __future__ import annotations

import functools
from typing import Any, Iterator

from .stream import Stream


class Resumable:
    """Counts the batches delivered in this pass; states are computed from that count.

    A state taken after an epoch's last batch points at the start of the next epoch,
    so resuming from it never replays the finished epoch.
    """

    stream: Stream
    batches_seen = 0
    epoch_done = False

    @property
    def epoch(self) -> int:
        """The epoch being delivered (after ``load_state_dict``: the epoch the state resumes)."""
        return self.stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; keeps a pending resume of this same epoch (see :meth:`Stream.set_epoch`)."""
        if epoch != self.stream.epoch or self.epoch_done:
            self.batches_seen, self.epoch_done = 0, False
        self.stream.set_epoch(epoch)

    def _counted(self, iterator: Iterator[Any]) -> Iterator[Any]:
        self.batches_seen, self.epoch_done = 0, False
        total = len(self.stream)
        for batch in iterator:
            self.batches_seen += 1
            self.epoch_done = self.batches_seen >= total
            yield batch
        # A full pass ended: the next pass (same epoch or next) starts from the beginning.
        self.epoch_done = True
        self.stream.end_of_pass()

    def state_dict(self) -> dict:
        """Where this rank is: epoch plus delivered batches (and the plan geometry to check against).
        After the epoch's last batch: the start of the next epoch."""
        return self.stream.progress(self.batches_seen, epoch_done=self.epoch_done)

    def snapshot(self):
        """A deferred :meth:`state_dict` of this very moment (cheap: computed only if called)."""
        return functools.partial(self.stream.progress, self.batches_seen, epoch_done=self.epoch_done)

    def load_state_dict(self, state: dict) -> None:
        """Resume at exactly the next unseen batch (also on another world size or worker count)."""
        self.stream.resume(state)
        self.batches_seen, self.epoch_done = 0, False
