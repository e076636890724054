"""Where a table's files are and how pyarrow reaches them: whether a path is a table, its
Arrow or Parquet files in row order (a ``state.json``, a folder, one file, or a URL on object
storage), and a remote file as the seekable file pyarrow reads by ranged GETs. Kept apart from
the store so that finding and opening files is one place, and pyarrow is imported lazily here.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Sequence

from ...errors import FormatError


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError("reading Arrow and Parquet tables needs pyarrow: pip install 'mmloader[parquet]'") from None
    return pa


def is_table(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``save_to_disk`` folder, a Parquet file or a folder of Parquet files."""
    p = Path(path)
    if p.is_file():
        return p.suffix.lower() == ".parquet"
    return p.is_dir() and (
        (p / "state.json").is_file() or (p / "dataset_dict.json").is_file() or any(p.glob("*.parquet"))
    )


def table_files(path: str | os.PathLike) -> tuple[str, list[Path]]:
    """(``"arrow"`` or ``"parquet"``, the files in row order) of a table; a FormatError names
    what is wrong (a ``DatasetDict`` folder: name a split)."""
    p = Path(path)
    if p.is_file():
        return "parquet", [p]
    if (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if (d / "state.json").is_file())
        raise FormatError(f"{p} holds a DatasetDict (splits {', '.join(splits)}): open one split, e.g. {p / splits[0]}")
    state = p / "state.json"
    if state.is_file():
        try:
            names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{state}: not a state.json written by datasets' save_to_disk ({e})") from None
        files = [p / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FormatError(f"{state} lists {len(missing)} missing Arrow file(s): {', '.join(missing[:3])}")
        return "arrow", files
    files = sorted(p.glob("*.parquet"))
    if not files:
        raise FormatError(f"{p} is not an Arrow folder (state.json) and holds no .parquet files")
    return "parquet", files


def _remote_files(url: str, storage_options: dict | None, remote: dict):
    """(the folder's Location, [(name, size)] of its Parquet files) of a table URL: a folder of
    ``.parquet`` files, or one file."""
    from ..remote import Location, Policy

    policy = Policy.from_env(**{k: remote.pop(k) for k in ("retry_deadline", "request_timeout") if k in remote})
    if remote:
        raise TypeError(f"{url}: options {sorted(remote)} do not apply to Parquet tables")
    one = url.rstrip("/").endswith(".parquet")
    folder, _, name = url.rstrip("/").rpartition("/") if one else (url, "", "")
    location = Location(folder, storage_options or {}, policy)
    if one:
        size = location.size(name, purpose="meta")
        if size is None:
            raise FileNotFoundError(f"{location.name_url(name)}: no such file")
        return location, [(name, size)]
    names = [(n, size) for n, size in location.list(purpose="meta") if n.endswith(".parquet") and "/" not in n]
    if not names:
        raise FormatError(f"{location.shown} holds no .parquet file")
    return location, sorted(names)


class RangedFile(io.RawIOBase):
    """A file on object storage or the Hub as pyarrow reads it: each read one ranged GET (pyarrow
    reads a file's footer, then whole column chunks).

    Args:
        location: the folder.
        name: the file's name in it.
        size: its size in bytes.
    """

    def __init__(self, location, name: str, size: int):
        super().__init__()
        self.location, self.name, self._size, self._pos = location, name, int(size), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + int(offset))
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self.location.get_ranges([(self.name, self._pos, end)])[0]
        self._pos = end
        return bytes(data)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _column_of(leaf: str, names: Sequence[str]) -> str:
    """The top-level column a Parquet leaf (``path_in_schema``) belongs to: a name may hold dots
    itself (``seg.png``), so the longest column name that is the leaf or begins it."""
    best = ""
    for name in names:
        if (leaf == name or leaf.startswith(name + ".")) and len(name) > len(best):
            best = name
    return best or leaf.split(".")[0]
