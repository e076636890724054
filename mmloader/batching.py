"""Batch assembly: stack what stacks, pad what varies (with a mask), list the rest.

``collate(samples)`` returns ``{"__key__": [...], name: batched, ...}`` plus
``"__mask__": {name: bool tensor}`` for padded modalities (True = real element)
and ``"__present__": {name: bool tensor (B,)}`` for modalities some samples lack
(mixed sources); missing tensor entries are zero, missing others are None.

1-D ``uint8`` tensors — encoded bytes, e.g. ``ImageReader(decode="raw")`` — are
*packed*: ``batch[name]`` is their concatenation and ``batch["__offsets__"][name]``
the ``B + 1`` boundaries (:func:`unpack` gives the list back). One contiguous
buffer is one shared-memory segment between processes and one host-to-device copy.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch

_MISSING = object()


def pad_stack(tensors: Sequence[torch.Tensor], pad_value: float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad tensors of equal rank to the largest size on every dim; returns (batch, mask).

    >>> b, m = pad_stack([torch.ones(2), torch.ones(3)]); b.shape, m.sum().item()
    (torch.Size([2, 3]), 5)
    """
    ndim = tensors[0].dim()
    if any(t.dim() != ndim for t in tensors):
        raise ValueError(f"cannot pad tensors of different ranks: {[tuple(t.shape) for t in tensors]}")
    shape = [max(t.shape[d] for t in tensors) for d in range(ndim)]
    out = tensors[0].new_full((len(tensors), *shape), pad_value)
    mask = torch.zeros((len(tensors), *shape), dtype=torch.bool)
    for i, t in enumerate(tensors):
        region = (i, *[slice(0, s) for s in t.shape])
        out[region] = t
        mask[region] = True
    return out, mask


class Collate:
    """A collate with options: ``masks`` names modalities that always get a ``__mask__``
    entry (so a batch whose token lists happen to have equal lengths has the same schema).

    >>> stream = mmloader.Stream(ds, batch_size=32, collate_fn=Collate(masks=["caption"]))  # doctest: +SKIP
    """

    def __init__(self, masks: Sequence[str] = (), pad_value: float = 0):
        self.masks, self.pad_value = tuple(masks), pad_value

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate(samples, self.pad_value, self.masks)

    def columns(self, columns: dict[str, Any]) -> dict[str, Any]:
        return collate_columns(columns, self.pad_value, self.masks)


def pack(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate 1-D tensors; returns (flat, offsets) with ``len(offsets) == len(tensors) + 1``."""
    lengths = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return (torch.cat(list(tensors)) if tensors else torch.empty(0, dtype=torch.uint8)), offsets


def unpack(batch: dict[str, Any], name: str) -> list[torch.Tensor]:
    """The per-sample tensors of a packed modality (views, no copy).

    >>> flat, offsets = pack([torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8)])
    >>> [t.tolist() for t in unpack({"x": flat, "__offsets__": {"x": offsets}}, "x")]
    [[1, 2], [3]]
    """
    flat, offsets = batch[name], batch["__offsets__"][name].tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


class Packed(NamedTuple):
    """A column already packed by its reader (``ImageReader(decode="raw")`` in the batched path)."""
    flat: torch.Tensor
    offsets: torch.Tensor


class Stacked(NamedTuple):
    """A column its reader already assembled into one batch tensor (decoded in a thread pool)."""
    tensor: torch.Tensor


def collate(samples: Sequence[dict[str, Any]], pad_value: float = 0, masks: Sequence[str] = ()) -> dict[str, Any]:
    """The default collate for :class:`mmloader.Stream` batches (rows of samples)."""
    names: dict[str, None] = {}
    for s in samples:
        names.update(dict.fromkeys(s))
    columns = {name: [s.get(name, _MISSING) for s in samples] for name in names}
    return collate_columns(columns, pad_value, masks)


def collate_columns(columns: dict[str, Any], pad_value: float = 0, masks: Sequence[str] = ()) -> dict[str, Any]:
    """The same batch from columns (``name -> list of values``, or :class:`Packed`)."""
    batch: dict[str, Any] = {}
    always_mask = set(masks)
    masks_out: dict[str, torch.Tensor] = {}
    offsets_out: dict[str, torch.Tensor] = {}
    present: dict[str, torch.Tensor] = {}
    for name, values in columns.items():
        if isinstance(values, Packed):
            batch[name], offsets_out[name] = values.flat, values.offsets
            continue
        if isinstance(values, Stacked):
            batch[name] = values.tensor
            continue
        have = [v is not _MISSING for v in values]
        if not all(have):
            present[name] = torch.tensor(have)
        real = [v for v in values if v is not _MISSING]
        first = real[0]
        if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in real):
            if all(v.dim() == 1 and v.dtype == torch.uint8 for v in real):
                empty = first.new_empty(0)
                batch[name], offsets_out[name] = pack([v if h else empty for v, h in zip(values, have)])
            elif all(v.shape == first.shape for v in real) and name not in always_mask:
                filler = torch.zeros_like(first)
                batch[name] = torch.stack([v if h else filler for v, h in zip(values, have)])
            else:
                filler = first.new_zeros((0,) * first.dim())
                padded, mask = pad_stack([v if h else filler for v, h in zip(values, have)], pad_value)
                batch[name], masks_out[name] = padded, mask
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in real):
            batch[name] = torch.tensor([v if h else 0 for v, h in zip(values, have)])
        else:
            batch[name] = [v if h else None for v, h in zip(values, have)]
    if masks_out:
        batch["__mask__"] = masks_out
    if offsets_out:
        batch["__offsets__"] = offsets_out
    if present:
        batch["__present__"] = present
    return batch
