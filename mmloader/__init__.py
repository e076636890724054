"""mmloader: multi-modal datasets for PyTorch over LMDB and WebDataset-style tar shards.

>>> import mmloader
>>> ds = mmloader.zip(image=mmloader.ImageReader("pairs.lmdb"),
...                   caption=mmloader.TextReader("pairs.lmdb"))          # doctest: +SKIP
>>> loader = mmloader.loader(mmloader.Stream(ds, batch_size=64, seed=0))   # doctest: +SKIP

Storage (writers, ``open``) imports without torch, so converters start fast; the
torch-facing API (readers, zip, Stream, loader...) is imported on first use.
"""
from importlib import import_module
from typing import Any

from ._version import __version__
from .errors import (AlignmentError, ConfigError, DecodeError, FormatError, MMLoaderError,
                     RandomAccessError, SampleError, SizeLimitError, UnsafeFieldError)
from .storage import LMDBWriter, ShardWriter, Store, build_index, writer_for
from .storage import open_store as open

_LAZY = {
    "SampleCache": ".cache", "Reader": ".readers", "ImageReader": ".readers", "TextReader": ".readers",
    "LabelReader": ".readers", "JSONReader": ".readers", "ArrayReader": ".readers",
    "TextLinesReader": ".readers", "reader_for": ".readers", "readers": ".readers",
    "zip": ".align", "Zipped": ".align", "Collate": ".batching", "collate": ".batching", "unpack": ".batching",
    "Stream": ".stream", "Loader": ".dataloader", "ThreadedLoader": ".dataloader", "loader": ".dataloader",
    "Mix": ".mixture", "mix": ".mixture", "from_config": ".config", "GPUDecode": ".gpu",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mmloader' has no attribute {name!r}")
    mod = import_module(module, __name__)
    value = mod if name == "readers" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["__version__", "open", "LMDBWriter", "ShardWriter", "Store", "build_index", "writer_for",
           "MMLoaderError", "FormatError", "SampleError", "DecodeError", "SizeLimitError",
           "UnsafeFieldError", "RandomAccessError", "AlignmentError", "ConfigError", *_LAZY]
__all__.remove("readers")
