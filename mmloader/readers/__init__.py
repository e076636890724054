"""Per-modality lazy readers over any store."""

from __future__ import annotations

import os

from ..errors import UnsafeFieldError
from ..media.imageinfo import IMAGE_EXTENSIONS  # noqa: F401  (readers' API)
from ..storage import Store
from ..storage.text.store import TextLinesStore
from .audio import AudioReader
from .base import Reader
from .basic import ArrayReader, JSONReader, LabelReader, TextReader
from .document import Document, DocumentReader
from .image import ImageReader
from .registry import BUILTIN_READERS, KINDS, PICKLE_EXTENSIONS, is_pickle_field, kind_for_field  # noqa: F401
from .video import VideoReader, VideoTimestamps


def TextLinesReader(
    path: str | os.PathLike, *, index_path: str | os.PathLike | None = None, progress: bool = True, **kwargs
) -> TextReader:
    """Lines of a raw UTF-8 text file as a modality, with O(1) random access.

    The line-offset sidecar is built on first use (with a progress bar) and mmapped.

    >>> lines = TextLinesReader("corpus.txt"); lines[12_000_000]    # doctest: +SKIP

    Args:
        path: the text file.
        index_path: where the line-offset sidecar goes (default: beside the file).
        progress: show a progress bar while building the sidecar.
        **kwargs: options of :class:`TextReader` (``tokenizer=``...).
    """
    return TextReader(TextLinesStore(path, index_path=index_path, progress=progress), "txt", **kwargs)


def reader_for(source: str | os.PathLike | Store, field: str, *, allow_pickle: bool = False, **options) -> Reader:
    """The natural reader for a field, chosen by its extension (``jpg`` -> ImageReader...), from
    the one registry of reader kinds (:mod:`mmloader.readers.registry`).

    Pickle-like fields (``pyd``, ``pth``, ``pickle``...) raise: unpickling runs code.

    Args:
        source: a dataset path or URL, or an open store.
        field: the field to read (``jpg``, ``txt``...).
        allow_pickle: read a pickle-like field as raw bytes instead of refusing it (decode it
            yourself with a trusted loader).
        **options: options of the chosen reader.
    """
    if is_pickle_field(field):
        if not allow_pickle:
            raise UnsafeFieldError(
                f"field {field!r} holds pickled Python objects; reading it can run "
                "arbitrary code. mmloader does not unpickle by default; read it with "
                "Reader(..., decode=your_trusted_loader) if you trust the source",
                field=field,
            )
        return Reader(source, field, **options)
    return kind_for_field(field).cls(source, field, **options)


__all__ = [
    "Reader",
    "ImageReader",
    "VideoReader",
    "AudioReader",
    "VideoTimestamps",
    "TextReader",
    "LabelReader",
    "JSONReader",
    "ArrayReader",
    "DocumentReader",
    "Document",
    "TextLinesReader",
    "reader_for",
]
