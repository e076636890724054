"""mmloader: multi-modal datasets for PyTorch over LMDB and WebDataset-style tar shards.

>>> import mmloader
>>> ds = mmloader.zip(image=mmloader.ImageReader("pairs.lmdb"),
...                   caption=mmloader.TextReader("pairs.lmdb"))          # doctest: +SKIP
>>> loader = mmloader.loader(mmloader.Stream(ds, batch_size=64, seed=0))   # doctest: +SKIP

Storage (writers, ``open``) imports without torch, so converters start fast; it and the
torch-facing API (readers, zip, Stream, loader...) are imported on first use.
"""

# (private names: dir(mmloader) shows the API and the layer packages, nothing imported for its own use)
import sys as _sys
from importlib import abc as _abc
from importlib import import_module as _import_module
from importlib import util as _util
from pathlib import Path as _Path
from typing import Any as _Any

from ._version import __version__
from .errors import (
    AlignmentError,
    ConfigError,
    DecodeError,
    FormatError,
    LiveSourceError,
    MMLoaderError,
    PlanChangedError,
    RandomAccessError,
    ResumeError,
    SampleError,
    SizeLimitError,
    UnsafeFieldError,
)

# name -> (module, attribute), imported on first use: storage (writers, ``open``: no torch) and
# the torch-facing API. ``import mmloader`` itself imports nothing heavy, so the command line is
# up at once (and a Ctrl-C while it starts is the CLI's one line, not an import's traceback).
_LAZY = {
    "LMDBWriter": (".storage", "LMDBWriter"),
    "ShardWriter": (".storage", "ShardWriter"),
    "Store": (".storage", "Store"),
    "build_index": (".storage", "build_index"),
    "writer_for": (".storage", "writer_for"),
    "open": (".storage", "open_store"),
    "SampleCache": (".readers.cache", "SampleCache"),
    "Reader": (".readers", "Reader"),
    "ImageReader": (".readers", "ImageReader"),
    "Crop": (".readers.augment", "Crop"),
    "TextReader": (".readers", "TextReader"),
    "LabelReader": (".readers", "LabelReader"),
    "JSONReader": (".readers", "JSONReader"),
    "ArrayReader": (".readers", "ArrayReader"),
    "VideoReader": (".readers", "VideoReader"),
    "AudioReader": (".readers", "AudioReader"),
    "TextLinesReader": (".readers", "TextLinesReader"),
    "reader_for": (".readers", "reader_for"),
    "readers": (".readers", None),
    "zip": (".align.zip", "zip_readers"),
    "Zipped": (".align.zip", "Zipped"),
    "select": (".align.select", "select"),
    "WeightSchedule": (".planning.schedule", "WeightSchedule"),
    "Collate": (".align.collate", "Collate"),
    "collate": (".align.collate", "collate"),
    "unpack": (".align.collate", "unpack"),
    "tokens": (".align.packing", "tokens"),
    "TokenLayout": (".align.packing", "TokenLayout"),
    "DocumentReader": (".readers", "DocumentReader"),
    "Document": (".readers", "Document"),
    "Stream": (".loading.stream", "Stream"),
    "Order": (".loading.stages", "Order"),
    "Batching": (".loading.stages", "Batching"),
    "Bucketing": (".loading.stages", "Bucketing"),
    "Packing": (".loading.stages", "Packing"),
    "Errors": (".loading.stages", "Errors"),
    "Loader": (".loading.dataloader", "Loader"),
    "ThreadLoader": (".loading.dataloader", "ThreadLoader"),
    "loader": (".loading.dataloader", "loader"),
    "Mix": (".align.mix", "Mix"),
    "mix": (".align.mix", "mix"),
    "from_config": (".loading.config", "from_config"),
    "Node": (".loading.nodes", "Node"),
    "Map": (".loading.nodes", "Map"),
    "Filter": (".loading.nodes", "Filter"),
    "GPUDecode": (".loading.gpu", "GPUDecode"),
    "ToDevice": (".loading.to_device", "ToDevice"),
    "rng": (".readers.seeding", "rng"),
    "live": (".live_sources.source", "live"),
    "LiveSource": (".live_sources.source", "LiveSource"),
    "LiveStream": (".live_sources.stream", "LiveStream"),
    "from_queue": (".live_sources.queue", "from_queue"),
}

#: The converters live at the top of the repository (``converters/``); a wheel installs them as
#: ``mmloader.converters``. In a source checkout that name is found here, next to the package.
_CONVERTERS_SOURCE = _Path(__file__).resolve().parent.parent / "converters"


class _ConvertersInCheckout(_abc.MetaPathFinder):
    """Finds ``mmloader.converters`` in a source checkout (an installed wheel has it in the package)."""

    def find_spec(self, fullname: str, path: _Any = None, target: _Any = None) -> _Any:
        if fullname != f"{__name__}.converters" or not (_CONVERTERS_SOURCE / "__init__.py").is_file():
            return None
        return _util.spec_from_file_location(
            fullname, _CONVERTERS_SOURCE / "__init__.py", submodule_search_locations=[str(_CONVERTERS_SOURCE)]
        )


def _submodules_on_access(package: str) -> _Any:
    """A module ``__getattr__`` for a layer package: ``mmloader.media.mediainfo`` after a plain
    ``import mmloader``, as for any attribute path, without importing every module up front."""

    def __getattr__(name: str) -> _Any:
        try:
            return _import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


if not any(isinstance(f, _ConvertersInCheckout) for f in _sys.meta_path):
    _sys.meta_path.append(_ConvertersInCheckout())


def __getattr__(name: str) -> _Any:
    entry = _LAZY.get(name)
    if entry is None:
        try:  # a submodule, e.g. mmloader.loading.config.is_config_path after a plain `import mmloader`
            return _import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module 'mmloader' has no attribute {name!r}") from None
    module, attr = entry
    mod = _import_module(module, __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# ``open`` and ``zip`` are meant as ``mmloader.open`` / ``mmloader.zip``: a star import must
# not replace the builtins of the same name in the importer's namespace.
__all__ = [
    "__version__",
    "MMLoaderError",
    "FormatError",
    "SampleError",
    "DecodeError",
    "SizeLimitError",
    "UnsafeFieldError",
    "RandomAccessError",
    "AlignmentError",
    "ConfigError",
    "ResumeError",
    "PlanChangedError",
    "LiveSourceError",
    *(name for name in _LAZY if name not in ("zip", "open", "readers")),
]
