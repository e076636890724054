"""Live sources: samples that arrive while training, streamed by steps with the stored streams'
guarantees where they can hold — the source (:mod:`.source`), its readers' bounded read-ahead
(:mod:`.fetch`), the ranks' agreement on each batch (:mod:`.agree`, :mod:`.delivery`), the stream
(:mod:`.stream`; its steps :mod:`.steps`, slice positions :mod:`.positions`, batch building
:mod:`.feeding`) and a reader for ``multiprocessing`` queues (:mod:`.queue`)."""

from .. import _submodules_on_access
from .stream import LiveStream

__all__ = ["LiveStream"]

__getattr__ = _submodules_on_access(__name__)
