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

# name -> (module, attribute): the torch-facing API, imported on first use.
_LAZY = {
    "SampleCache": (".cache", "SampleCache"), "Reader": (".readers", "Reader"),
    "ImageReader": (".readers", "ImageReader"), "TextReader": (".readers", "TextReader"),
    "LabelReader": (".readers", "LabelReader"), "JSONReader": (".readers", "JSONReader"),
    "ArrayReader": (".readers", "ArrayReader"), "VideoReader": (".readers", "VideoReader"),
    "AudioReader": (".readers", "AudioReader"), "TextLinesReader": (".readers", "TextLinesReader"),
    "reader_for": (".readers", "reader_for"), "readers": (".readers", None),
    "zip": (".align", "zip_readers"), "Zipped": (".align", "Zipped"),
    "Collate": (".batching", "Collate"), "collate": (".batching", "collate"), "unpack": (".batching", "unpack"),
    "Stream": (".stream", "Stream"), "Loader": (".dataloader", "Loader"),
    "ThreadLoader": (".dataloader", "ThreadLoader"), "loader": (".dataloader", "loader"),
    "Mix": (".mixture", "Mix"), "mix": (".mixture", "mix"), "from_config": (".config", "from_config"),
    "GPUDecode": (".gpu", "GPUDecode"), "rng": (".seeding", "rng"),
}


def __getattr__(name: str) -> Any:
    entry = _LAZY.get(name)
    if entry is None:
        try:  # a submodule, e.g. mmloader.config.is_config_path after a plain `import mmloader`
            return import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module 'mmloader' has no attribute {name!r}") from None
    module, attr = entry
    mod = import_module(module, __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# ``open`` and ``zip`` are meant as ``mmloader.open`` / ``mmloader.zip``: a star import must
# not replace the builtins of the same name in the importer's namespace.
__all__ = ["__version__", "LMDBWriter", "ShardWriter", "Store", "build_index", "writer_for",
           "MMLoaderError", "FormatError", "SampleError", "DecodeError", "SizeLimitError",
           "UnsafeFieldError", "RandomAccessError", "AlignmentError", "ConfigError",
           *(name for name in _LAZY if name not in ("zip", "readers"))]
