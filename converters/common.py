"""What every converter shares: options, walking the source, loading items in order (in
parallel), the error policy, the skip report and the summary."""
from __future__ import annotations

import argparse
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
from mmloader.errors import MMLoaderError
from mmloader.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage import format_for
from mmloader.storage.atomic import check_not_busy, clean_stale_partials
from mmloader.storage.meta import TAR_FORMATS
from mmloader.storage.shard_index import MANIFEST
from mmloader.storage.tar_writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE

#: Files larger than this are refused before a byte is read (``--max-file-bytes``). 256 MiB is
#: several times the largest ordinary photo or scan (a JPEG at the 150-megapixel ``max_pixels``
#: cap is ~30-80 MB), while ``--workers N`` holds at most N such files in memory at once.
DEFAULT_MAX_FILE_BYTES = 256 << 20
#: How much of an image file is read to check its header before the rest is read.
PROBE_BYTES = 64 << 10

ON_ERROR_HELP = ("raise (default): stop at the first bad sample with its file and reason, nothing "
                 "written; skip: leave bad samples out, list them in DST.skipped.tsv and count them "
                 "in the summary")


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
    transcode: Any = None  # mmloader.mediainfo.Transcode


# -- option values -----------------------------------------------------------------------------
_SIZE = re.compile(r"(?i)\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(k|m|g|t)?(i?b)?\s*")


def parse_size(text: str) -> int:
    """A byte count: ``1G``/``1GiB`` (powers of 1024, as GNU coreutils), ``1GB`` (powers of 1000),
    ``64K``, ``512M``, ``1e9``, ``1000000``.

    >>> parse_size("1G"), parse_size("512M"), parse_size("64K"), parse_size("1e9"), parse_size("2GB")
    (1073741824, 536870912, 65536, 1000000000, 2000000000)
    """
    m = _SIZE.fullmatch(str(text))
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"{text!r} is not a size (examples: 1G, 512M, 64K, 1e9, 1000000)")
    number, unit, suffix = m.groups()
    base = 1000 if suffix and suffix.lower() == "b" else 1024
    value = float(number) * base ** " kmgt".index(unit.lower() if unit else " ")
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def positive_size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 bytes")
    return value


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            allowed = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value}: must be {allowed}")
        return value
    parse.__name__ = "integer"  # argparse names the type in "invalid integer value"
    return parse


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
    for f in fields:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", f):
            raise argparse.ArgumentTypeError(f"{f!r} is not a field name (fields are file extensions "
                                             "such as jpg, txt, json, cls)")
    return fields


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the raw folder (or file)")
    p.add_argument("dst", help="output: NAME.lmdb for LMDB, otherwise a shard directory")
    p.add_argument("--format", choices=("lmdb", "tar"), help="output format (default: lmdb for a .lmdb "
                   "suffix, otherwise tar)")
    p.add_argument("--workers", type=int_at_least(1), default=1, help="parallel loading threads; the output "
                   "is identical to --workers 1 (default 1)")
    p.add_argument("--shard-size", type=int_at_least(1), default=DEFAULT_SHARD_SIZE, metavar="N",
                   help=f"tar: at most N samples per shard (default {DEFAULT_SHARD_SIZE:,})")
    p.add_argument("--shard-bytes", type=positive_size, default=DEFAULT_SHARD_BYTES, metavar="SIZE",
                   help="tar: at most SIZE bytes per shard: 1G, 512M, 64K (powers of 1024), 1GB (of 1000), "
                        "1e9 or a plain integer (default 1G)")
    p.add_argument("--shuffle-seed", type=int_at_least(0), default=None, metavar="SEED",
                   help="write samples in a seeded random order (default: sorted order)")
    p.add_argument("--resize-max", type=int_at_least(1), default=None, metavar="PX",
                   help="re-encode images so the longest side is at most PX (default: keep the bytes)")
    p.add_argument("--quality", type=int_at_least(1, 100), default=90, help="JPEG quality for --resize-max "
                   "(1-100, default 90)")
    p.add_argument("--part", type=_part_arg, default=None, metavar="I/N", help="convert only the I-th of N "
                   "deterministic slices (0 <= I < N); `mmloader merge` joins them")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise", help=ON_ERROR_HELP)
    p.add_argument("--max-file-bytes", type=positive_size, default=DEFAULT_MAX_FILE_BYTES, metavar="SIZE",
                   help="refuse a file larger than SIZE before reading it, as a bad sample (default 256M)")
    p.add_argument("--check-decode", action="store_true", help="fully decode images, videos and audio (default: "
                   "header check; for media: duration, streams and codec from the header)")
    p.add_argument("--max-seconds", type=_positive_seconds, default=None, metavar="S",
                   help="video/audio longer than S seconds is a bad sample (with --transcode: trimmed to S)")
    p.add_argument("--transcode", type=_transcode_spec, default=None, metavar="SPEC",
                   help="re-encode media once: fps=N,size=PX (shorter side),sample_rate=HZ,crf=Q; video -> H.264 "
                        "mp4 (AAC audio track), audio -> FLAC (default: keep the bytes)")
    p.add_argument("--require", type=require_list, default=(), metavar="FIELDS",
                   help="comma-separated fields every sample must have, e.g. jpg,txt (a sample without one "
                        "is a bad sample; a field no sample has is a usage error)")
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
    from mmloader.mediainfo import Transcode  # torch-free, and PyAV is imported only when used
    try:
        return Transcode.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def layout_parser(layout: str, doc: str | None, examples: Sequence[str]) -> argparse.ArgumentParser:
    """The argument parser of ``mmloader convert LAYOUT``, with the options every layout has."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    p = argparse.ArgumentParser(prog=f"mmloader convert {layout}", description=doc, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    return p


def options_from(args) -> Options:
    return Options(format=args.format, resize_max=args.resize_max, quality=args.quality,
                   check_decode=args.check_decode, require=tuple(args.require),
                   max_file_bytes=args.max_file_bytes, max_seconds=getattr(args, "max_seconds", None),
                   transcode=getattr(args, "transcode", None))


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


def check_paths(src: str, dst: str, overwrite: bool) -> list[str]:
    """Fail early, with a clear word, on a missing SRC, an existing or busy DST, a DST that is (or
    holds) the source, or an unwritable place. Removes stale partials of DST left by killed
    conversions; returns what it did, for the summary."""
    if not os.path.exists(src):
        raise ConversionError(f"source {src} does not exist")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if _inside(real_src, real_dst):
        raise ConversionError(f"the destination {dst} is the source {src} or holds it: refusing "
                              "(--overwrite would delete the source)")
    if os.path.lexists(dst):
        if not overwrite:
            raise ConversionError(f"{dst} already exists; pass --overwrite to replace it")
        if not (os.path.isdir(dst) and (is_dataset_dir(dst) or not os.listdir(dst))):
            raise ConversionError(f"{dst} exists and is not an mmloader dataset: --overwrite replaces only "
                                  "a dataset (or an empty folder); move or delete it yourself")
    parent = Path(dst).absolute().parent
    try:  # a real write probe: permission bits alone say nothing for root or read-only mounts
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ConversionError(f"cannot write to {parent}: {e.strerror or e}") from None
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
        if os.path.realpath(full) == self.dst:
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
            reports = {f"{os.path.basename(d)}.skipped.tsv" for d in self.datasets
                       if os.path.dirname(d) == dirpath}
            dst_here = (dst_name in filenames or f"{dst_name}.skipped.tsv" in filenames) and \
                os.path.realpath(dirpath) == os.path.dirname(self.dst)
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
            out.append(f"not input: {len(self.datasets)} dataset(s) inside the source: "
                       + ", ".join(self.datasets[:5]) + (" ..." if len(self.datasets) > 5 else ""))
        if self.hidden:
            out.append(f"not input: {len(self.hidden)} hidden file(s)/folder(s), e.g. {self.hidden[0]}")
        if self.symlinks:
            out.append(f"not followed: {len(self.symlinks)} symlinked folder(s), e.g. {self.symlinks[0]}")
        return out


def select(items: list, shuffle_seed: int | None, part: tuple[int, int] | None) -> list:
    """Seeded order, then the I-th contiguous slice of N: merging parts 0..N-1 gives the whole."""
    if shuffle_seed is not None:
        perm = np.random.default_rng(shuffle_seed).permutation(len(items))
        items = [items[i] for i in perm]
    if part is not None:
        i, n = part
        items = items[i * len(items) // n:(i + 1) * len(items) // n]
    return items


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
        number = float(text)
        if not math.isfinite(number):
            return "bad", f"{value!r} is not a finite number"
        return "number", int(number) if number.is_integer() else number
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
            i += 2 + int.from_bytes(prefix[i + 2:i + 4], "big")
    return True


def _needs_more(prefix: bytes) -> bool:
    if prefix[:3] == b"\xff\xd8\xff":
        return _jpeg_needs_more(prefix)
    return prefix[:4] in (b"II*\0", b"MM\0*")  # TIFF: the first directory may be at the end


#: Image field name for a format found in a header (for files whose name has no image extension).
_FIELD_OF_FORMAT = {"jpeg": "jpg", "mpo": "jpg", "png": "png", "webp": "webp", "bmp": "bmp",
                    "tiff": "tif", "ppm": "ppm"}


def read_file(path: str, limit: int, image: bool) -> bytes:
    """The bytes of ``path``, refused by size before reading; an image's header is checked on its
    first :data:`PROBE_BYTES` before the rest is read."""
    from mmloader.imageinfo import probe
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
                raise ItemError(f"over --max-file-bytes: {size:,} bytes, the limit is {limit:,} (raise it with "
                                "--max-file-bytes to include this file)", path)
            if image and size > PROBE_BYTES:
                head = f.read(PROBE_BYTES)
                try:
                    probe(head)
                except MMLoaderError as e:
                    if not _needs_more(head):
                        raise ItemError(f"bad image: {e} (header checked in the first {PROBE_BYTES // 1024} "
                                        "KiB)", path) from None
                f.seek(0)
            data = f.read(size + 1)  # one allocation of the right size; +1 notices a file that grew
        except MemoryError:
            raise ItemError(f"not enough memory to read its {size:,} bytes (lower --workers or "
                            "--max-file-bytes)", path) from None
        except OSError as e:
            raise ItemError(f"unreadable: {e.strerror or e}", path) from None
    if len(data) > size:
        raise ItemError("the file grew while it was read (still being written?)", path)
    if not data:
        raise ItemError("empty file", path)
    return data


def _image_bytes(data: bytes, path: str, opts: Options) -> tuple[bytes, str | None, str]:
    """Validate (and optionally re-encode) an image; returns (bytes, new extension or None, format)."""
    from mmloader.imageinfo import check_pixels, probe
    try:
        info = probe(data)
        check_pixels(info, opts.max_pixels)
    except MMLoaderError as e:
        raise ItemError(f"bad image: {e}", path) from None
    if not (opts.check_decode or opts.resize_max):
        return data, None, info.format
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
    from mmloader import mediainfo
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
        raise ItemError(f"longer than --max-seconds: {info.duration:.2f} s, the limit is {opts.max_seconds:g} s "
                        "(--transcode trims instead)", path)
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
    from mmloader.mediainfo import field_kind
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
    missing = [f for f in opts.require if f not in item.files and f not in item.values]
    if missing:
        raise ItemError(f"missing required field(s) {', '.join(missing)}", item.where or item.key)
    sample: dict[str, Any] = {"__key__": item.key}
    for fname, path in item.files.items():
        image = fname == "" or fname in IMAGE_EXTENSIONS
        data = read_file(path, opts.max_file_bytes, image)
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
    for fname, value in item.values.items():
        sample[fname] = value
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

    def text(self, dst: str) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        rate = self.written / self.seconds if self.seconds else 0
        lines = [f"wrote {self.written} samples ({self.bytes / 1e6:.1f} MB) to {dst} in {self.seconds:.1f} s "
                 f"({rate:.0f} samples/s, {self.bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s)",
                 f"skipped {skipped}" + (f" ({why})" if why else "")]
        if self.report:
            lines.append(f"skipped samples and reasons: {self.report}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _reason_class(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0]


def report_path_for(dst: str) -> Path:
    return Path(str(Path(dst).absolute()) + ".skipped.tsv")


def _tsv(text: str) -> str:
    """One TSV cell: tabs, newlines and backslashes escaped (file names may hold any of them)."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _raise_policy(error: str, dst: str) -> ConversionError:
    return ConversionError(f"{error} -- stopped at the first bad sample, nothing written "
                           f"(--on-error skip would skip it and list it in {report_path_for(dst).name})")


def write_samples(samples: Iterable[tuple[Item, dict | None, ItemError | None]], dst: str, args,
                  metadata: dict | None = None, total: int | None = None,
                  notes: Sequence[str] = ()) -> Summary:
    """Write loaded samples; apply ``--on-error``; progress bar; atomic output; skip report."""
    summary = Summary(notes=list(notes))
    start = time.perf_counter()
    fmt = format_for(dst, args.format)
    shard_opts = {"shard_size": args.shard_size, "shard_bytes": args.shard_bytes} if fmt == "tar" else {}
    writer = mmloader.writer_for(dst, fmt, overwrite=args.overwrite, metadata=metadata, **shard_opts)
    report_path = report_path_for(dst)
    skipped_rows: list[str] = []
    bar = tqdm(total=total, desc=f"converting -> {Path(dst).name}", unit="sample", disable=args.quiet,
               smoothing=0.1)
    seen_keys: set[str] = set()

    def skip(key: str, where: str, reason: str) -> None:
        cls = _reason_class(reason)
        summary.skipped[cls] = summary.skipped.get(cls, 0) + 1
        skipped_rows.append(f"{_tsv(key)}\t{_tsv(where)}\t{_tsv(reason)}")
        bar.update(1)

    try:
        for item, sample, error in samples:
            if error is None and item.key in seen_keys:
                error = ItemError(f"duplicate key {item.key!r}", item.where or item.key)
            if error is not None:
                if args.on_error == "raise" and not isinstance(error, Skipped):
                    raise _raise_policy(str(error), dst)
                skip(item.key, error.path, error.reason)
                continue
            seen_keys.add(item.key)
            try:
                writer.write(sample)
            except MMLoaderError as e:  # e.g. a key the format cannot hold
                if args.on_error == "raise":
                    raise _raise_policy(f"{item.where or item.key}: {e}", dst) from None
                skip(item.key, item.where, f"rejected by writer: {e}")
                continue
            summary.written += 1
            summary.bytes += sum(len(v) if isinstance(v, (bytes, str)) else 8 for k, v in sample.items()
                                 if not k.startswith("__"))
            bar.update(1)
            if summary.written % 256 == 0:
                bar.set_postfix_str(f"{summary.bytes / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
        if summary.written == 0 and skipped_rows:
            report_path.write_text("key\tfile\treason\n" + "\n".join(skipped_rows) + "\n")
            raise ConversionError(f"no sample could be converted: all {len(skipped_rows)} were skipped "
                                  f"(reasons in {report_path}); nothing written")
        writer.close()
    except BaseException:
        writer.abort()
        bar.close()
        raise
    bar.close()
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
        raise UsageError(f"--require {','.join(unknown)}: no sample has {'this field' if len(unknown) == 1 else 'these fields'} "
                         f"(fields found: {', '.join(sorted(found)) or 'none'})")


def run(build_items: Callable[[argparse.Namespace, list[str]], tuple[list[Item], dict]],
        parser: argparse.ArgumentParser, argv: Sequence[str] | None, looked_for: str) -> int:
    """Parse, enumerate items, load them in order (in parallel), write, summarise.

    ``build_items(args, notes)`` lists the samples (appending to ``notes`` what it left out);
    ``looked_for`` says what it looks for, for the error when it finds nothing.
    """
    args = parser.parse_args(argv)

    def convert() -> Summary:
        notes = check_paths(args.src, args.dst, args.overwrite)
        items, metadata = build_items(args, notes)
        if not items:
            left_out = f"; {'; '.join(notes)}" if notes else ""
            raise ConversionError(f"no samples found in {args.src}: looked for {looked_for}{left_out}")
        check_required_fields(args.require, items)
        items = select(items, args.shuffle_seed, parse_part(args.part))
        opts = options_from(args)
        loaded = ordered_map(_load_safe, ((it, opts) for it in items), args.workers)
        return write_samples(loaded, args.dst, args, metadata, total=len(items), notes=notes)
    return report_errors(convert, args.dst, parser.prog)


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
