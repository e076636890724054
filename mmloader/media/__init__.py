"""Media headers without decoding (torch-free): image format and size (:mod:`.imageinfo`), video
and audio probing, limits and strict decoding (:mod:`.mediainfo`, PyAV imported lazily)."""

from .. import _submodules_on_access

__getattr__ = _submodules_on_access(__name__)
