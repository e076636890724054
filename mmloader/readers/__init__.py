"""Per-modality lazy readers over any store."""
from __future__ import annotations

import os

from ..errors import UnsafeFieldError
from ..media.imageinfo import IMAGE_EXTENSIONS
from ..storage import Store
from ..storage.textlines import TextLinesStore
from .base import Reader
from .basic import ArrayReader, JSONReader, LabelReader, TextReader
from .image import ImageReader
from ..media.mediainfo import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS
from .audio import AudioReader
from .video import VideoReader, VideoTimestamps

PICKLE_EXTENSIONS = ("pyd", "pth", "pt", "pickle", "pkl", "pyd.gz", "pth.gz", "pickle.gz")


def TextLinesReader(path: str | os.PathLike, *, index_path: str | os.PathLike | None = None,
                    progress: bool = True, **kwargs) -> TextReader:
    """Lines of a raw UTF-8 text file as a modality, with O(1) random access.

    The line-offset sidecar is built on first use (with a progress bar) and mmapped.

    >>> lines = TextLinesReader("corpus.txt"); lines[12_000_000]    # doctest: +SKIP
    """
    return TextReader(TextLinesStore(path, index_path=index_path, progress=progress), "txt", **kwargs)


def reader_for(source: str | os.PathLike | Store, field: str, *, allow_pickle: bool = False,
               **options) -> Reader:
    """The natural reader for a field, chosen by its extension (``jpg`` -> ImageReader...).

    Pickle-like fields (``pyd``, ``pth``, ``pickle``...) raise: unpickling runs code.
    """
    base = field[:-3] if field.endswith(".gz") else field
    ext = base.rsplit(".", 1)[-1].lower()
    if field.lower() in PICKLE_EXTENSIONS or ext in PICKLE_EXTENSIONS:
        if not allow_pickle:
            raise UnsafeFieldError(f"field {field!r} holds pickled Python objects; reading it can run "
                                   "arbitrary code. mmloader does not unpickle by default; read it with "
                                   "Reader(..., decode=your_trusted_loader) if you trust the source",
                                   field=field)
        return Reader(source, field, **options)
    if ext in IMAGE_EXTENSIONS:
        return ImageReader(source, field, **options)
    if ext in VIDEO_EXTENSIONS:
        return VideoReader(source, field, **options)
    if ext in AUDIO_EXTENSIONS:
        return AudioReader(source, field, **options)
    if ext in ("txt", "text", "caption"):
        return TextReader(source, field, **options)
    if ext in ("cls", "cls2", "label", "index", "idx"):
        return LabelReader(source, field, **options)
    if ext == "json":
        return JSONReader(source, field, **options)
    if ext == "npy":
        return ArrayReader(source, field, **options)
    return Reader(source, field, **options)


#: Readers whose decoding is mmloader's own (C decoders, no user Python per sample).
BUILTIN_READERS = (Reader, ImageReader, TextReader, LabelReader, JSONReader, ArrayReader, VideoReader,
                   VideoTimestamps, AudioReader)

__all__ = ["Reader", "ImageReader", "VideoReader", "AudioReader", "VideoTimestamps", "TextReader", "LabelReader", "JSONReader", "ArrayReader",
           "TextLinesReader", "reader_for"]
