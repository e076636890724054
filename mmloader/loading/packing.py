"""Token-budget packing for :class:`mmloader.Stream`: ``pack_tokens=L`` and ``length_by``.

The stream's plan becomes a plan of *rows* (:class:`mmloader.planning.packing.PackedOrder`),
so the rank split, padding, resume and elastic resume apply to rows as they apply to
samples; each batch is ``batch_size`` rows of whole samples, packed by
:func:`mmloader.align.packing.pack_batch`. Token counts come from the stores without
decoding (``Reader.token_counts``), or from ``length_by``; they are measured once per
source and kept for the stream's life (they do not change between epochs).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..align.packing import PACKED_NAMES, TokenLayout, measured, pack_batch
from ..planning.packing import PACK_WINDOW, OverBudgetError, PackedOrder
from ..readers.basic import ArrayReader, TextReader
from ..readers.timing import timed

log = logging.getLogger("mmloader")


def token_layout(length_by: Any) -> TokenLayout:
    """``length_by`` as a :class:`TokenLayout`: a modality name, a callable or array of text
    token counts, or a layout (``mmloader.tokens(...)``)."""
    if isinstance(length_by, TokenLayout):
        return length_by
    if length_by is None:
        return TokenLayout()
    if isinstance(length_by, str):
        return TokenLayout(text=length_by)
    if callable(length_by) or isinstance(length_by, (np.ndarray, Sequence)):
        return TokenLayout(length=length_by)
    raise TypeError(
        f"length_by={length_by!r}: expected a modality name, a callable index -> tokens, "
        "an array of token counts, or mmloader.tokens(...)"
    )


class Packer:
    """What a packing stream adds: the token layout, the measured lengths, the row plan.

    Args:
        datasets: the stream's sources.
        capacity: tokens per row (checked by :class:`mmloader.Packing`, which makes packers).
        length_by: see :func:`token_layout`.
        window: plan positions packed together (:data:`mmloader.planning.packing.PACK_WINDOW`).
        mixed: whether the sources are a mix (a ``length`` callable then takes ``(source, index)``).
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        capacity: int,
        length_by: Any,
        window: int,
        mixed: bool,
        shuffle: bool = True,
        balance: str | None = None,
    ):
        self.datasets, self.capacity, self.window, self.mixed = list(datasets), int(capacity), int(window), mixed
        self.shuffle, self.balance = bool(shuffle), balance
        self.layout = token_layout(length_by)
        self.text = self.layout.text or self._only_token_modality()
        names = {n for ds in self.datasets for n in getattr(ds, "readers", {})}
        if self.text not in names and (names or self.layout.length is None):  # (a plain dataset: as given)
            raise ValueError(f"length_by: {self.text!r} is not a modality of the dataset ({sorted(names)})")
        for name in self.layout.images:
            if names and name not in names:
                raise ValueError(f"length_by: image modality {name!r} is not one of the dataset's ({sorted(names)})")
            kinds = {type(ds.readers[name]).__name__ for ds in self.datasets if name in getattr(ds, "readers", {})}
            if kinds - {"ImageReader"}:
                raise ValueError(f"length_by: {name!r} is read by {', '.join(sorted(kinds))}, not an ImageReader")
        clash = sorted(names & set(PACKED_NAMES))
        if clash:
            raise ValueError(f"packed batches add {', '.join(PACKED_NAMES)}; rename the modality {clash[0]!r}")
        length = self.layout.length
        if length is not None and not callable(length) and mixed:
            raise ValueError(
                "length_by: an array of token counts is for one dataset; for a mix give (source, index) -> tokens"
            )
        self._tokens: dict[int, np.ndarray] = {}  # per source: tokens of each index (epoch-independent)
        self._image_tokens: dict[int, np.ndarray] = {}  # per source: what its own images take
        self._plans: dict[int, PackedOrder] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_plans"] = {}  # rebuilt where needed (rows are cheap to plan; they would be large to send)
        return state

    def _only_token_modality(self) -> str:
        found = sorted(
            {
                name
                for ds in self.datasets
                for name, r in getattr(ds, "readers", {}).items()
                if isinstance(r, ArrayReader)
                or (isinstance(r, TextReader) and r.tokenizer is not None)
                or hasattr(r, "document_counts")
            }
        )
        if len(found) != 1:
            raise ValueError(
                "pack_tokens: say which modality holds the token ids (length_by='name' or "
                f"mmloader.tokens('name', ...)); candidates: {found or 'none'}"
            )
        return found[0]

    def identity(self) -> dict:
        """What of packing changes the plan (part of the stream's plan identity): the budget, the
        layout and a digest of every sample's token count (another tokenizer, other special
        tokens or other given lengths make other rows, so a resume across them is refused)."""
        digest = hashlib.sha256()
        for s in range(len(self.datasets)):
            digest.update(np.ascontiguousarray(self.source_tokens(s), dtype=np.int64).tobytes())
        return {
            "tokens": self.capacity,
            "window": self.window,
            "layout": self.layout.identity(),
            "text": self.text,
            "shuffle": self.shuffle,
            "lengths": digest.hexdigest()[:16],
            **({"balance": self.balance} if self.balance else {}),  # (ranks are dealt other rows)
        }

    def prepare(self) -> None:
        """Measure every source's token counts now (in the training process, before workers
        start: they inherit them instead of measuring again)."""
        for s in range(len(self.datasets)):
            self.source_tokens(s)

    def plan(self, base: Any, seed: int, epoch: int) -> PackedOrder:
        """The rows of ``epoch`` over the sample plan ``base`` (the last two epochs are kept)."""
        hit = self._plans.get(epoch)
        if hit is None:
            started = time.perf_counter()
            try:
                hit = PackedOrder(
                    base, self.lengths, self.capacity, seed=seed, epoch=epoch, window=self.window, shuffle=self.shuffle
                )
            except OverBudgetError as e:
                raise self._overlong(base, e) from None
            log.debug(
                "packed epoch %d: %d samples into %d rows of %d tokens (%.1f%% full) in %.2f s",
                epoch,
                len(base),
                len(hit),
                self.capacity,
                100 * hit.utilisation(),
                time.perf_counter() - started,
            )
            if len(self._plans) >= 2:
                self._plans.pop(next(iter(self._plans)))
            self._plans[epoch] = hit
        return hit

    def _overlong(self, base: Any, e: OverBudgetError) -> Exception:
        """The error for samples over the budget, naming the first of them by key."""
        (s,), (i,) = base.lookup(np.array([e.position], dtype=np.int64))
        ds = self.datasets[int(s)]
        key = ds.key(int(i)) if hasattr(ds, "key") else int(i)
        return ValueError(
            f"sample {key!r} has {e.tokens} tokens, over pack_tokens={self.capacity} "
            f"({e.count} samples of the epoch are): raise pack_tokens, or cut them with "
            "length_by=mmloader.tokens(..., overlong='truncate')"
        )

    def lengths(self, sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """Tokens of each ``(source, index)``, over the budget cut to it when truncating."""
        out = np.zeros(len(indices), dtype=np.int64)
        for s in np.unique(sources).tolist():
            sel = sources == s
            out[sel] = self.source_tokens(int(s))[indices[sel]]
        if self.layout.overlong == "truncate":
            for s in np.unique(sources).tolist():  # a sample's own images are never cut: they must fit
                sel = np.flatnonzero(sources == s)
                over = sel[self._image_tokens[int(s)][indices[sel]] > self.capacity]
                if len(over):
                    ds, i = self.datasets[int(s)], int(indices[over[0]])
                    key = ds.key(i) if hasattr(ds, "key") else i
                    raise ValueError(
                        f"sample {key!r}: its images take {int(self._image_tokens[int(s)][i])} tokens, over "
                        f"pack_tokens={self.capacity} ({len(over)} samples' are); overlong='truncate' cuts text, "
                        "never images: raise pack_tokens"
                    )
            np.minimum(out, self.capacity, out=out)
        return out

    def source_tokens(self, s: int) -> np.ndarray:
        """Tokens of every sample of source ``s``: text (measured or given) plus images."""
        hit = self._tokens.get(s)
        if hit is not None:
            return hit
        started = time.perf_counter()
        ds = self.datasets[s]
        n = len(ds)
        idx = np.arange(n, dtype=np.int64)
        readers = getattr(ds, "readers", {})
        length, per = self.layout.length, self.layout.per_image
        document = self.text in readers and hasattr(readers[self.text], "document_counts")
        texts = pictures = None
        if document and (length is None or per):  # a document's texts and images: one read of its layout
            texts, pictures = ds.document_counts(idx, self.text, tokens=length is None)
        if callable(length):
            call: Callable[[int], int] = (lambda i: length(s, i)) if self.mixed else length  # type: ignore[misc,assignment]
            total = measured([call(i) for i in range(n)], "length_by")
        elif length is not None:
            total = measured(length, "length_by")
            if len(total) != n:
                raise ValueError(f"length_by: {len(total)} token counts for {n} samples")
            total = total.copy()
        elif texts is not None:
            total = texts
        elif self.text in readers:
            total = ds.token_counts(idx, self.text)
        else:
            total = np.zeros(n, dtype=np.int64)  # a source without the modality: images only
        own = np.zeros(n, dtype=np.int64)  # the sample's own images (an image modality)
        if per:
            for name in self.layout.images:
                if name in readers:
                    own += per * (np.asarray(ds.lengths(idx, name)) > 0)
            total = total + own + (per * pictures if pictures is not None else 0)
        self._image_tokens[s] = own
        total = total.astype(np.int32 if n and int(total.max()) < 2**31 else np.int64)
        self._tokens[s] = total
        log.info("packing: measured the tokens of %d samples in %.2f s", n, time.perf_counter() - started)
        return total

    def build(self, builder: Any, plan: PackedOrder, rows: np.ndarray) -> dict[str, Any]:
        """The packed batch of plan rows ``rows``."""
        sources, indices, members, offsets = plan.samples(rows)
        samples = builder.samples(sources, indices)
        planned = plan.lengths[members].tolist()
        with timed("collate"):  # laying samples into rows is this batch's collate
            return pack_batch(samples, offsets.tolist(), self.layout, self.text, self.capacity, planned)


__all__ = ["PACK_WINDOW", "Packer", "token_layout"]


def token_weighted(mix: Any, packer: Packer | None) -> Any:
    """A stream's mix with ``weights_by="tokens"`` turned into sample weights by each source's
    mean tokens per sample as packed (any other mix, or none, as it is)."""
    if mix is None or mix.weights_by != "tokens":
        return mix
    if packer is None:
        raise ValueError(
            "mix(weights_by='tokens') weighs sources by their tokens, which a packing stream measures: "
            "pack it (lengths=mmloader.Packing(tokens, ...) or pack_tokens: in a config), or weigh by samples"
        )
    means = []
    for s, ds in enumerate(mix.datasets):
        n = len(ds)
        tokens = packer.lengths(np.full(n, s, dtype=np.int64), np.arange(n, dtype=np.int64)) if n else np.zeros(0)
        means.append(float(tokens.mean()) if n else 0.0)
    return mix.by_tokens(means)
