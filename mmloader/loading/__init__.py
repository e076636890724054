"""One rank's batches, in order, resumable: the :class:`~.stream.Stream` (plan, split, build),
the two backends (:mod:`.threaded`, :mod:`.dataloader` with its shared-memory :mod:`.ring`),
the pass and resume protocol they share (:mod:`.resumable`), state shared with workers
(:mod:`.control`), GPU decoding (:mod:`.gpu`) and experiment configs (:mod:`.config`)."""

from .. import _submodules_on_access

__getattr__ = _submodules_on_access(__name__)
