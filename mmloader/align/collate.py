"""Batch assembly: stack what stacks, pad what varies (with a mask), list the rest.

``collate(samples)`` returns ``{"__key__": [...], name: batched, ...}`` plus
``"__mask__": {name: bool tensor}`` for padded modalities (True = real element)
and ``"__present__": {name: bool tensor (B,)}`` for modalities some samples lack
(mixed sources, readers with ``optional=True``); missing tensor entries are zero, missing
numbers 0, missing others None (and every row None where no row of the batch has it).

Interleaved documents (:class:`mmloader.Document`, any number of images each) collate to
``batch[name]``, each document's segments in order with its images replaced by their place
in ``batch["__images__"][name]`` (every image of the batch: ``(N, C, H, W)`` when they share a
shape), with ``batch["__counts__"][name]`` (images per document) and ``batch["__row__"][name]``
(the document of each image).

Images (uint8 ``(C, H, W)`` tensors, C in 1, 3, 4) stack into a ``(B, C, H, W)`` batch
in channels_last memory, on every path, so a batch has the same layout whichever way it
was built; so do clips (uint8 ``(T, C, H, W)``) that come channels-last, as decoded,
into ``(B, T, C, H, W)`` over ``(B, T, H, W, C)`` memory. Images and clips of several
sizes are padded in that layout. ``.contiguous()`` gives planar batches (``.view`` across
the channels needs it; ``.reshape`` takes either).

Encoded bytes — modalities named in ``pack``, e.g. ``ImageReader(output="raw")``,
which :class:`mmloader.Stream` passes — are *packed*: ``batch[name]`` is their
concatenation and ``batch["__offsets__"][name]`` the ``B + 1`` boundaries
(:func:`unpack` gives the list back). One contiguous buffer is one shared-memory
segment between processes and one host-to-device copy. Other 1-D uint8 tensors are
ordinary tensors: stacked, or padded with a mask.
"""

from __future__ import annotations

import contextvars
import itertools
import operator
from typing import Any, Callable, Literal, Sequence, overload

import torch

from ..readers.columns import Packed, Ragged, Stacked, batch_buffer, per_sample
from ..readers.document import Document

_MISSING = object()
MISSING = _MISSING  # what a column holds for a sample that lacks the field (mixed sources)


class _EveryRow:
    """Marks a column of a reader that may lack its field (``optional=True``) in which every row
    has it: its batch still says so in ``__present__`` (all True), so an optional modality's
    batches have one schema whether or not a row lacks it."""

    __slots__ = ()


class _EveryRowList(list, _EveryRow):
    __slots__ = ()


class _EveryRowStacked(Stacked, _EveryRow):
    __slots__ = ()


class _EveryRowPacked(Packed, _EveryRow):
    __slots__ = ()


class _EveryRowRagged(Ragged, _EveryRow):
    __slots__ = ()


def present_in_every_row(column: Any) -> Any:
    """``column`` (a list of values, or a :class:`Packed` / :class:`Ragged` / :class:`Stacked`
    column, none of them missing) marked so that its batch has ``__present__[name]``, all True.
    Code that does not know the mark sees the column as it was (the marked forms are subclasses).

    >>> collate_columns({"t": present_in_every_row(["a", "b"])})["__present__"]["t"].tolist()
    [True, True]
    """
    for base, marked in ((Stacked, _EveryRowStacked), (Packed, _EveryRowPacked), (Ragged, _EveryRowRagged)):
        if isinstance(column, base):
            return marked(*column)
    return _EveryRowList(column)


def _rows_of(column: Any) -> int:
    if isinstance(column, Stacked):
        return int(column.tensor.shape[0])
    if isinstance(column, (Packed, Ragged)):
        return len(column.offsets) - 1
    return len(column)


def pad_stack(tensors: Sequence[torch.Tensor], pad_value: float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad tensors of equal rank to the largest size on every dim; returns (batch, mask).

    >>> b, m = pad_stack([torch.ones(2), torch.ones(3)]); b.shape, m.sum().item()
    (torch.Size([2, 3]), 5)
    """
    ndim = tensors[0].dim()
    if any(t.dim() != ndim for t in tensors):
        raise ValueError(f"cannot pad tensors of different ranks: {[tuple(t.shape) for t in tensors]}")
    shape = [max(t.shape[d] for t in tensors) for d in range(ndim)]
    if batches_as_pixels(tensors):  # padded in the layout they batch in
        out = pixels_batch((len(tensors), *shape), pad_value)
    else:
        out = tensors[0].new_full((len(tensors), *shape), pad_value)
    mask = torch.zeros((len(tensors), *shape), dtype=torch.bool)
    for i, t in enumerate(tensors):
        region: tuple[int | slice, ...] = (i, *[slice(0, s) for s in t.shape])
        out[region] = t
        mask[region] = True
    return out, mask


@overload
def pad_ragged(
    flat: torch.Tensor, offsets: torch.Tensor, pad_value: float = 0, *, mask: Literal[True]
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def pad_ragged(
    flat: torch.Tensor, offsets: torch.Tensor, pad_value: float, mask: Literal[True]
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def pad_ragged(
    flat: torch.Tensor, offsets: torch.Tensor, pad_value: float = 0, mask: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]: ...
def pad_ragged(
    flat: torch.Tensor, offsets: torch.Tensor, pad_value: float = 0, mask: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """1-D values end to end (``offsets``: ``B + 1`` boundaries) -> ``(B, longest)`` and a mask
    (True = real element) in one vectorised step; without ``mask``, values of one length are
    reshaped and get no mask (None), as :func:`collate` stacks tensors of one shape.

    >>> b, m = pad_ragged(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])); b.tolist(), m.tolist()
    ([[1, 0], [2, 3]], [[True, False], [True, True]])
    """
    lengths = offsets[1:] - offsets[:-1]
    rows = len(lengths)
    longest = int(lengths.max()) if rows else 0
    if not mask and rows and int(lengths.min()) == longest:
        return flat[int(offsets[0]) : int(offsets[-1])].reshape(rows, longest), None
    real = torch.arange(longest) < lengths[:, None]
    out = flat.new_full((rows, longest), pad_value)
    values = flat[int(offsets[0]) : int(offsets[-1])] if rows else flat[:0]
    signed = _SAME_BITS.get(out.dtype)  # torch has no masked_scatter for uint16/32/64: copy the bits
    if signed is not None:
        out.view(signed).masked_scatter_(real, values.view(signed))
    else:
        out.masked_scatter_(real, values)
    return out, real


_SAME_BITS = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


class Collate:
    """A collate with options: ``masks`` names modalities that always get a ``__mask__``
    entry (so a batch whose token lists happen to have equal lengths has the same schema).

    While a stream collates, ``pack`` also holds the modalities its readers deliver as encoded
    bytes (``ImageReader(output="raw")``): the stream uses your object as given, never a copy.

    >>> stream = mmloader.Stream(ds, batch_size=32, collate_fn=Collate(masks=["caption"]))  # doctest: +SKIP
    """

    def __init__(self, masks: Sequence[str] = (), pad_value: float = 0, pack: Sequence[str] = ()):
        self.masks, self.pad_value, self.pack = tuple(masks), pad_value, pack

    @property
    def pack(self) -> tuple[str, ...]:
        """The modalities packed: those given, plus the stream's (:func:`packing_also`)."""
        return with_stream_pack(self._pack)

    @pack.setter
    def pack(self, names: Sequence[str]) -> None:
        self._pack = tuple(names)

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return self.columns(sample_columns(samples))

    def columns(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The batch from columns (``name -> values``): whole-batch reads call this directly, rows
        of samples reach it through ``__call__``, so a subclass overriding it sees every batch."""
        return collate_columns(columns, self.pad_value, self.masks, self.pack)


# The modalities a stream's readers deliver as encoded bytes: set around the stream's call to its
# collate_fn (per thread), read by Collate.pack and collate(), so the user's Collate needs no copy.
_STREAM_PACK: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("mmloader_stream_pack", default=())


def with_stream_pack(pack: tuple[str, ...]) -> tuple[str, ...]:
    """``pack`` and, while a stream collates, the modalities its readers deliver as encoded bytes."""
    also = _STREAM_PACK.get()
    return tuple(dict.fromkeys((*pack, *also))) if also else pack


def packing_also(pack: tuple[str, ...], fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)`` with :class:`Collate` and :func:`collate` inside also packing ``pack`` (any
    of them it calls: one that collates a 1-D uint8 field of the same name packs it too).

    >>> packing_also(("image",), Collate(), samples)   # doctest: +SKIP
    """
    token = _STREAM_PACK.set(pack)
    try:
        return fn(arg)
    finally:
        _STREAM_PACK.reset(token)


def pack_bytes(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate 1-D tensors; returns (flat, offsets) with ``len(offsets) == len(tensors) + 1``."""
    lengths = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return (torch.cat(list(tensors)) if tensors else torch.empty(0, dtype=torch.uint8)), offsets


def unpack(batch: dict[str, Any], name: str) -> list[torch.Tensor]:
    """The per-sample tensors of a packed modality (views, no copy).

    >>> flat, offsets = pack_bytes([torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8)])
    >>> [t.tolist() for t in unpack({"x": flat, "__offsets__": {"x": offsets}}, "x")]
    [[1, 2], [3]]
    """
    flat, offsets = batch[name], batch["__offsets__"][name].tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def collate(
    samples: Sequence[dict[str, Any]], pad_value: float = 0, masks: Sequence[str] = (), pack: Sequence[str] = ()
) -> dict[str, Any]:
    """The default collate for :class:`mmloader.Stream` batches (rows of samples); packs ``pack``
    and, called while a stream collates, the modalities its readers deliver as encoded bytes."""
    return collate_columns(sample_columns(samples), pad_value, masks, with_stream_pack(tuple(pack)))


def sample_columns(samples: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Rows of samples as columns, every name of any sample, ``_MISSING`` where a sample lacks it."""
    names: dict[str, None] = {}
    for s in samples:
        names.update(dict.fromkeys(s))
    return {name: [s.get(name, _MISSING) for s in samples] for name in names}


def is_image(t: torch.Tensor) -> bool:
    """Decoded pixels that batch channels-last: uint8 images (C, H, W) with 1, 3 or 4 channels, and
    clips (T, C, H, W) laid out channels-last themselves (as decoders hand them out; crops and
    frame slices of them too: channels innermost, then width); a 4-D tensor in any other layout
    (an array field, a transform's planar output) batches as it is."""
    if t.dtype != torch.uint8 or t.dim() not in (3, 4) or t.shape[-3] not in (1, 3, 4):
        return False
    return t.dim() == 3 or (t.stride(-3) == 1 and t.stride(-1) == t.shape[-3])


def batches_as_pixels(tensors: Sequence[torch.Tensor]) -> bool:
    """The tensors of one column batch as pixels (channels-last): the first real one (absent rows
    are empty fillers) :func:`is_image`, and all of one dtype (mixed dtypes promote, as
    ``torch.stack`` does, instead of being cast to uint8)."""
    first = next((t for t in tensors if t.numel()), tensors[0])
    return is_image(first) and all(t.dtype == first.dtype for t in tensors)


def pixels_batch(shape: Sequence[int], fill: float | None = None, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A batch ``(B, [T,] C, H, W)`` in channels-last memory (``(B, [T,] H, W, C)``: the layout
    decoders write and GPU convolutions prefer), uninitialised or filled with ``fill``; from the
    batch buffers (the worker's shared-memory slot, or memory already faulted in: a fresh
    allocation of a 10 MB clip batch costs more in page faults than copying into it)."""
    *lead, c, h, w = shape
    out = batch_buffer((*lead, h, w, c), dtype)
    if fill is not None:
        out.fill_(fill)
    return out.movedim(-1, -3)


def stack_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Images or clips of one shape -> (B, [T,] C, H, W) in channels-last memory; a copy, not a
    transposition, when they are channels-last themselves (the decoders' output)."""
    out = pixels_batch((len(images), *images[0].shape))
    for i, im in enumerate(images):
        out[i].copy_(im)
    return out


def collate_columns(
    columns: dict[str, Any], pad_value: float = 0, masks: Sequence[str] = (), pack: Sequence[str] = ()
) -> dict[str, Any]:
    """The same batch from columns (``name -> list of values``, or :class:`Packed` / :class:`Ragged` /
    :class:`Stacked`)."""
    batch: dict[str, Any] = {}
    always_mask = set(masks)
    masks_out: dict[str, torch.Tensor] = {}
    offsets_out: dict[str, torch.Tensor] = {}
    present: dict[str, torch.Tensor] = {}
    images: dict[str, Any] = {}
    counts: dict[str, torch.Tensor] = {}
    owners: dict[str, torch.Tensor] = {}
    for name, values in columns.items():
        if isinstance(values, _EveryRow):
            present[name] = torch.ones(_rows_of(values), dtype=torch.bool)
        if isinstance(values, Packed):
            batch[name], offsets_out[name] = values.flat, values.offsets
            continue
        if isinstance(values, Stacked):
            batch[name] = values.tensor
            continue
        if isinstance(values, Ragged):
            if name in pack and values.flat.dtype == torch.uint8:
                batch[name], offsets_out[name] = values.flat, values.offsets
                continue
            batch[name], mask = pad_ragged(values.flat, values.offsets, pad_value, name in always_mask)
            if mask is not None:
                masks_out[name] = mask
            continue
        # (identity only, in C: ``in`` would compare with ==, which numpy arrays answer elementwise)
        if any(map(operator.is_, values, itertools.repeat(_MISSING))):  # rows that lack this modality
            have = [v is not _MISSING for v in values]
            present[name] = torch.tensor(have)
            real = [v for v in values if v is not _MISSING]
        else:  # the common case, checked in C: no per-value Python below for plain columns
            have, real = [True] * len(values), values
        if not real:  # no row of the batch has it (an optional reader's): nothing to shape a filler by
            batch[name] = [None] * len(values)
            continue
        first = real[0]
        if isinstance(first, Document):
            documents = [v if h else None for v, h in zip(values, have)]
            batch[name], images[name], counts[name], owners[name] = collate_documents(documents)
            continue
        if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in real):
            if name in pack and all(v.dim() == 1 and v.dtype == torch.uint8 for v in real):
                empty = first.new_empty(0)
                batch[name], offsets_out[name] = pack_bytes([v if h else empty for v, h in zip(values, have)])
            elif all(v.shape == first.shape for v in real) and name not in always_mask:
                filler = torch.zeros_like(first)
                filled = [v if h else filler for v, h in zip(values, have)]
                batch[name] = stack_images(filled) if batches_as_pixels(real) else torch.stack(filled)
            else:
                filler = first.new_zeros((0,) * first.dim())
                filled = [v if h else filler for v, h in zip(values, have)]
                if first.dim() == 1 and all(v.dim() == 1 and v.dtype == first.dtype for v in real):
                    padded, mask = pad_ragged(*pack_bytes(filled), pad_value, mask=True)
                else:
                    padded, mask = pad_stack(filled, pad_value)
                batch[name], masks_out[name] = padded, mask
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in real):
            batch[name] = torch.tensor([v if h else 0 for v, h in zip(values, have)])
        else:
            batch[name] = list(values) if real is values else [v if h else None for v, h in zip(values, have)]
    if masks_out:
        batch["__mask__"] = masks_out
    if offsets_out:
        batch["__offsets__"] = offsets_out
    if present:
        batch["__present__"] = present
    if images:
        batch["__images__"], batch["__counts__"], batch["__row__"] = images, counts, owners
    return batch


def collate_documents(documents: Sequence[Any]) -> tuple[list[list[Any]], Any, torch.Tensor, torch.Tensor]:
    """A batch of :class:`mmloader.Document` (None: a row without one) as ``(segments, images,
    counts, rows)``: each document's segments with every image replaced by its place in
    ``images`` (all the batch's images in order: one ``(N, C, H, W)`` tensor when they share a
    shape, else a list), the images of each document, and the document each image is of."""
    segments: list[list[Any]] = []
    flat: list[Any] = []
    counts, rows = [], []
    for r, doc in enumerate(documents):
        if doc is None:
            segments.append([])
            counts.append(0)
            continue
        parts, n = [], 0
        for kind, value in doc.parts():
            if kind == "text":
                parts.append(value)
            else:
                parts.append(len(flat))
                flat.append(value)
                rows.append(r)
                n += 1
        segments.append(parts)
        counts.append(n)
    return segments, stack_or_list(flat), torch.tensor(counts, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64)


def stack_or_list(values: list[Any]) -> Any:
    """A flat batch of images (a document's, a packed batch's): one tensor when they share a shape
    and dtype (channels_last for decoded images), an empty uint8 tensor when there are none, else
    the list (PIL images, encoded bytes of different sizes)."""
    if not values:
        return torch.zeros(0, dtype=torch.uint8)
    first = values[0]
    if all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values):
        return stack_images(values) if is_image(first) else torch.stack(values)
    return values


def merge_columns(parts: Sequence[tuple[Sequence[int], dict[str, Any]]], size: int) -> dict[str, Any]:
    """One batch's columns from several sources' columns: ``parts`` are ``(rows, columns)`` with
    ``rows`` the batch rows each source filled. Same-shape image batches are copied once into one
    channels_last tensor; other columns become per-row lists (absent rows: missing)."""
    names = list(dict.fromkeys(name for _rows, cols in parts for name in cols))
    out: dict[str, Any] = {}
    for name in names:
        have = [(rows, cols[name]) for rows, cols in parts if name in cols]
        if (
            len(have) == len(parts)
            and all(isinstance(c, Stacked) for _r, c in have)
            and len({(c.tensor.shape[1:], c.tensor.dtype) for _r, c in have}) == 1
        ):
            first = have[0][1].tensor
            merged = pixels_batch((size, *first.shape[1:]), dtype=first.dtype)
            for rows, column in have:
                merged[torch.as_tensor(list(rows))] = column.tensor
            out[name] = Stacked(merged)
            continue
        values: list[Any] = [_MISSING] * size
        for rows, column in have:
            for r, v in zip(rows, per_sample(column)):
                values[r] = v
        out[name] = values
    return out
