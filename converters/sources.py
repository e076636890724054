"""The source and destination paths, walking a raw folder, and what a raw label is."""

from __future__ import annotations

import decimal
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage import is_url
from mmloader.storage.meta import TAR_FORMATS
from mmloader.storage.remote.write import check_remote_destination
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)
from mmloader.storage.tar.index import MANIFEST
from mmloader.storage.write.atomic import check_not_busy, clean_stale_partials

from .items import ConversionError, Item, UsageError


# -- paths ---------------------------------------------------------------------------------------
def is_dataset_dir(path: str) -> bool:
    """An LMDB environment (``data.mdb``) or an mmloader shard directory (its ``index.json``)."""
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return True
    manifest = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest):
        return False
    try:
        with open(manifest, "rb") as f:
            head = f.read(1 << 16)
        return any(name.encode() in head for name in TAR_FORMATS)
    except OSError:
        return False


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_paths(src: str | Sequence[str], dst: str, overwrite: bool, part: bool = False) -> list[str]:
    """Fail early, with a clear word, on a missing SRC, an existing or busy DST, a DST that is (or
    holds) the source, or an unwritable place. Removes stale partials of DST left by killed
    conversions; returns what it did, for the summary. For a part (``part=True``) DST is only
    checked: the part's own dataset under ``DST.parts/`` is locked and cleaned by its writer."""
    for one in [src] if isinstance(src, (str, os.PathLike)) else src:
        if not os.path.exists(one):
            raise ConversionError(f"source {one} does not exist")
    if is_url(dst):  # object storage: written locally, uploaded, manifest last (mmloader.storage.remote.write)
        if part:
            raise UsageError(
                f"{dst}: parts (--part, --engine ray) are written to a filesystem every task "
                "can reach; convert to a local or shared DST, then `mmloader merge DST.parts/ "
                f"{dst}` uploads the merged dataset"
            )
        check_remote_destination(dst, overwrite)
        return []
    for one in [src] if isinstance(src, (str, os.PathLike)) else src:
        real_src, real_dst = os.path.realpath(one), os.path.realpath(dst)
        if _inside(real_src, real_dst) or _inside(real_src, real_dst + ".parts"):
            raise ConversionError(
                f"the destination {dst} is the source {one} or holds it: refusing (--overwrite would delete the source)"
            )
    if os.path.lexists(dst):
        if not overwrite:
            raise ConversionError(f"{dst} already exists; pass --overwrite to replace it")
        if not (os.path.isdir(dst) and (is_dataset_dir(dst) or not os.listdir(dst))):
            raise ConversionError(
                f"{dst} exists and is not an mmloader dataset: --overwrite replaces only "
                "a dataset (or an empty folder); move or delete it yourself"
            )
    parent = Path(dst).absolute().parent
    try:  # a real write probe: permission bits alone say nothing for root or read-only mounts
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ConversionError(f"cannot write to {parent}: {e.strerror or e}") from None
    if part:
        return []
    check_not_busy(dst)  # a second conversion to one destination fails now, not at the end
    return [str(p) for p in clean_stale_partials(dst)]


class SourceWalker:
    """``os.walk`` over a raw folder, minus what is not input, with a note of everything left out.

    Not input: hidden files and folders (a leading ``.``: ``.DS_Store``, ``.ipynb_checkpoints``,
    a conversion's hidden partial), any dataset found under the source (an LMDB environment or
    an mmloader shard directory, and its ``NAME.skipped.tsv``), and the destination with its
    report when it lies inside the source. A folder that cannot be listed becomes an error item
    (skipped with the reason, or the error under ``--on-error raise``).
    """

    def __init__(self, root: str | os.PathLike, dst: str | os.PathLike, followlinks: bool = False):
        self.root = str(root)
        self.followlinks = followlinks
        self.dst = os.path.realpath(dst)
        self.hidden: list[str] = []
        self.datasets: list[str] = []
        self.dst_inside = False
        self.symlinks: list[str] = []
        self.unreadable: list[tuple[str, str]] = []  # (folder, reason)
        # following links: each real folder is read once; a link back into its own path is a loop
        self.visited: set[str] = set()
        self.loops: list[tuple[str, str]] = []  # (link, the folder it leads back to)
        self.again: list[tuple[str, str]] = []  # (folder, the real folder already read)

    def _onerror(self, e: OSError) -> None:
        if os.path.realpath(e.filename or "") == os.path.realpath(self.root):
            raise ConversionError(f"cannot read the source {self.root}: {e.strerror or e}")
        self.unreadable.append((e.filename, f"unreadable folder: {e.strerror or e}"))

    def excluded_dir(self, dirpath: str, name: str) -> bool:
        """Whether folder NAME in DIRPATH is left out (and noted)."""
        full = os.path.join(dirpath, name)
        if name.startswith("."):
            self.hidden.append(full)
            return True
        if os.path.realpath(full) in (self.dst, self.dst + ".parts"):  # the destination, its parts
            self.dst_inside = True
            return True
        if is_dataset_dir(full):
            self.datasets.append(full)
            return True
        if not self.followlinks and os.path.islink(full):
            self.symlinks.append(full)
            return True
        return False

    def _read_before(self, dirpath: str, name: str) -> bool:
        """Following links: whether folder NAME in DIRPATH leads back into its own path (a loop),
        into the source (read at its own place) or to a real folder already read: each file is
        read once, at its own path (noted)."""
        full = os.path.join(dirpath, name)
        real, here = os.path.realpath(full), os.path.realpath(dirpath)
        if here == real or here.startswith(real + os.sep):
            self.loops.append((full, real))
            return True
        return self._read_elsewhere(full, real)

    def _read_elsewhere(self, folder: str, real: str) -> bool:
        """Whether ``folder`` (real path ``real``) is read elsewhere: a folder already read, or a
        link into the source, whose files are read at their own place (their own class); noted.
        Otherwise it is read here, and marked read."""
        if real in self.visited or (os.path.islink(folder) and self._read_in_place(real)):
            self.again.append((folder, real))
            return True
        self.visited.add(real)
        return False

    def _read_in_place(self, real: str) -> bool:
        """Whether real folder ``real`` lies in the source where the walk reads it: not a link's
        business then (a hidden folder, or a dataset, is read only through a link to it)."""
        root = os.path.realpath(self.root)
        if not real.startswith(root + os.sep):
            return False
        parts = os.path.relpath(real, root).split(os.sep)
        return not any(p.startswith(".") for p in parts) and not any(
            is_dataset_dir(os.path.join(root, *parts[: i + 1])) for i in range(len(parts))
        )

    def walk(self, top: str | None = None) -> Iterator[tuple[str, list[str]]]:
        """(dirpath, sorted file names) per folder, folders in sorted order."""
        top = self.root if top is None else top
        dst_name = os.path.basename(self.dst)
        if self.followlinks and self._read_elsewhere(top, os.path.realpath(top)):
            return  # (a class folder that links to another's: read there)
        for dirpath, dirnames, filenames in os.walk(top, onerror=self._onerror, followlinks=self.followlinks):
            dirnames[:] = sorted(d for d in dirnames if not self.excluded_dir(dirpath, d))
            if self.followlinks:
                dirnames[:] = [d for d in dirnames if not self._read_before(dirpath, d)]
            reports = {f"{os.path.basename(d)}.skipped.tsv" for d in self.datasets if os.path.dirname(d) == dirpath}
            dst_here = (dst_name in filenames or f"{dst_name}.skipped.tsv" in filenames) and os.path.realpath(
                dirpath
            ) == os.path.dirname(self.dst)
            files = []
            for name in sorted(filenames):
                if name.startswith("."):
                    self.hidden.append(os.path.join(dirpath, name))
                elif dst_here and name in (dst_name, f"{dst_name}.skipped.tsv"):
                    self.dst_inside = True
                elif name not in reports:
                    files.append(name)
            yield dirpath, files

    def error_items(self) -> list[Item]:
        """One error item per folder that could not be listed (key: its path under the source)."""
        out = []
        for folder, reason in self.unreadable:
            rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
            out.append(Item(key=rel, where=folder, error=reason))
        return out

    def notes(self) -> list[str]:
        out = []
        if self.dst_inside:
            out.append(f"not input: the destination {self.dst} (inside the source) and its report")
        if self.datasets:
            out.append(
                f"not input: {len(self.datasets)} dataset(s) inside the source: "
                + ", ".join(self.datasets[:5])
                + (" ..." if len(self.datasets) > 5 else "")
            )
        if self.hidden:
            out.append(f"not input: {len(self.hidden)} hidden file(s)/folder(s), e.g. {self.hidden[0]}")
        if self.symlinks:
            out.append(f"not followed: {len(self.symlinks)} symlinked folder(s), e.g. {self.symlinks[0]}")
        if self.loops:
            link, real = self.loops[0]
            out.append(f"not followed: {len(self.loops)} symbolic link(s) in a loop, e.g. {link} -> {real}")
        if self.again:
            link, real = self.again[0]
            out.append(
                f"read once, at its own place: {len(self.again)} folder(s) a link leads to, e.g. {link} -> {real}"
            )
        return out


# -- labels ------------------------------------------------------------------------------------
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


def label_kind(value: Any) -> tuple[str, Any]:
    """What a raw label is: ``("missing", None)``, ``("number", int|float)``, ``("name", str)`` or
    ``("bad", reason)``. Empty text is a missing label, never a class; ``"1"``, ``"1.0"``, ``1`` and
    ``1.0`` are all the number 1; ``"²"`` or ``"1.2.3"`` look like numbers and are not: bad.

    >>> [label_kind(v)[1] for v in ("1.0", 2, " 3 ", "cat", None)]
    [1, 2, 3, 'cat', None]
    """
    if value is None:
        return "missing", None
    if isinstance(value, bool):
        return "bad", f"{value!r} is a boolean, not a label"
    if isinstance(value, int):
        return "number", value
    if isinstance(value, float):
        if not math.isfinite(value):
            return "bad", f"{value!r} is not a finite number"
        return "number", int(value) if value.is_integer() else value
    if not isinstance(value, str):
        return "bad", f"a JSON {type(value).__name__} is not a label"
    text = value.strip()
    if not text:
        return "missing", None
    if _INTEGER.fullmatch(text):
        return "number", int(text)
    if _NUMBER.fullmatch(text):
        exact = decimal.Decimal(text)  # exact: "2.9999999999999999" is not 3, "1e-400" is not 0
        if not exact.is_finite():
            return "bad", f"{value!r} is not a finite number"
        return "number", int(exact) if exact == exact.to_integral_value() else float(exact)
    if not any(c.isalpha() for c in text) and any(c.isnumeric() for c in text):
        return "bad", f"{value!r} looks like a number but is not one"
    return "name", text
