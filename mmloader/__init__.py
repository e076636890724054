"""mmloader: multi-modal datasets for PyTorch over LMDB and WebDataset-style tar shards.

>>> import mmloader
>>> ds = mmloader.zip(image=mmloader.ImageReader("pairs.lmdb"),
...                   caption=mmloader.TextReader("pairs.lmdb"))          # doctest: +SKIP
>>> loader = mmloader.loader(mmloader.Stream(ds, batch_size=64, seed=0))   # doctest: +SKIP
"""
from ._version import __version__
from .cache import SampleCache
from .errors import (AlignmentError, ConfigError, DecodeError, FormatError, MMLoaderError,
                     RandomAccessError, SampleError, SizeLimitError, UnsafeFieldError)
from .readers import (ArrayReader, ImageReader, JSONReader, LabelReader, Reader, TextLinesReader,
                      TextReader, reader_for)
from .storage import LMDBWriter, ShardWriter, Store, build_index, writer_for
from .storage import open_store as open
from .zip import Zipped, zip
from .collate import Collate, collate, unpack
from .stream import Stream
from .loader import Loader, ThreadedLoader, loader
from .mix import Mix, mix
from .config import from_config

__all__ = ["__version__", "open", "LMDBWriter", "ShardWriter", "Store", "build_index", "writer_for",
           "Reader", "ImageReader", "TextReader", "LabelReader", "JSONReader", "ArrayReader",
           "TextLinesReader", "reader_for", "zip", "Zipped", "SampleCache", "Stream", "Loader",
           "loader", "ThreadedLoader", "collate", "Collate", "unpack", "Mix", "mix", "from_config",
           "MMLoaderError", "FormatError", "SampleError", "DecodeError", "SizeLimitError",
           "UnsafeFieldError", "RandomAccessError", "AlignmentError", "ConfigError"]
