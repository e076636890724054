"""Tokenizing text while loading: a whole batch per ``encode_batch`` call.

Hugging Face ``tokenizers`` encodes a batch in Rust without the GIL (``pip install
'mmloader[text]'``), so the thread backend's threads tokenize in parallel and no worker
process pays for pickling token lists. Measured in ``benchmarks/text.py``.
"""

from __future__ import annotations

import itertools
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
