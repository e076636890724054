"""Building one planned batch: the whole-batch read path, the per-sample path, the error policy.

The whole-batch path reads each source's part of a batch with one ``get_batch``
(one store call per store, images decoded straight into the batch tensor) and
collates columns; a batch that mixes sources is merged from the sources' columns.
When a sample fails there, the batch is built again sample by sample, where the
error policy applies: ``"raise"`` re-raises the error (naming key, field and
store), ``"skip"`` logs it, counts it (:attr:`mmloader.Stream.skipped`, across
worker processes) and takes the next sample of the plan instead, so batch counts
stay equal.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np
import torch.utils.data

from ..align.collate import MISSING, Collate, collate, merge_columns, packing_also, sample_columns
from ..errors import MMLoaderError, SampleError
from ..readers.columns import per_sample
from ..readers.document import Document
from ..readers.timing import timed
from .control import SharedControl
from .stages.error_policy import Errors

log = logging.getLogger("mmloader")


class BatchBuilder:
    """Turns planned ``(positions, sources, indices)`` into a batch (or one sample).

    >>> builder = BatchBuilder([dataset], None, collate, Errors("raise"), SharedControl())  # doctest: +SKIP
    >>> builder.build(plan, positions, sources, indices, batched=True)                      # doctest: +SKIP
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        source_names: Sequence[str] | None,
        collate_fn: Callable[[list], Any] | None,
        errors: Errors,
        control: SharedControl,
        packed_also: Sequence[str] = (),
    ):
        self.datasets, self.source_names = list(datasets), source_names
        self.on_error, self.max_consecutive_errors, self.control = errors.policy, errors.max_consecutive, control
        # Packing is declared by the readers that deliver encoded bytes (ImageReader(output="raw")),
        # never guessed from a tensor's dtype; a user's collate_fn gets it around each call, so a
        # Collate (or mmloader.collate) inside it packs them too, and their object is used as given.
        pack = tuple(
            dict.fromkeys(
                [*(name for d in self.datasets for name in getattr(d, "packed_modalities", [])), *packed_also]
            )
        )
        if collate_fn is collate:
            collate_fn, pack = Collate(pack=pack), ()
        self.collate_fn, self._pack = collate_fn, pack
        # A Collate whose __call__ is its own builds from columns; an overridden __call__ sees rows.
        columnar = (
            self.collate_fn.columns
            if isinstance(self.collate_fn, Collate) and type(self.collate_fn).__call__ is Collate.__call__
            else None
        )
        # The whole-batch path needs column-wise collation and datasets that read whole batches.
        self._columns = columnar if all(hasattr(d, "get_batch") for d in self.datasets) else None

    def build(self, plan, positions: np.ndarray, sources: np.ndarray, indices: np.ndarray, batched: bool) -> Any:
        if not batched:  # one planned sample
            return self.fetch(plan, int(positions[0]), int(sources[0]), int(indices[0]))
        return self.build_with_rows(plan, positions, sources, indices, [])

    def build_with_rows(self, plan, positions: np.ndarray, sources: np.ndarray, indices: np.ndarray, rows: list) -> Any:
        """A batch of the planned samples (none: an empty plan part) followed by ``rows``, samples
        already decoded elsewhere (a live source's), collated together as one batch."""
        if self._columns is not None:
            try:
                columns = self._batch_columns(sources, indices) if len(indices) else {}
            except SampleError:
                columns = None  # the per-sample path below reports (or skips) the culprit by key
            if columns is not None:
                return self._collate(self._columns, _followed_by(columns, len(indices), rows))
        samples = [self.fetch(plan, int(p), int(s), int(i)) for p, s, i in zip(positions, sources, indices)]
        samples += rows
        return self._collate(self.collate_fn, samples) if self.collate_fn is not None else samples

    def samples(self, sources: np.ndarray, indices: np.ndarray) -> list[dict[str, Any] | None]:
        """The planned samples, decoded, in order (what packing lays into rows): read as one batch
        where every reader can; a bad sample raises (``on_error="raise"``) or is left out as None,
        counted and logged (``"skip"``: a replacement would not fit its row's budget)."""
        if self._columns is not None and len(indices):
            try:
                columns = self._batch_columns(sources, indices)
            except SampleError:
                pass  # sample by sample below: the culprit is reported by key
            else:
                values = {name: per_sample(column) for name, column in columns.items()}
                return [  # a field a sample's source lacks is left out of that sample
                    {name: v[j] for name, v in values.items() if v[j] is not MISSING} for j in range(len(indices))
                ]
        out: list[dict[str, Any] | None] = []
        for s, i in zip(sources.tolist(), indices.tolist()):
            try:
                sample = loaded(self.datasets[s][i])
            except SampleError as e:
                if self.on_error == "raise":
                    raise
                self.control.skip("sample (left out of its packed row)", e)
                out.append(None)
                continue
            if self.source_names is not None and isinstance(sample, dict):
                sample = {**sample, "__source__": self.source_names[s]}
            out.append(sample)
        return out

    def _collate(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        with timed("collate"):
            return packing_also(self._pack, fn, arg) if self._pack else fn(arg)

    def _batch_columns(self, sources: np.ndarray, indices: np.ndarray) -> dict[str, Any]:
        share = torch.utils.data.get_worker_info() is not None  # the batch goes to another process
        if len(self.datasets) == 1:  # the common case: no rows to group by source
            columns = self.datasets[0].get_batch(indices.tolist(), share_memory=share)
        else:
            groups = [(s, np.flatnonzero(sources == s)) for s in np.unique(sources).tolist()]
            parts = [
                (rows.tolist(), self.datasets[s].get_batch(indices[rows].tolist(), share_memory=share))
                for s, rows in groups
            ]
            columns = parts[0][1] if len(parts) == 1 else merge_columns(parts, len(indices))
        if self.source_names is not None:
            columns["__source__"] = [self.source_names[int(s)] for s in sources]
        return columns

    def fetch(self, plan, position: int, source: int, index: int) -> Any:
        """One sample, with the error policy: the next sample of the plan replaces a bad one.

        Only the planned sample counts as skipped (and is logged as a warning): a replacement
        that is bad too is passed over quietly, since it is counted where the plan visits it."""
        for attempt in range(self.max_consecutive_errors + 1):
            try:
                sample = loaded(self.datasets[source][index])
                if self.source_names is not None and isinstance(sample, dict):
                    sample = {**sample, "__source__": self.source_names[source]}
                return sample
            except SampleError as e:
                if self.on_error == "raise":
                    raise
                if attempt == 0:
                    self.control.skip("sample (replaced by the next in the plan)", e)
                else:
                    log.info("the replacement is bad too (reported where the plan visits it): %s", e)
                position = (position + 1) % len(plan)
                (s,), (i,) = plan.lookup(np.array([position]))
                source, index = int(s), int(i)
        raise MMLoaderError(
            f"{self.max_consecutive_errors} consecutive samples failed to load; "
            "the dataset looks broken (run `mmloader verify`)"
        )


def loaded(sample: Any) -> Any:
    """``sample`` with its documents' images read and decoded now, inside the error policy (a
    :class:`mmloader.Document` reads its images lazily; a batch needs them, a bad one named)."""
    if isinstance(sample, dict):
        for value in sample.values():
            if isinstance(value, Document):
                value.load()
    return sample


def _followed_by(columns: dict[str, Any], n: int, rows: list) -> dict[str, Any]:
    """The columns of ``n`` planned samples followed by ``rows`` (samples decoded elsewhere)."""
    if not rows:
        return columns
    if not n:
        return sample_columns(rows)
    return merge_columns([(range(n), columns), (range(n, n + len(rows)), sample_columns(rows))], n + len(rows))
