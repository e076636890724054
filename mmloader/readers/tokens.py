"""Tokenizing text while loading: a whole batch per ``encode_batch`` call.

Hugging Face ``tokenizers`` encodes a batch in Rust without the GIL (``pip install
'mmloader[text]'``), so the thread backend's threads tokenize in parallel and no worker
process pays for pickling token lists. Measured in ``benchmarks/text.py``.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Sequence

import numpy as np
import torch

from ..media.tokenizer import encode_batch, load_tokenizer  # noqa: F401  (readers' API)
from .columns import Ragged, offsets_of


def token_ids(encodings: Sequence[Any]) -> Ragged:
    """``encode_batch``'s answers as one int32 :class:`Ragged` column (ids end to end)."""
    ids = [e.ids for e in encodings]
    offsets = offsets_of(ids)
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return Ragged(torch.from_numpy(flat), torch.from_numpy(offsets))


class OwnsTokenizer:
    """What a reader with a ``tokenizer`` shares: loaded when the reader is made (a wrong path
    fails there), and a path loaded again in each worker rather than pickled."""

    tokenizer: Any
    add_special_tokens: bool
    _loaded: Any

    def _set_tokenizer(self, tokenizer: Any, add_special_tokens: bool) -> None:
        if not isinstance(add_special_tokens, bool):
            raise TypeError(f"add_special_tokens={add_special_tokens!r}: expected True or False")
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens
        self._loaded = load_tokenizer(tokenizer) if tokenizer is not None else None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if isinstance(self.tokenizer, (str, os.PathLike)):
            state["_loaded"] = None
        return state

    def _tokenizer(self) -> Any:
        if self._loaded is None:
            self._loaded = load_tokenizer(self.tokenizer)
        return self._loaded
