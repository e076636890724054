"""Packed batches: rows of whole samples laid end to end in a fixed token budget.

Each sample is one *segment* of its row: its images' placeholder tokens (``per_image``
copies of ``image_token_id`` each, as Hugging Face vision-language processors expand an
image token) followed by its text token ids; an interleaved document's segment is its
texts and images in document order. A packed batch holds, for ``B`` rows of ``L`` tokens:

* ``batch[text]``: ``(B, L)`` token ids, ``pad_id`` after each row's last segment;
* ``batch["__mask__"][text]``: ``(B, L)`` bool, True on real tokens;
* ``batch["position_ids"]``: ``(B, L)`` int64, restarting at 0 at each segment (and at the
  row's padding, which is a segment of its own), as padding-free attention takes them;
* ``batch["cu_seqlens"]``: int32 boundaries of every segment (padding included) in the
  flattened ``B * L`` tokens, and ``batch["max_seqlen"]`` (int), as FlashAttention's varlen
  kernels take them;
* ``batch["seq_lens"]``: ``(B, S)`` int32, the tokens of each sample of each row, aligned with
  ``batch["__key__"]`` (0 for an empty sample and after the row's last);
* image modalities: every image of the batch in row order, ``(N, C, H, W)`` when they share
  a shape (else a list), with ``batch["__row__"][name]`` and ``batch["__sample__"][name]``
  (``(N,)`` int64) the row of each image and its sample's place in that row;
* ``batch["__key__"]`` and every other field: a list of ``B`` lists, in row order (None where a
  sample of a mix lacks the field).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import SampleError
from .collate import stack_or_list

#: Names a packed batch adds; a modality of one of these names is refused.
PACKED_NAMES = ("position_ids", "cu_seqlens", "max_seqlen", "seq_lens")
OVERLONG = ("error", "truncate")


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """How samples become token segments, and how long each one is before it is read.

    Args:
        text: the modality of token ids: an ``ArrayReader`` of 1-D integer arrays (``convert
            textlines --tokenizer`` writes them), a ``TextReader(tokenizer=...)``, or a
            ``DocumentReader`` (texts and images in document order). None: the dataset's only one.
        images: image modalities of each sample, placed before its text.
        per_image: tokens each image takes in the row.
        image_token_id: the placeholder token of an image's tokens (needed when ``per_image``).
        pad_id: the token id after a row's last segment.
        length: the text tokens of each sample without reading it: ``index -> tokens`` (for a
            mix ``(source, index) -> tokens``) or one count per index (an array); None: measured
            from the store (an array's stored size; a tokenizer run once over the stored text).
        overlong: a sample over the budget is an error naming it (``"error"``), or its text
            is cut to fit (``"truncate"``).
    """

    text: str | None = None
    images: tuple[str, ...] = ()
    per_image: int = 0
    image_token_id: int | None = None
    pad_id: int = 0
    length: Callable[..., int] | Sequence[int] | np.ndarray | None = None
    overlong: str = "error"

    def __post_init__(self) -> None:
        if isinstance(self.images, str):
            object.__setattr__(self, "images", (self.images,))
        if isinstance(self.per_image, bool) or not isinstance(self.per_image, (int, np.integer)) or self.per_image < 0:
            raise ValueError(f"per_image={self.per_image!r}: expected a token count >= 0")
        if self.per_image and self.image_token_id is None:
            raise ValueError("per_image needs image_token_id: the token that stands for an image's tokens in a row")
        if self.overlong not in OVERLONG:
            raise ValueError(f"overlong={self.overlong!r}: expected one of {', '.join(map(repr, OVERLONG))}")

    def identity(self) -> dict:
        """What of the layout changes a plan (plain data, for resume states)."""
        from .identity import callable_name

        length = self.length
        return {
            "text": self.text,
            "images": list(self.images),
            "per_image": int(self.per_image),
            "overlong": self.overlong,
            "length": None if length is None else callable_name(length) if callable(length) else "array",
        }


def tokens(
    text: str | None = None,
    *,
    images: str | Sequence[str] = (),
    per_image: int = 0,
    image_token_id: int | None = None,
    pad_id: int = 0,
    length: Callable[..., int] | Sequence[int] | np.ndarray | None = None,
    overlong: str = "error",
) -> TokenLayout:
    """The token layout of packed rows, for ``Stream(pack_tokens=L, length_by=mmloader.tokens(...))``.

    Args:
        text: the modality of token ids (see :class:`TokenLayout`).
        images: image modalities, each image ``per_image`` tokens before the sample's text.
        per_image: tokens each image takes (576 for LLaVA's 336-px CLIP ViT-L/14).
        image_token_id: the placeholder token id of image tokens.
        pad_id: the id after a row's last segment.
        length: text tokens per sample, known without reading (callable or array).
        overlong: ``"error"`` or ``"truncate"`` for a sample over the budget.

    >>> layout = tokens("ids", images="image", per_image=576, image_token_id=32000)
    """
    return TokenLayout(
        text,
        tuple([images] if isinstance(images, str) else images),
        per_image,
        image_token_id,
        pad_id,
        length,
        overlong,
    )


def segment(sample: dict[str, Any], layout: TokenLayout, text: str, capacity: int) -> tuple[torch.Tensor, list]:
    """One sample as ``(token ids, the images of its document in order)``: the images of
    ``layout.images`` first, then the text (a document's texts and images in its order).

    Over ``capacity``: an error naming the sample, or with ``overlong="truncate"`` the first
    ``capacity`` tokens, an image whose placeholders would be cut left out with what follows it
    (a document's images are never cut in two; a sample's own images must fit)."""
    key = sample.get("__key__")
    parts: list[torch.Tensor] = []
    document_images: list[Any] = []
    at = 0
    cut = layout.overlong == "truncate"
    full = False  # truncating: the budget is reached, the rest is left out

    def image(value: Any, own: bool) -> None:
        nonlocal at, full
        if at + layout.per_image > capacity and cut:
            if own:
                raise SampleError(
                    f"sample {key!r}: its images take {layout.per_image * len(layout.images)} tokens or more, "
                    f"over the row's budget of {capacity}; raise pack_tokens"
                )
            full = True
            return
        parts.append(torch.full((layout.per_image,), int(layout.image_token_id or 0), dtype=torch.int64))
        at += layout.per_image
        if not own:
            document_images.append(value)

    for name in layout.images:
        value = sample.get(name)
        if value is not None:  # a tensor, a PIL image, encoded bytes: the reader's output
            image(value, own=True)
    held: Any = sample.get(text)
    pieces = held.pieces() if hasattr(held, "pieces") else [("text", held)] if held is not None else []
    for kind, piece in pieces:
        if full:
            break
        if kind == "image":
            image(piece, own=False)
        elif isinstance(piece, torch.Tensor) and piece.dim() == 1 and not piece.dtype.is_floating_point:
            if cut and at + len(piece) > capacity:
                piece, full = piece[: capacity - at], True
            parts.append(piece)  # (cast once, into the batch)
            at += len(piece)
        else:
            raise SampleError(f"sample {key!r}: {text!r} holds {type(piece).__name__}, not token ids (1-D integers)")
    ids = (parts[0] if len(parts) == 1 else torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.int64)
    if len(ids) > capacity:
        raise SampleError(
            f"sample {key!r} has {len(ids)} tokens, over the row's budget of {capacity}; "
            "raise pack_tokens or use overlong='truncate'"
        )
    return ids, document_images


def pack_batch(
    samples: Sequence[dict[str, Any] | None],
    offsets: Sequence[int],
    layout: TokenLayout,
    text: str,
    capacity: int,
    planned: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The packed batch of rows ``samples[offsets[r]:offsets[r+1]]`` (None: a sample left out).

    Args:
        samples: the decoded samples, row after row.
        offsets: row boundaries in ``samples`` (``B + 1`` of them).
        layout: how samples become segments.
        text: the token modality.
        capacity: tokens per row (``L``).
        planned: the tokens the plan counted for each sample: a sample with more is an error
            naming it (the plan's lengths were wrong), whether or not its row has room.
    """
    rows = len(offsets) - 1
    segments: list[torch.Tensor] = []
    lengths: list[int] = []
    row_of: list[int] = []
    images: dict[str, list[torch.Tensor]] = {}
    owners: dict[str, list[tuple[int, int]]] = {}
    image_names = set(layout.images)
    keys: list[Any] = []
    fields = list(dict.fromkeys(n for s in samples if s is not None for n in s if n != text and n not in image_names))
    listed: dict[str, list[list[Any]]] = {name: [[] for _ in range(rows)] for name in fields}
    for r in range(rows):
        first = offsets[r]
        members = [(first + j, s) for j, s in enumerate(samples[offsets[r] : offsets[r + 1]]) if s is not None]
        for j, (at_plan, sample) in enumerate(members):
            seg, doc_images = segment(sample, layout, text, capacity)
            if planned is not None and len(seg) > planned[at_plan]:
                raise SampleError(
                    f"sample {sample.get('__key__')!r} has {len(seg)} tokens, more than the {planned[at_plan]} "
                    "planned: give length_by the tokens the reader delivers"
                )
            segments.append(seg)
            lengths.append(len(seg))
            row_of.append(r)
            keys.append(sample.get("__key__"))
            for name in layout.images:
                got = [sample[name]] if sample.get(name) is not None else []
                images.setdefault(name, []).extend(got)
                owners.setdefault(name, []).extend([(r, j)] * len(got))
            if hasattr(sample.get(text), "pieces"):  # a document: its images, even none
                images.setdefault(text, []).extend(doc_images)
                owners.setdefault(text, []).extend([(r, j)] * len(doc_images))
            for name in fields:  # one value per sample, None where a sample lacks the field
                listed[name][r].append(sample.get(name))
    # Where each segment goes, for the whole batch at once: its row's start plus what the
    # segments before it in that row hold.
    n = np.asarray(lengths, dtype=np.int64)
    row = np.asarray(row_of, dtype=np.int64)
    ends = np.cumsum(n)
    used = np.bincount(row, weights=n, minlength=rows).astype(np.int64) if len(n) else np.zeros(rows, np.int64)
    row_first = np.concatenate([[0], np.cumsum(used)[:-1]]) if rows else np.zeros(0, np.int64)
    at = ends - n - row_first[row] if len(n) else n  # offset of each segment within its row
    over = np.flatnonzero(at + n > capacity)
    if len(over):
        j = int(over[0])
        raise SampleError(
            f"sample {keys[j]!r} has {int(n[j])} tokens, more than planned: its row holds "
            f"{int(used[row[j]])} of {capacity} (give length_by the tokens the reader delivers)"
        )
    flat_start = row * capacity + at
    dest = np.repeat(flat_start - (ends - n), n) + np.arange(int(ends[-1]) if len(n) else 0)
    ids = torch.full((rows * capacity,), int(layout.pad_id), dtype=torch.int64)
    mask = torch.zeros(rows * capacity, dtype=torch.bool)
    if len(dest):
        index = torch.from_numpy(dest)
        ids[index] = torch.cat(segments).to(torch.int64)
        mask[index] = True
    # Segments start at each sample (an empty one takes none) and at each row's padding.
    real = n > 0
    pad_rows = np.flatnonzero(used < capacity)
    starts = np.sort(np.concatenate([flat_start[real], pad_rows * capacity + used[pad_rows]]))
    marks = np.zeros(rows * capacity, dtype=np.int64)
    marks[starts] = starts
    positions = np.arange(rows * capacity, dtype=np.int64) - np.maximum.accumulate(marks)
    bounds = np.concatenate([starts, [rows * capacity]]).astype(np.int32)
    per_row = [n[row == r] for r in range(rows)]  # aligned with the row's keys (0: an empty sample)
    seq_lens = torch.zeros((rows, max(max((len(x) for x in per_row), default=0), 1)), dtype=torch.int32)
    for r, lens in enumerate(per_row):
        seq_lens[r, : len(lens)] = torch.from_numpy(lens.astype(np.int32))
    cu = torch.from_numpy(bounds)
    batch: dict[str, Any] = {"__key__": listed.pop("__key__", [[] for _ in range(rows)])}
    batch[text] = ids.view(rows, capacity)
    batch["position_ids"] = torch.from_numpy(positions).view(rows, capacity)
    batch["cu_seqlens"] = cu
    batch["max_seqlen"] = int(np.diff(bounds).max()) if len(bounds) > 1 else 0
    batch["seq_lens"] = seq_lens
    mask = mask.view(rows, capacity)
    for name, values in images.items():
        if name == text:  # a document's images: beside its tokens
            batch["__images__"] = {text: stack_or_list(values)}
        else:
            batch[name] = stack_or_list(values)
    batch.update(listed)
    batch["__mask__"] = {text: mask}
    if owners:
        batch["__row__"] = {n: torch.tensor([o[0] for o in v], dtype=torch.int64) for n, v in owners.items()}
        batch["__sample__"] = {n: torch.tensor([o[1] for o in v], dtype=torch.int64) for n, v in owners.items()}
    return batch


def measured(values: Any, what: str) -> np.ndarray:
    """``values`` as int64 token counts: whole numbers >= 0, else an error naming ``what``."""
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: token counts must be whole numbers ({e})") from None
    if raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iuf"):
        raise ValueError(
            f"{what}: expected one whole token count per sample, got {raw.dtype} values of shape {raw.shape}"
        )
    if raw.dtype.kind == "f" and raw.size and not np.all(np.isfinite(raw) & (raw == np.floor(raw))):
        raise ValueError(f"{what}: token counts must be whole numbers, got {raw[~(raw == np.floor(raw))][:3].tolist()}")
    out = raw.astype(np.int64)
    if len(out) and int(out.min()) < 0:
        raise ValueError(f"{what}: a negative token count ({int(out.min())})")
    return out
