"""The kinds of reader, in one registry: what ``reader_for`` picks by a field's extension, what a
config's ``reader:`` names, and which readers decode with mmloader's own code.

>>> from mmloader.readers.registry import KINDS, kind_for_field
>>> kind_for_field("img.jpg").name, kind_for_field("meta.json").cls.__name__
('image', 'JSONReader')
>>> sorted(KINDS)
['array', 'audio', 'bytes', 'document', 'image', 'json', 'label', 'text', 'video']
"""

from __future__ import annotations

from dataclasses import dataclass

from ..media.imageinfo import IMAGE_EXTENSIONS
from ..media.mediainfo import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS
from .audio import AudioReader
from .base import Reader
from .basic import ArrayReader, JSONReader, LabelReader, TextReader
from .document import DocumentReader
from .image import ImageReader
from .video import VideoReader, VideoTimestamps


@dataclass(frozen=True)
class ReaderKind:
    """One kind of reader.

    Args:
        name: its name in configs (``reader: image``).
        cls: the reader class.
        extensions: field extensions it is the natural reader for (``reader_for``).
    """

    name: str
    cls: type
    extensions: tuple[str, ...] = ()


KINDS: dict[str, ReaderKind] = {
    kind.name: kind
    for kind in (
        ReaderKind("image", ImageReader, tuple(IMAGE_EXTENSIONS)),
        ReaderKind("video", VideoReader, tuple(VIDEO_EXTENSIONS)),
        ReaderKind("audio", AudioReader, tuple(AUDIO_EXTENSIONS)),
        ReaderKind("text", TextReader, ("txt", "text", "caption")),
        ReaderKind("label", LabelReader, ("cls", "cls2", "label", "index", "idx")),
        ReaderKind("json", JSONReader, ("json",)),
        ReaderKind("array", ArrayReader, ("npy",)),
        ReaderKind("document", DocumentReader),  # interleaved texts and images (a json layout)
        ReaderKind("bytes", Reader),  # raw bytes: any other field
    )
}

#: Readers whose decoding is mmloader's own (C decoders, no user Python per sample): the kinds,
#: plus the timestamps companion of a video modality.
BUILTIN_READERS: tuple[type, ...] = (*(kind.cls for kind in KINDS.values()), VideoTimestamps)

#: Fields holding pickled Python objects: never read by default (unpickling runs code).
PICKLE_EXTENSIONS = ("pyd", "pth", "pt", "pickle", "pkl", "pyd.gz", "pth.gz", "pickle.gz")

_BY_EXTENSION = {ext: kind for kind in KINDS.values() for ext in kind.extensions}


def extension_of(field: str) -> str:
    """A field's extension as reader_for sees it: the last dotted part, a ``.gz`` looked through."""
    base = field[:-3] if field.endswith(".gz") else field
    return base.rsplit(".", 1)[-1].lower()


def kind_for_field(field: str) -> ReaderKind:
    """The kind of reader natural for ``field`` (``bytes`` when its extension names none)."""
    return _BY_EXTENSION.get(extension_of(field), KINDS["bytes"])


def is_pickle_field(field: str) -> bool:
    """Whether ``field`` holds pickled objects (by its name or extension)."""
    return field.lower() in PICKLE_EXTENSIONS or extension_of(field) in PICKLE_EXTENSIONS
