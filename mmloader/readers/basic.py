"""Readers for text, integer labels, JSON and numpy arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np
import torch

from .base import Reader, accepts_views
from .columns import Ragged, offsets_of
from .npy import npy_array, owned
from .tokens import encode_batch, load_tokenizer, token_ids


class TextReader(Reader):
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
        if not isinstance(add_special_tokens, bool):
            raise TypeError(f"add_special_tokens={add_special_tokens!r}: expected True or False")
        super().__init__(source, field, **kwargs)
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens
        # loaded now, so a wrong path fails here; a path is loaded again in each worker
        self._loaded = load_tokenizer(tokenizer) if tokenizer is not None else None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if isinstance(self.tokenizer, (str, os.PathLike)):
            state["_loaded"] = None
        return state

    @property
    def releases_gil(self) -> bool:  # type: ignore[override]
        return self.tokenizer is not None and self._decode_fn is None and self.transform is None

    def _tokenizer(self):
        if self._loaded is None:
            self._loaded = load_tokenizer(self.tokenizer)
        return self._loaded

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
            values = self.store.field_values(rows[a : a + 8192], self.field)
            texts = [str(v, "utf-8", "replace") if v is not None else "" for v in values]
            encoded = encode_batch(self._tokenizer(), texts, self.add_special_tokens)
            out[a : a + len(texts)] = [len(e.ids) for e in encoded]
        return out

    def from_column(self, datas: list, keys: list[str], *, share_memory: bool = False) -> Any:
        if self.plain_column(datas):
            try:
                texts = [str(d, "utf-8") for d in datas]
                if self.tokenizer is None:
                    return texts
                return token_ids(encode_batch(self._tokenizer(), texts, self.add_special_tokens))
            except Exception:
                pass  # redo sample by sample: the error must name its key
        return super().from_column(datas, keys, share_memory=share_memory)


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
        each value's size; one stored header says how much of it is header and how wide an id is.
        Absent values count 0."""
        if self._decode_fn is not None or self.transform is not None or len(self.fields) != 1 or self.gzipped:
            return super().token_counts(rows)
        rows = list(rows)
        sizes = np.asarray(self.store.field_sizes(rows, self.field), dtype=np.int64)
        present = np.flatnonzero(sizes > 0)
        if not len(present):
            return np.zeros(len(rows), dtype=np.int64)
        first = rows[int(present[0])]
        data = self.store.field_values([first], self.field)[0]
        array = npy_array(data)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise TypeError(
                f"{self.store.path}: {self.field!r} of row {first} is a {array.ndim}-D {array.dtype} array, "
                "not 1-D integer token ids"
            )
        header = len(data) - array.nbytes
        return np.where(sizes > 0, (sizes - header) // array.dtype.itemsize, 0)

    def from_column(self, datas: list, keys: list[str], *, share_memory: bool = False) -> Any:
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
        return super().from_column(datas, keys, share_memory=share_memory)
