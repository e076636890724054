"""The options of a stream, one small object per stage of its plan.

Each owns its validation (when it is made, naming the option), its part of the
stream's :meth:`~mmloader.Stream.identity` and its step of the plan, whose
arithmetic stays pure in :mod:`mmloader.planning`:

* :class:`Order` — shuffle, seed, blocks and window: the epoch's order of samples;
* :class:`Batching` — batch size, ``drop_last``, padding and collate: the split into
  equal batches per rank;
* the length slot, one of :class:`Bucketing` (batches of similar lengths) or
  :class:`Packing` (rows filled to a token budget): a stream has at most one;
* :class:`Errors` — what a bad sample does.

The common case needs none of them: ``Stream(ds, batch_size=64, seed=0)``.
"""

from .batching import PADDING, Batching
from .error_policy import ON_ERROR, Errors
from .lengths import Bucketing, LengthPolicy, Packing
from .order import Order

__all__ = ["Batching", "Bucketing", "Errors", "LengthPolicy", "ON_ERROR", "Order", "PADDING", "Packing"]
