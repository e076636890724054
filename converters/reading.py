"""Loading one item (in worker threads): bounded reads, image and media checks, in order."""

from __future__ import annotations

import codecs
import io
import json
import os
import stat
from typing import Any, Callable, Iterable, Iterator

from PIL import Image

from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.errors import MMLoaderError
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)

from .items import PROBE_BYTES, Item, ItemError, Options
from .sources import label_kind


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
        if data == codecs.BOM_UTF8:  # (a byte-order mark, as Notepad writes, is not text)
            raise ItemError("empty file (a byte-order mark alone)", path)
        return data.removeprefix(codecs.BOM_UTF8)
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
        # "3." is image 3 of a document, its format named by its header ("3.jpg")
        number, dot, ext = fname.partition(".")
        numbered = bool(dot) and number.isdigit() and ext == ""
        image = fname == "" or fname in IMAGE_EXTENSIONS or numbered
        if image:
            data, new_ext, fmt = _image_bytes(data, path, opts)
            if fname == "" or numbered:  # the file's name does not say: the header does
                fname = _FIELD_OF_FORMAT.get(fmt, "")
                if not fname:
                    raise ItemError(f"bad image: {fmt} is not a supported image format", path)
            fname = new_ext or fname
            if numbered:
                fname = f"{number}.{fname}"
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
            if len(data) > opts.max_file_bytes:
                raise ItemError(f"{len(data)} bytes, over --max-file-bytes ({opts.max_file_bytes})", item.where)
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
