"""What every converter shares: options, walking the source, loading items in order (in
parallel), the error policy, the skip report and the summary."""

from __future__ import annotations

import argparse
import decimal
import io
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import lmdb
import numpy as np
from PIL import Image
from tqdm import tqdm

import mmloader
from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.errors import MMLoaderError
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage import format_for, is_url
from mmloader.storage.atomic import check_not_busy, clean_stale_partials
from mmloader.storage.meta import TAR_FORMATS
from mmloader.storage.remote_write import check_remote_destination
from mmloader.storage.shard_index import MANIFEST
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)
from mmloader.storage.tar_writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE

#: Files larger than this are refused before a byte is read (``--max-file-bytes``). 256 MiB is
#: several times the largest ordinary photo or scan (a JPEG at the 150-megapixel ``max_pixels``
#: cap is ~30-80 MB), while ``--workers N`` holds at most N such files in memory at once.
DEFAULT_MAX_FILE_BYTES = 256 << 20
#: How much of an image file is read to check its header before the rest is read.
PROBE_BYTES = 64 << 10

ON_ERROR_HELP = (
    "raise (default): stop at the first bad sample with its file and reason, nothing "
    "written; skip: leave bad samples out, list them in DST.skipped.tsv and count them "
    "in the summary"
)


class ConversionError(Exception):
    """The conversion cannot go on (bad paths, bad data under ``--on-error raise``); nothing is
    left behind. Exit status 1."""


class UsageError(ConversionError):
    """An option value that cannot work, found after parsing (e.g. ``--require`` naming a field no
    sample has). Exit status 2, like argparse's own usage errors."""


class ItemError(Exception):
    """One raw sample cannot be converted; ``path`` names the offending file (and line/row)."""

    def __init__(self, reason: str, path: str | os.PathLike = ""):
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason, self.path = reason, str(path)


class Skipped(ItemError):
    """Left out by a policy the user chose (e.g. blank lines): reported, never a failure."""


@dataclass
class Item:
    """One sample to convert: its key and, per field, a file path or an inline value."""

    key: str
    files: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    error: str | None = None  # a problem found while listing the raw folder (or reading a row)
    #: field -> bytes given inline (a table cell), checked exactly as a file's bytes would be;
    #: field "" is an image whose header names the field
    data: dict[str, bytes] = field(default_factory=dict)
    #: field -> where its inline bytes came from, for error messages ("column 'image', row group 3")
    origin: dict[str, str] = field(default_factory=dict)


@dataclass
class Options:
    format: str | None = None
    resize_max: int | None = None
    quality: int = 90
    check_decode: bool = False
    require: tuple[str, ...] = ()
    max_pixels: int = 150_000_000
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_seconds: float | None = None
    transcode: Any = None  # mmloader.media.mediainfo.Transcode


# -- option values -----------------------------------------------------------------------------
def parse_part(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected I/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= I < N")
    return i, n


def _part_arg(text: str) -> str:
    parse_part(text)
    return text


def require_list(text: str) -> tuple[str, ...]:
    """``--require jpg,txt`` -> field names, image spellings folded (``JPEG`` -> ``jpg``)."""
    fields = tuple(dict.fromkeys(canonical_extension(f.strip()) for f in text.split(",") if f.strip()))
    if not fields:
        raise argparse.ArgumentTypeError(f"{text!r} names no field (e.g. --require jpg,txt)")
    for f in fields:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", f):
            raise argparse.ArgumentTypeError(
                f"{f!r} is not a field name (fields are file extensions such as jpg, txt, json, cls)"
            )
    return fields


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the raw folder (or file)")
    p.add_argument("dst", help="output: NAME.lmdb for LMDB, otherwise a shard directory")
    p.add_argument(
        "--format", choices=("lmdb", "tar"), help="output format (default: lmdb for a .lmdb suffix, otherwise tar)"
    )
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        default=1,
        help="parallel loading threads; the output is identical to --workers 1 (default 1)",
    )
    p.add_argument(
        "--shard-size",
        type=int_at_least(1),
        default=DEFAULT_SHARD_SIZE,
        metavar="N",
        help=f"tar: at most N samples per shard (default {DEFAULT_SHARD_SIZE:,})",
    )
    p.add_argument(
        "--shard-bytes",
        type=positive_size,
        default=DEFAULT_SHARD_BYTES,
        metavar="SIZE",
        help="tar: at most SIZE bytes per shard: 1G, 512M, 64K (powers of 1024), 1GB (of 1000), "
        "1e9 or a plain integer (default 1G)",
    )
    p.add_argument(
        "--shuffle-seed",
        type=int_at_least(0),
        default=None,
        metavar="SEED",
        help="write samples in a seeded random order (default: sorted order)",
    )
    p.add_argument(
        "--resize-max",
        type=int_at_least(1),
        default=None,
        metavar="PX",
        help="re-encode images so the longest side is at most PX (default: keep the bytes)",
    )
    p.add_argument(
        "--quality", type=int_at_least(1, 100), default=90, help="JPEG quality for --resize-max (1-100, default 90)"
    )
    p.add_argument(
        "--part",
        type=_part_arg,
        default=None,
        metavar="I/N",
        help="convert only the I-th of N "
        "deterministic slices (0 <= I < N) into DST.parts/, publishing a part manifest last; a "
        "finished part is not converted again; `mmloader merge DST` joins the parts",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local (default): this "
        "process; ray: convert --parts N parts as Ray tasks on the cluster named by --ray-address "
        "or RAY_ADDRESS (else a local Ray), retried on failure, then merge them "
        "(pip install 'mmloader[ray]')",
    )
    p.add_argument(
        "--parts",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="--engine ray: the number of parts (default: the cluster's CPUs divided by --workers)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to use "
        "(default: $RAY_ADDRESS, else a cluster started on this machine with `ray start`, else a new "
        "local Ray)",
    )
    p.add_argument(
        "--retries",
        type=int_at_least(0),
        default=3,
        metavar="K",
        help="--engine ray: times Ray re-runs a part whose worker died (default 3)",
    )
    p.add_argument("--keep-parts", action="store_true", help="--engine ray: keep DST.parts/ after the merge")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)
    p.add_argument(
        "--max-file-bytes",
        type=positive_size,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="SIZE",
        help="refuse a file larger than SIZE before reading it, as a bad sample (default 256M)",
    )
    p.add_argument(
        "--check-decode",
        action="store_true",
        help="fully decode images, videos and audio (default: "
        "header check; for media: duration, streams and codec from the header)",
    )
    p.add_argument(
        "--max-seconds",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="video/audio longer than S seconds is a bad sample (with --transcode: trimmed to S)",
    )
    p.add_argument(
        "--transcode",
        type=_transcode_spec,
        default=None,
        metavar="SPEC",
        help="re-encode media once: fps=N,size=PX (shorter side),sample_rate=HZ,crf=Q; video -> H.264 "
        "mp4 (AAC audio track), audio -> FLAC (default: keep the bytes)",
    )
    p.add_argument(
        "--require",
        type=require_list,
        default=(),
        metavar="FIELDS",
        help="comma-separated fields every sample must have, e.g. jpg,txt (a sample without one "
        "is a bad sample; a field no sample has is a usage error)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DST if it is an existing dataset")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be a number of seconds more than 0")
    return value


def _transcode_spec(text: str):
    from mmloader.media.mediainfo import Transcode  # torch-free, and PyAV is imported only when used

    try:
        return Transcode.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def layout_parser(layout: str, doc: str | None, examples: Sequence[str]) -> argparse.ArgumentParser:
    """The argument parser of ``mmloader convert LAYOUT``, with the options every layout has."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    p = argparse.ArgumentParser(
        prog=f"mmloader convert {layout}",
        description=doc,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(p)
    return p


def options_from(args) -> Options:
    return Options(
        format=args.format,
        resize_max=args.resize_max,
        quality=args.quality,
        check_decode=args.check_decode,
        require=tuple(args.require),
        max_file_bytes=args.max_file_bytes,
        max_seconds=getattr(args, "max_seconds", None),
        transcode=getattr(args, "transcode", None),
    )


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
    if is_url(dst):  # object storage: written locally, uploaded, manifest last (mmloader.storage.remote_write)
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

    def walk(self, top: str | None = None) -> Iterator[tuple[str, list[str]]]:
        """(dirpath, sorted file names) per folder, folders in sorted order."""
        top = self.root if top is None else top
        dst_name = os.path.basename(self.dst)
        for dirpath, dirnames, filenames in os.walk(top, onerror=self._onerror, followlinks=self.followlinks):
            dirnames[:] = sorted(d for d in dirnames if not self.excluded_dir(dirpath, d))
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


# -- loading one item (runs in worker threads) -------------------------------------------------
def _jpeg_needs_more(prefix: bytes) -> bool:
    """Whether a JPEG's segment chain runs past ``prefix`` before its frame header (large EXIF or
    ICC data): then the header check needs more of the file. Garbage where a marker belongs: no."""
    i, n = 2, len(prefix)
    while i + 4 <= n:
        if prefix[i] != 0xFF:
            return False
        marker = prefix[i + 1]
        if marker == 0xFF:
            i += 1
        elif 0xD0 <= marker <= 0xD8 or marker == 0x01:
            i += 2
        elif marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xDA):
            return False  # frame header or scan inside the prefix: the prefix was enough
        else:
            i += 2 + int.from_bytes(prefix[i + 2 : i + 4], "big")
    return True


def _needs_more(prefix: bytes) -> bool:
    if prefix[:3] == b"\xff\xd8\xff":
        return _jpeg_needs_more(prefix)
    return prefix[:4] in (b"II*\0", b"MM\0*")  # TIFF: the first directory may be at the end


#: Image field name for a format found in a header (for files whose name has no image extension).
_FIELD_OF_FORMAT = {
    "jpeg": "jpg",
    "mpo": "jpg",
    "png": "png",
    "webp": "webp",
    "bmp": "bmp",
    "tiff": "tif",
    "ppm": "ppm",
}


def read_file(path: str, limit: int, image: bool) -> bytes:
    """The bytes of ``path``, refused by size before reading; an image's header is checked on its
    first :data:`PROBE_BYTES` before the rest is read."""
    from mmloader.media.imageinfo import probe

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open; a device never ends
            raise ItemError("not a regular file", path)
        f = open(path, "rb")
    except OSError as e:
        raise ItemError(f"unreadable: {e.strerror or e}", path) from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise ItemError(
                    f"over --max-file-bytes: {size:,} bytes, the limit is {limit:,} (raise it with "
                    "--max-file-bytes to include this file)",
                    path,
                )
            if image and size > PROBE_BYTES:
                head = f.read(PROBE_BYTES)
                try:
                    probe(head)
                except MMLoaderError as e:
                    if not _needs_more(head):
                        raise ItemError(
                            f"bad image: {e} (header checked in the first {PROBE_BYTES // 1024} KiB)", path
                        ) from None
                f.seek(0)
            data = f.read(size + 1)  # one allocation of the right size; +1 notices a file that grew
        except MemoryError:
            raise ItemError(
                f"not enough memory to read its {size:,} bytes (lower --workers or --max-file-bytes)", path
            ) from None
        except OSError as e:
            raise ItemError(f"unreadable: {e.strerror or e}", path) from None
    if len(data) > size:
        raise ItemError("the file grew while it was read (still being written?)", path)
    if not data:
        raise ItemError("empty file", path)
    return data


def _image_bytes(data: bytes, path: str, opts: Options) -> tuple[bytes, str | None, str]:
    """Validate (and optionally re-encode) an image; returns (bytes, new extension or None, format)."""
    from mmloader.media.imageinfo import check_decodes, check_pixels, probe

    try:
        info = probe(data)
        check_pixels(info, opts.max_pixels)
    except MMLoaderError as e:
        raise ItemError(f"bad image: {e}", path) from None
    if not (opts.check_decode or opts.resize_max):
        return data, None, info.format
    try:  # strict: a JPEG libjpeg only warns about (half of it gone) is refused, not re-encoded gray
        check_decodes(data, info)
    except MMLoaderError as e:
        raise ItemError(f"image does not decode: {e}", path) from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if opts.resize_max and max(im.size) > opts.resize_max:
                im.thumbnail((opts.resize_max, opts.resize_max), Image.BICUBIC)
                out = io.BytesIO()
                if im.format == "PNG" or im.mode in ("RGBA", "LA", "P"):
                    im.save(out, "PNG", optimize=False)
                    return out.getvalue(), "png", "png"
                im.convert("RGB").save(out, "JPEG", quality=opts.quality)
                return out.getvalue(), "jpg", "jpeg"
    except Exception as e:
        raise ItemError(f"image does not decode: {e}", path) from None
    return data, None, info.format


def media_bytes(data: bytes, field_name: str, path: str, opts: Options) -> tuple[bytes, str]:
    """Check a video or audio file from its header (duration, streams, codec; the readers' limits),
    fully decode it with ``--check-decode``, refuse or trim it with ``--max-seconds``, re-encode it
    with ``--transcode``. Returns (bytes, field name)."""
    from mmloader.media import mediainfo

    kind = mediainfo.field_kind(field_name)
    try:
        info = mediainfo.check_decodes(data) if opts.check_decode else mediainfo.probe(data)
        mediainfo.Limits().check(info)
    except ImportError as e:
        if opts.check_decode or opts.transcode or opts.max_seconds:
            raise ItemError(str(e), path) from None
        return data, field_name  # stored unchecked (noted in the summary by the caller's count)
    except MMLoaderError as e:
        raise ItemError(f"bad {kind}: {e}", path) from None
    if (kind == "video" and info.video is None) or (kind == "audio" and info.audio is None):
        raise ItemError(f"bad {kind}: no {kind} stream ({info.describe()})", path)
    too_long = opts.max_seconds is not None and info.duration is not None and info.duration > opts.max_seconds + 1e-3
    if too_long and not opts.transcode:
        raise ItemError(
            f"longer than --max-seconds: {info.duration:.2f} s, the limit is {opts.max_seconds:g} s "
            "(--transcode trims instead)",
            path,
        )
    if opts.transcode and (kind == "video" or opts.transcode.sample_rate or too_long):
        try:
            return mediainfo.transcode(data, kind, opts.transcode, opts.max_seconds if too_long else None)
        except MMLoaderError as e:
            raise ItemError(f"bad {kind}: {e}", path) from None
    return data, field_name


def check_field(field_name: str, data: bytes, path: str) -> bytes:
    """Check a non-image file's bytes by its field's type; returns the bytes to store."""
    ext = field_name.rsplit(".", 1)[-1].lower()
    if ext == "txt":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ItemError(f"text is not UTF-8 ({e.reason} at byte {e.start})", path) from None
    elif ext == "cls":
        try:
            kind, value = label_kind(data.decode("utf-8"))
        except UnicodeDecodeError:
            kind, value = "bad", f"{data[:20]!r} is not UTF-8"
        if kind == "missing":
            raise ItemError("missing label: the .cls file is blank", path)
        if kind != "number" or not isinstance(value, int):
            why = value if kind == "bad" else f"{data[:20].decode('utf-8', 'replace').strip()!r} is not an integer"
            raise ItemError(f"bad label: {why}", path)
        return str(value).encode("ascii")  # "1.0", " 1" -> "1": one spelling per class
    elif ext == "json":
        try:
            json.loads(data)
        except ValueError as e:
            raise ItemError(f"not valid JSON: {e}", path) from None
    return data


def media_kind(field_name: str) -> str | None:
    from mmloader.media.mediainfo import field_kind

    return field_kind(field_name) if not field_name.endswith(".gz") else None


def load_item(item: Item, opts: Options) -> dict[str, Any]:
    """Read, validate and (optionally) re-encode one sample. Raises :class:`ItemError`."""
    from mmloader.storage.keys import validate_key

    if item.error:
        raise ItemError(item.error, item.where or item.key)
    try:
        validate_key(item.key)
    except MMLoaderError as e:
        raise ItemError(f"illegal key: {e}", item.where or item.key) from None
    header_named = "" in item.files or "" in item.data  # an image whose field its header will name
    missing = [
        f
        for f in opts.require
        if f not in item.files
        and f not in item.values
        and f not in item.data
        and not (header_named and f in IMAGE_EXTENSIONS)
    ]
    if missing:  # before reading anything
        raise ItemError(f"missing required field(s) {', '.join(missing)}", item.where or item.key)
    sample: dict[str, Any] = {"__key__": item.key}

    def add(fname: str, data: bytes, path: str) -> None:
        image = fname == "" or fname in IMAGE_EXTENSIONS
        if image:
            data, new_ext, fmt = _image_bytes(data, path, opts)
            if fname == "":  # the file's name does not say: the header does
                fname = _FIELD_OF_FORMAT.get(fmt, "")
                if not fname:
                    raise ItemError(f"bad image: {fmt} is not a supported image format", path)
            fname = new_ext or fname
            if fname in sample:
                raise ItemError(f"two images for field {fname!r}", path)
        elif media_kind(fname):
            data, new_name = media_bytes(data, fname, path, opts)
            if new_name != fname and new_name in item.files:
                raise ItemError(f"--transcode makes a {new_name!r} field, and the sample has one already", path)
            fname = new_name
        else:
            data = check_field(fname, data, path)
        sample[fname] = data

    for fname, path in item.files.items():
        add(fname, read_file(path, opts.max_file_bytes, fname == "" or fname in IMAGE_EXTENSIONS), path)
    for fname, data in item.data.items():  # inline bytes: the same checks; errors name their origin
        try:
            if not data:
                raise ItemError("empty value", item.where)
            add(fname, data, item.where)
        except ItemError as e:
            origin = item.origin.get(fname)
            raise ItemError(f"{origin}: {e.reason}" if origin else e.reason, item.where or item.key) from None
    for fname, value in item.values.items():
        sample[fname] = value
    missing = [f for f in opts.require if f not in sample]
    if missing:
        raise ItemError(f"missing required field(s) {', '.join(missing)}", item.where or item.key)
    return sample


def _load_safe(args: tuple[Item, Options]) -> tuple[Item, dict | None, ItemError | None]:
    item, opts = args
    try:
        return item, load_item(item, opts), None
    except ItemError as e:
        return item, None, e


def ordered_map(fn: Callable, jobs: Iterable, workers: int, chunksize: int = 64) -> Iterator:
    """``map`` over ``workers`` threads, results in input order (so the output never depends on
    the worker count).

    Threads, not processes: file reads, zlib, Pillow's decoders and encoders release the GIL,
    and a thread hands its 20 KB sample to the writer without pickling it through a pipe
    (measured here: processes made a pass-through conversion slower than one worker). At most
    ``workers * 4`` chunks of results wait in memory.
    """
    if workers <= 1:
        yield from map(fn, jobs)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    from itertools import islice

    jobs = iter(jobs)
    run_chunk = lambda chunk: [fn(job) for job in chunk]  # one task per chunk: fewer GIL hand-offs
    with ThreadPoolExecutor(workers, thread_name_prefix="convert") as ex:
        window: deque = deque()
        while chunk := list(islice(jobs, chunksize)):
            window.append(ex.submit(run_chunk, chunk))
            if len(window) >= workers * 4:
                yield from window.popleft().result()
        while window:
            yield from window.popleft().result()


# -- writing, report, summary ------------------------------------------------------------------
@dataclass
class Summary:
    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    report: str | None = None
    notes: list[str] = field(default_factory=list)
    part: tuple[int, int] | None = None  # --part I/N: which part this was
    dataset: str | None = None  # where this process wrote (the part's dataset under --part)
    already: str | None = None  # --part: the manifest of a part converted before (nothing done now)

    def text(self, dst: str) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        rate = self.written / self.seconds if self.seconds else 0
        if self.already:
            return "\n".join(
                [
                    f"part {self.part[0]}/{self.part[1]} of {dst} is already converted ({self.already}: "
                    f"{self.written} samples, {skipped} skipped): nothing to do"
                ]
                + [f"note: {n}" for n in self.notes]
            )
        where = f"part {self.part[0]}/{self.part[1]} of {dst} ({self.dataset})" if self.part else dst
        lines = [
            f"wrote {self.written} samples ({self.bytes / 1e6:.1f} MB) to {where} in {self.seconds:.1f} s "
            f"({rate:.0f} samples/s, {self.bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s)",
            f"skipped {skipped}" + (f" ({why})" if why else ""),
        ]
        if self.report:
            lines.append(f"skipped samples and reasons: {self.report}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _reason_class(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0]


def report_path_for(dst: str) -> Path:
    if is_url(dst):  # the report stays local, in the working directory
        return Path.cwd() / (dst.rstrip("/").rsplit("/", 1)[-1] + ".skipped.tsv")
    return Path(str(Path(dst).absolute()) + ".skipped.tsv")


def _tsv(text: str) -> str:
    """One TSV cell: tabs, newlines and backslashes escaped (file names may hold any of them)."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _raise_policy(error: str, dst: str) -> ConversionError:
    return ConversionError(
        f"{error} -- stopped at the first bad sample, nothing written "
        f"(--on-error skip would skip it and list it in {report_path_for(dst).name})"
    )


def write_samples(
    samples: Iterable[tuple[Item, dict | None, ItemError | None]],
    dst: str,
    args,
    metadata: dict | None = None,
    total: int | None = None,
    notes: Sequence[str] = (),
    unique_keys: bool = False,
) -> Summary:
    """Write loaded samples; apply ``--on-error``; progress bar; atomic output; skip report.

    ``dst`` is where this process writes: ``args.dst``, or its part's dataset under ``--part``
    (then the output format is ``args.dst``'s, a published part without a manifest is replaced,
    and a part may end up empty: only the merge fails when no sample at all was converted).
    ``unique_keys``: the keys are unique by construction (row numbers): no set of seen keys is
    kept (it would grow with the input)."""
    summary = Summary(notes=list(notes))
    start = time.perf_counter()
    part = getattr(args, "_part_dataset", None) == dst
    fmt = format_for(args.dst, args.format)
    shard_opts = {"shard_size": args.shard_size, "shard_bytes": args.shard_bytes} if fmt == "tar" else {}
    upload_opts = {"progress": not args.quiet} if is_url(dst) else {}  # the "uploading to URL" bar
    writer = mmloader.writer_for(
        dst, fmt, overwrite=args.overwrite or part, metadata=metadata, **shard_opts, **upload_opts
    )
    report_path = report_path_for(dst)
    skipped_rows: list[str] = []
    bar = tqdm(total=total, desc=f"converting -> {Path(dst).name}", unit="sample", disable=args.quiet, smoothing=0.1)
    seen_keys: set[str] = set()

    def skip(key: str, where: str, reason: str) -> None:
        cls = _reason_class(reason)
        summary.skipped[cls] = summary.skipped.get(cls, 0) + 1
        skipped_rows.append(f"{_tsv(key)}\t{_tsv(where)}\t{_tsv(reason)}")
        bar.update(1)

    try:
        for item, sample, error in samples:
            if error is None and not unique_keys and item.key in seen_keys:
                error = ItemError(f"duplicate key {item.key!r}", item.where or item.key)
            if error is not None:
                if args.on_error == "raise" and not isinstance(error, Skipped):
                    raise _raise_policy(str(error), dst)
                skip(item.key, error.path, error.reason)
                continue
            if not unique_keys:
                seen_keys.add(item.key)
            try:
                writer.write(sample)
            except MMLoaderError as e:  # e.g. a key the format cannot hold
                if args.on_error == "raise":
                    raise _raise_policy(f"{item.where or item.key}: {e}", dst) from None
                skip(item.key, item.where, f"rejected by writer: {e}")
                continue
            summary.written += 1
            summary.bytes += sum(
                len(v) if isinstance(v, (bytes, str)) else 8 for k, v in sample.items() if not k.startswith("__")
            )
            bar.update(1)
            if summary.written % 256 == 0:
                bar.set_postfix_str(f"{summary.bytes / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
        if summary.written == 0 and skipped_rows and not part:
            report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
            raise ConversionError(
                f"no sample could be converted: all {len(skipped_rows)} were skipped "
                f"(reasons in {report_path}); nothing written"
            )
        writer.close()
    except BaseException:
        writer.abort()
        bar.close()
        raise
    bar.close()
    summary.dataset = str(dst)
    if report_path.exists():
        report_path.unlink()
    if skipped_rows:
        report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
        summary.report = str(report_path)
    summary.seconds = time.perf_counter() - start
    return summary


def check_required_fields(require: Sequence[str], items: Sequence[Item], layout_fields: Iterable[str] = ()) -> None:
    """``--require F`` for a field that no sample has is a mistake in the option, not bad data."""
    if not require:
        return
    found = set(layout_fields)
    for it in items:
        found.update(it.files)
        found.update(it.values)
    if "" in found:  # images whose field only their header will tell
        found.discard("")
        found.update(IMAGE_EXTENSIONS)
    unknown = [f for f in require if f not in found]
    if unknown:
        raise UsageError(
            f"--require {','.join(unknown)}: no sample has {'this field' if len(unknown) == 1 else 'these fields'} "
            f"(fields found: {', '.join(sorted(found)) or 'none'})"
        )


def run(
    build_items: Callable[[argparse.Namespace, list[str]], tuple[list[Item], dict]],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    looked_for: str,
) -> int:
    """Parse, enumerate items, load them in order (in parallel), write, summarise.

    ``build_items(args, notes)`` lists the samples (appending to ``notes`` what it left out);
    ``looked_for`` says what it looks for, for the error when it finds nothing.
    """
    return execute(parser, argv, item_source(build_items, looked_for))


def item_source(
    build_items: Callable[[argparse.Namespace, list[str]], tuple[list[Item], dict]], looked_for: str
) -> Callable:
    """A layout's ``prepare`` (see :func:`execute`) from its ``build_items``."""

    def prepare(args: argparse.Namespace, notes: list[str]) -> tuple[str, Callable]:
        items, metadata = build_items(args, notes)
        if not items:
            left_out = f"; {'; '.join(notes)}" if notes else ""
            raise ConversionError(f"no samples found in {args.src}: looked for {looked_for}{left_out}")
        check_required_fields(args.require, items)
        digest = items_digest(items, args.src)

        def convert(part: tuple[int, int] | None, dst: str) -> Summary:
            chosen = select(items, args.shuffle_seed, part, align=shard_alignment(args))
            opts = options_from(args)
            loaded = ordered_map(_load_safe, ((it, opts) for it in chosen), args.workers)
            return write_samples(loaded, dst, args, metadata, total=len(chosen), notes=notes)

        return digest, convert

    return prepare


def items_digest(items: Sequence[Item], root: str) -> str:
    """A digest of the input listing: keys, files (relative to ``root``), inline values."""
    import hashlib

    h = hashlib.sha256()
    root = os.path.abspath(root)
    for it in items:
        files = sorted((f, os.path.relpath(os.path.abspath(p), root)) for f, p in it.files.items())
        h.update(
            json.dumps([it.key, files, it.values, it.error], sort_keys=True, default=str, ensure_ascii=False).encode(
                "utf-8", "surrogateescape"
            )
            + b"\n"
        )
    return h.hexdigest()


def shard_alignment(args: argparse.Namespace) -> int:
    """Parts of a tar conversion start at multiples of ``--shard-size`` items, so that each
    part's shards are the shards one process writes there and merge keeps them as they are."""
    return args.shard_size if format_for(args.dst, args.format) == "tar" else 1


def part_bounds(total: int, part: tuple[int, int], align: int = 1) -> tuple[int, int]:
    """Items ``[a, b)`` of part ``(i, n)``: contiguous, disjoint, covering, cut at multiples of
    ``align`` when every part gets at least that many (otherwise evenly: more parts than shards
    still all work, and merge re-cuts the shards).

    >>> [part_bounds(10, (i, 3)) for i in range(3)], [part_bounds(10, (i, 2), align=4) for i in range(2)]
    ([(0, 3), (3, 6), (6, 10)], [(0, 4), (4, 10)])
    >>> [part_bounds(10, (i, 3), align=4) for i in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    i, n = part
    if total < n * align:
        align = 1

    def cut(j: int) -> int:
        if j >= n:
            return total
        x = j * total // n
        return min(total, round(x / align) * align)

    return cut(i), cut(i + 1)


def select(items: list, shuffle_seed: int | None, part: tuple[int, int] | None, align: int = 1) -> list:
    """Seeded order, then the I-th contiguous slice of N: merging parts 0..N-1 gives the whole."""
    if shuffle_seed is not None:
        perm = np.random.default_rng(shuffle_seed).permutation(len(items))
        items = [items[i] for i in perm]
    if part is not None:
        a, b = part_bounds(len(items), part, align)
        items = items[a:b]
    return items


#: Options that change how a conversion runs, not what it writes: left out of the fingerprint.
RUN_OPTIONS = {
    "src",
    "dst",
    "workers",
    "quiet",
    "overwrite",
    "part",
    "engine",
    "parts",
    "ray_address",
    "retries",
    "keep_parts",
}


def options_digest(layout: str, args: argparse.Namespace) -> str:
    """A digest of the layout, every option that changes the output, and the output format."""
    import hashlib

    opts = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in sorted(vars(args).items())
        if k not in RUN_OPTIONS and not k.startswith("_")
    }
    opts["format"] = format_for(args.dst, args.format)
    return hashlib.sha256(json.dumps([layout, opts], sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(layout: str, args: argparse.Namespace, digest: str) -> str:
    """The input fingerprint of a conversion: the input listing's digest and the options'."""
    import hashlib

    return hashlib.sha256(f"{digest}\0{options_digest(layout, args)}".encode()).hexdigest()


def check_engine_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine == "ray":
        if args.part is not None:
            parser.error("--part I/N converts one part in this process; with --engine ray use --parts N")
    else:
        for opt, value in (("--parts", args.parts), ("--ray-address", args.ray_address)):
            if value is not None:
                parser.error(f"{opt} applies to --engine ray (use --part I/N to convert one part here)")
        if args.keep_parts:
            parser.error("--keep-parts applies to --engine ray (--part I/N always keeps its part for merge)")


def layout_of(parser: argparse.ArgumentParser) -> str:
    return parser.prog.split()[-1]


def execute(parser: argparse.ArgumentParser, argv: Sequence[str] | None, prepare: Callable) -> int:
    """The whole life of ``mmloader convert LAYOUT``: parse, check, convert (all, one part, or N
    parts on Ray), print the summary or a one-line error; returns the exit status.

    ``prepare(args, notes)`` lists the input and returns ``(digest, convert)``: a digest of the
    input listing (for the part fingerprint) and ``convert(part, dst) -> Summary`` writing part
    ``(i, n)`` (or everything, for None) to ``dst``.
    """
    args = parser.parse_args(argv)
    check_engine_options(parser, args)
    layout = layout_of(parser)
    if args.engine == "ray":
        from .ray_engine import run_on_ray

        return run_on_ray(layout, args, parser.prog)

    def convert() -> Summary:
        if args.part is not None:
            return convert_part(layout, args, prepare)
        notes = check_paths(args.src, args.dst, args.overwrite)
        _digest, write = prepare(args, notes)
        return write(None, args.dst)

    return report_errors(convert, args.dst, parser.prog)


def convert_part(layout: str, args: argparse.Namespace, prepare: Callable) -> Summary:
    """``--part I/N``: convert one part into ``DST.parts/`` and publish its manifest last; a part
    whose manifest is there (same input, options, N) is not converted again."""
    from mmloader.storage.merge import (
        PartError,
        check_part_files,
        manifests_in,
        part_dataset,
        part_manifest_path,
        parts_dir_for,
        read_part_manifest,
        same_conversion,
        write_part_manifest,
    )

    i, n = parse_part(args.part)
    notes = check_paths(args.src, args.dst, args.overwrite, part=True)
    digest, write = prepare(args, notes)
    fp = fingerprint(layout, args, digest)
    parts_dir = parts_dir_for(args.dst)
    parts_dir.mkdir(parents=True, exist_ok=True)
    for record in manifests_in(parts_dir):
        why = same_conversion(record, fp, n)
        if why is None:
            continue
        if not args.overwrite:
            raise ConversionError(
                f"{record['__path__']} is a part of another conversion: {why}; remove "
                f"{parts_dir} or pass --overwrite to replace its parts"
            )
        _remove_part(record)
        notes.append(f"removed {record['__path__']}: a part of another conversion ({why})")
    manifest = part_manifest_path(parts_dir, i, n)
    done = read_part_manifest(manifest)
    if done is not None and done.get("part") == i:
        try:
            check_part_files(done)
        except PartError as e:  # finished once, changed since: not finished any more
            notes.append(f"converting it again: {e}")
            _remove_part(done)
            done = None
    if done is not None and done.get("part") == i:
        return Summary(
            written=done["count"],
            skipped={"(see the part's report)": done["skipped"]} if done["skipped"] else {},
            notes=notes,
            already=str(manifest),
            part=(i, n),
        )
    fmt = format_for(args.dst, args.format)
    dataset = part_dataset(parts_dir, i, n, fmt)
    notes += [str(p) for p in clean_stale_partials(dataset)]  # a killed attempt's partial (same host)
    args._part_dataset = str(dataset)
    summary = write((i, n), str(dataset))
    write_part_manifest(
        dataset,
        part=i,
        parts=n,
        fingerprint=fp,
        fmt=fmt,
        count=summary.written,
        skipped=sum(summary.skipped.values()),
        report=summary.report,
        shard_size=args.shard_size,
        shard_bytes=args.shard_bytes,
        extra={
            "layout": layout,
            "input_digest": digest,
            "options_digest": options_digest(layout, args),
            "seconds": round(summary.seconds, 3),
            "bytes": summary.bytes,
        },
    )
    summary.part = (i, n)
    finished = [r for r in manifests_in(parts_dir) if same_conversion(r, fp, n) is None]
    if len({r["part"] for r in finished}) == n:
        summary.notes.append(f"all {n} parts are converted: `mmloader merge {args.dst}` joins them")
    return summary


def _remove_part(record: dict) -> None:
    import shutil

    from mmloader.storage.merge import part_dataset_of

    path = Path(record["__path__"])
    report = record.get("skipped_report")
    path.unlink(missing_ok=True)  # the manifest first: without it the rest is an unfinished part
    shutil.rmtree(part_dataset_of(record), ignore_errors=True)
    if report:
        (path.parent / report).unlink(missing_ok=True)


def report_errors(convert: Callable[[], Summary], dst: str, prog: str = "mmloader convert") -> int:
    """Run a conversion; print its summary, or a one-line error and exit status 1 (2 for an
    option that cannot work)."""
    try:
        summary = convert()
    except KeyboardInterrupt:
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # the caller's business (mmloader's CLI exits quietly)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (ConversionError, MMLoaderError, OSError, lmdb.Error) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    print(summary.text(dst))
    return 0
