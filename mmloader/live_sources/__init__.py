"""Live sources: samples that arrive while training, streamed by steps with the stored streams'
guarantees where they can hold — the source (:mod:`.source`), its readers' bounded read-ahead
(:mod:`.fetch`), the ranks' agreement on each batch (:mod:`.agree`), the stream (:mod:`.stream`)
and a reader for ``multiprocessing`` queues (:mod:`.queue`)."""

from .. import _submodules_on_access
from ..align.mix import LiveMix
from ..loading.stream import STREAM_KINDS
from .stream import LiveStream


def _is_live(dataset: object) -> bool:
    return getattr(dataset, "is_live_source", False) or isinstance(dataset, LiveMix)


# `mmloader.Stream(live_source_or_mix, ...)` makes a LiveStream (registered once per process).
if not any(kind is LiveStream for _accepts, kind in STREAM_KINDS):
    STREAM_KINDS.append((_is_live, LiveStream))

__getattr__ = _submodules_on_access(__name__)
