"""Aligned samples from per-modality readers: :func:`zip_readers` (``mmloader.zip``, in
:mod:`.zip`), batches from them (:mod:`.collate`) and weighted mixes of datasets (:mod:`.mix`)."""

from .zip import Zipped, zip_readers

__all__ = ["Zipped", "zip_readers"]
from .. import _submodules_on_access

__getattr__ = _submodules_on_access(__name__)
