"""Column forms a reader can hand back for a whole batch (``Reader.from_column``) besides a list."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Packed(NamedTuple):
    """Encoded bytes of a batch in one buffer (``ImageReader(output="raw")``): ``flat`` and the
    ``B + 1`` ``offsets`` of its samples. One buffer is one shared-memory segment between
    processes and one host-to-device copy."""
    flat: torch.Tensor
    offsets: torch.Tensor


class Stacked(NamedTuple):
    """A batch tensor the reader assembled itself (images decoded in place, channels_last)."""
    tensor: torch.Tensor
