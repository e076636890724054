"""Readers for text, integer labels, JSON and numpy arrays."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import torch

from .base import Reader, _gunzip, accepts_views
from .columns import Ragged, offsets_of
from .npy import npy_array, owned
from .tokens import OwnsTokenizer, encode_batch, token_ids


class TextReader(OwnsTokenizer, Reader):
    """UTF-8 text -> ``str``; with ``tokenizer`` -> its token ids (1-D int32 tensor).

    ``tokenizer``: a ``tokenizer.json`` path or a Hugging Face ``tokenizers.Tokenizer``
    (``pip install 'mmloader[text]'``). A batch is tokenized with one ``encode_batch``
    call, in Rust without the GIL, and padded to its longest line with a mask by the
    collate (padding set in the tokenizer is turned off: it would count as tokens);
    ``add_special_tokens`` as the tokenizer defines them (BOS/EOS...).
    ``transform`` runs after that, per sample, in the worker.

    >>> captions = TextReader("pairs.lmdb"); captions[0]     # doctest: +SKIP
    'a red circle on a blue background'
    >>> ids = TextReader("corpus.lmdb", tokenizer="tokenizer.json"); ids[0]     # doctest: +SKIP
    tensor([  1, 517, 2904,   2], dtype=torch.int32)
    """

    default_field = "txt"
    field_extensions = ("txt", "txt.gz")

    def __init__(
        self, source: Any, field: str | None = None, *, tokenizer: Any = None, add_special_tokens: bool = True, **kwargs
    ):
        super().__init__(source, field, **kwargs)
        self._set_tokenizer(tokenizer, add_special_tokens)

    @property
    def releases_gil(self) -> bool:  # type: ignore[override]
        return self.tokenizer is not None and self._decode_fn is None and self.transform is None

    @accepts_views
    def decode(self, data: bytes, key: str) -> Any:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        text = str(data, "utf-8")
        if self.tokenizer is None:
            return text
        ids = self._tokenizer().encode(text, add_special_tokens=self.add_special_tokens).ids
        return torch.tensor(ids, dtype=torch.int32)

    def token_counts(self, rows: Sequence[int]) -> np.ndarray:
        """Token ids per row, by tokenizing the stored text (in chunks, in Rust): what packing
        plans with. Needs ``tokenizer``; ``decode=`` or ``transform=`` may change the ids, so
        give packing the lengths (``mmloader.tokens(length=...)``) when they are set."""
        if self.tokenizer is None or self._decode_fn is not None or self.transform is not None:
            return super().token_counts(rows)
        out = np.zeros(len(rows), dtype=np.int64)
        rows = list(rows)
        for a in range(0, len(rows), 8192):
            chunk = rows[a : a + 8192]
            texts = [self._stored_text(v, f) for v, f in self._first_present(chunk)]
            encoded = encode_batch(self._tokenizer(), texts, self.add_special_tokens)
            out[a : a + len(texts)] = [len(e.ids) for e in encoded]
        return out

    def _first_present(self, rows: list[int]) -> list[tuple[Any, str]]:
        """Each row's value of the first of this reader's fields it has (alternatives), and that field."""
        columns = [(f, self.store.field_values(rows, f)) for f in self.fields]
        out = []
        for j in range(len(rows)):
            out.append(next(((c[j], f) for f, c in columns if c[j] is not None), (None, self.fields[0])))
        return out

    def _stored_text(self, value: Any, field: str) -> str:
        if value is None:
            return ""
        data = _gunzip(bytes(value), self.max_field_bytes) if field.endswith(".gz") else value
        return str(data, "utf-8", "replace")

    def from_column(
        self, datas: list, keys: list[str], *, share_memory: bool = False, fields: Sequence[str | None] | None = None
    ) -> Any:
        if self.plain_column(datas):
            try:
                texts = [str(d, "utf-8") for d in datas]
                if self.tokenizer is None:
                    return texts
                return token_ids(encode_batch(self._tokenizer(), texts, self.add_special_tokens))
            except Exception:
                pass  # redo sample by sample: the error must name its key
        return super().from_column(datas, keys, share_memory=share_memory, fields=fields)


class LabelReader(Reader):
    """An ASCII integer label (``b"7"``) -> ``int``.

    >>> LabelReader("imagenet.lmdb")[0]     # doctest: +SKIP
    7
    """

    default_field = "cls"

    @accepts_views
    def decode(self, data: bytes, key: str) -> int:
        text = str(data, "ascii").strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"label {text[:40]!r} is not an integer") from None


class JSONReader(Reader):
    """JSON text -> ``dict`` (or whatever JSON value is stored).

    >>> JSONReader("pairs.lmdb")[0]["width"]     # doctest: +SKIP
    """

    default_field = "json"

    def decode(self, data: bytes, key: str) -> Any:
        return json.loads(data.decode("utf-8"))


class ArrayReader(Reader):
    """A ``.npy`` field -> ``torch.Tensor``. Object (pickled) arrays are refused.

    A batch of 1-D arrays of one dtype (token ids) is read as one buffer and padded to
    its longest with a mask by the collate, in one step.

    >>> ArrayReader("feats.lmdb", field="npy")[0].shape     # doctest: +SKIP
    """

    default_field = "npy"

    @accepts_views
    def decode(self, data: bytes, key: str) -> torch.Tensor:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        return torch.from_numpy(owned(npy_array(data)))

    def token_counts(self, rows: Sequence[int]) -> np.ndarray:
        """Elements per row of 1-D arrays (token ids), from stored sizes: the store's index says
        each value's size; stored headers (of up to 16 rows across the store, which must agree)
        say how much of it is header and how wide an id is. Absent values count 0; a value too
        small to hold the header counts 0 (it fails, by key, when it is read)."""
        if self._decode_fn is not None or self.transform is not None or len(self.fields) != 1 or self.gzipped:
            return super().token_counts(rows)
        rows = list(rows)
        sizes = np.asarray(self.store.field_sizes(rows, self.field), dtype=np.int64)
        present = np.flatnonzero(sizes > 0)
        if not len(present):
            return np.zeros(len(rows), dtype=np.int64)
        probes = sorted({int(present[int(j)]) for j in np.linspace(0, len(present) - 1, min(16, len(present)))})
        layouts: dict[tuple[int, int], str] = {}
        problems = []
        for j in probes:
            data = self.store.field_values([rows[j]], self.field)[0]
            key = self.store.key(rows[j])
            try:
                array = npy_array(data)
            except Exception as e:  # noqa: BLE001 - a corrupt value: named, the others still probed
                problems.append(f"{key!r}: {e}")
                continue
            if array.ndim != 1 or array.dtype.kind not in "iu":
                raise TypeError(
                    f"{self.store.path}: {self.field!r} of sample {key!r} is a {array.ndim}-D {array.dtype} "
                    "array, not 1-D integer token ids"
                )
            layouts.setdefault((len(data) - array.nbytes, array.dtype.itemsize), key)
        if len(layouts) > 1:
            raise TypeError(
                f"{self.store.path}: {self.field!r} holds token ids of more than one dtype or header "
                f"({', '.join(f'{k!r}: {w}-byte ids' for (_h, w), k in layouts.items())}): their counts cannot "
                "come from sizes; give Stream(length_by=mmloader.tokens(..., length=...))"
            )
        if not layouts:
            raise TypeError(
                f"{self.store.path}: no readable {self.field!r} value among {len(probes)} probed: {problems[0]}"
            )
        ((header, width),) = layouts
        counts = (sizes - header) // width
        return np.where((sizes > 0) & (counts > 0), counts, 0)

    def from_column(
        self, datas: list, keys: list[str], *, share_memory: bool = False, fields: Sequence[str | None] | None = None
    ) -> Any:
        if datas and self.plain_column(datas):
            try:
                arrays = [npy_array(d) for d in datas]
            except Exception:
                arrays = None  # the per-sample path names the key
            if (
                arrays is not None
                and all(a.ndim == 1 and a.dtype == arrays[0].dtype for a in arrays)
                and arrays[0].dtype.kind in "biufc"
            ):
                # one copy (the views' memory may go away), in native byte order
                flat = np.concatenate(arrays, dtype=arrays[0].dtype.newbyteorder("="))
                try:
                    return Ragged(torch.from_numpy(flat), torch.from_numpy(offsets_of(arrays)))
                except TypeError:
                    pass  # a dtype torch cannot hold (long double...): the per-sample path names the key
        return super().from_column(datas, keys, share_memory=share_memory, fields=fields)
