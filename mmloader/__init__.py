"""mmloader: multi-modal datasets for PyTorch over LMDB and WebDataset-style tar shards."""
from ._version import __version__
from .errors import (AlignmentError, ConfigError, DecodeError, FormatError, MMLoaderError,
                     RandomAccessError, SampleError, SizeLimitError)
from .storage import LMDBWriter, ShardWriter, Store, build_index, writer_for
from .storage import open_store as open

__all__ = ["__version__", "open", "LMDBWriter", "ShardWriter", "Store", "build_index", "writer_for",
           "MMLoaderError", "FormatError", "SampleError", "DecodeError", "SizeLimitError",
           "RandomAccessError", "AlignmentError", "ConfigError"]
