"""``.npy`` fields without ``np.load``'s per-call cost.

``np.load`` parses each header with ``ast.literal_eval`` (~100 us), more than reading a
few hundred token ids takes. Headers written by numpy have one fixed form, matched
here by a regular expression; anything else (structured dtypes, unusual spacing) goes
to numpy's own header parser. Object arrays are refused either way: loading them
would unpickle data.
"""

from __future__ import annotations

import io
import re
import struct

import numpy as np

from ..errors import UnsafeFieldError

_MAGIC = b"\x93NUMPY"
# numpy's own spelling: {'descr': '<i4', 'fortran_order': False, 'shape': (12,), }
_HEADER = re.compile(
    rb"\{'descr': '([<>|=][biufc]\d{1,2})', 'fortran_order': (True|False), "
    rb"'shape': \(((?:\d+, ?)*\d*)\), \}\s*\Z"
)


def _header_text(data) -> tuple[bytes, int]:
    """(header dict text, offset of the array data)."""
    if bytes(data[:6]) != _MAGIC or len(data) < 10:
        raise ValueError("not a .npy value (no NUMPY magic)")
    major = data[6]
    if major == 1:
        (size,), start = struct.unpack_from("<H", data, 8), 10
    elif major in (2, 3):
        (size,), start = struct.unpack_from("<I", data, 8), 12
    else:
        raise ValueError(f".npy format version {major} is not supported")
    if len(data) < start + size:
        raise ValueError(f".npy header is cut short ({len(data)} bytes)")
    return bytes(data[start : start + size]), start + size


def npy_array(data) -> np.ndarray:
    """The array in a ``.npy`` value, as a read-only view of ``data`` (bytes or memoryview):
    copy it before ``data``'s memory goes away.

    >>> buf = io.BytesIO(); np.save(buf, np.arange(3, dtype=np.int32)); npy_array(buf.getvalue()).tolist()
    [0, 1, 2]
    """
    header, offset = _header_text(data)
    m = _HEADER.match(header)
    if m is None:
        return _slow(data)
    dtype = np.dtype(m.group(1).decode("ascii"))
    shape = tuple(int(s) for s in m.group(3).split(b",") if s.strip())
    count = 1
    for d in shape:
        count *= d
    need = offset + count * dtype.itemsize
    if len(data) < need:
        raise ValueError(f".npy data is cut short: {len(data)} bytes, the header says {need}")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if m.group(2) == b"True":
        return array.reshape(shape[::-1]).T
    return array.reshape(shape)


def _slow(data) -> np.ndarray:
    try:
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise UnsafeFieldError(
                "array holds Python objects; loading it would unpickle data, which can run code: refused"
            ) from None
        raise


def owned(array: np.ndarray) -> np.ndarray:
    """A writable, C-contiguous, native-byte-order copy (what ``torch.from_numpy`` takes)."""
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
