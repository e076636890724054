"""Media headers without decoding (torch-free): image format and size (:mod:`.imageinfo`), video
and audio probing, limits and strict decoding (:mod:`.mediainfo`, PyAV imported lazily)."""
