"""``mmloader inspect``: what a dataset holds, in a few lines a person can read."""

from __future__ import annotations

import json
import os

from ..errors import FormatError
from ..media.imageinfo import IMAGE_EXTENSIONS
from ..media.mediainfo import field_kind
from ..storage import Store, TarStore, open_store
from ..storage.remote.redaction import redact


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def describe_value(field: str, data: bytes, width: int = 70) -> str:
    """One line for a field's bytes: text shown, images as size/format, the rest as a length."""
    ext = (field[:-3] if field.endswith(".gz") else field).rsplit(".", 1)[-1].lower()
    if field.endswith(".gz"):
        return f"<gzip, {len(data)} bytes>"
    if ext in IMAGE_EXTENSIONS:
        from ..readers.image_decode import probe  # (torch: only when an image is shown)

        try:
            info = probe(data)
            return f"<{info.format} {info.width}x{info.height}, {human_bytes(len(data))}>"
        except Exception as e:
            return f"<unreadable image, {len(data)} bytes: {e}>"
    kind = field_kind(field)
    if kind is not None:
        return f"<{describe_media(kind, data)}, {human_bytes(len(data))}>"
    if ext in ("txt", "cls", "json", "text", "caption", "label", "idx"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return f"<not UTF-8, {len(data)} bytes>"
        text = text.replace("\n", "\\n")
        return repr(text if len(text) <= width else text[:width] + "...")
    return f"<{len(data)} bytes>"


def describe_media(kind: str, data: bytes) -> str:
    """Duration, streams (codec, resolution, fps / sample rate, channels) and the decoder mmloader
    would use: ``mov 10.00 s; h264 854x480 30 fps; aac 44100 Hz 2 ch; decoder pyav``."""
    from ..media.mediainfo import import_soundfile
    from ..media.mediainfo import probe as probe_media
    from ..readers.audio import SOUNDFILE_FORMATS, sniff

    try:
        info = probe_media(data)
    except ImportError as e:
        return f"{kind}, not probed: {e}"
    except Exception as e:
        return f"unreadable {kind}: {e}"
    decoder = (
        "soundfile"
        if (kind == "audio" and sniff(data) in SOUNDFILE_FORMATS and import_soundfile() is not None)
        else "pyav"
    )
    return f"{info.describe()}; decoder {decoder}"


def open_with_metadata(path: str | os.PathLike | Store) -> tuple[Store, dict]:
    """The store and its metadata; an LMDB environment that cannot be opened (unreadable
    ``data.mdb``, not an LMDB file) is a :class:`FormatError` naming it, not an ``lmdb`` error."""
    import lmdb

    try:
        store = open_store(path)
        return store, store.metadata
    except lmdb.Error as e:
        raise FormatError(f"{path}: cannot open the LMDB environment: {e}") from None


def format_name(store: Store) -> str:
    """The format's name as every option spells it: ``lmdb`` or ``tar`` (``tar, indexed by
    energon prepare`` for shards another tool indexed; ``arrow``/``parquet`` for tables)."""
    if store.format == "tar":
        by = store.metadata.get("indexed_by")
        return f"tar, indexed by {by}" if by else "tar"
    if store.format == "lmdb":
        return "lmdb"
    return str(store.metadata.get("format") or store.format)


def _size_of(store: TarStore, s: int) -> int:
    """A shard's size on disk (shards another tool indexed: no size in the manifest)."""
    try:
        return os.path.getsize(store.shard_path(s))
    except OSError:
        return 0


def describe(path: str | os.PathLike | Store, preview: int = 3) -> str:
    """What ``mmloader inspect`` prints: where the dataset is, its format, counts, fields, shards,
    its metadata and a preview, with no credential of a URL or of the environment.

    Args:
        path: a dataset (local or a URL) or an open store.
        preview: samples to show.
    """
    store, meta = open_with_metadata(path)
    lines = [
        f"path:    {getattr(store, 'url', store.path)}"
        + (f" (local copy: {store.path})" if getattr(store, "url", store.path) != store.path else ""),
        f"format:  {format_name(store)} ({meta['format']} v{meta.get('version', '?')})",
        f"samples: {len(store)}",
    ]
    if meta.get("created"):
        lines.append(f"created: {meta['created']} by {meta.get('tool', '?')}")
    lines.append("fields:")
    sizes = meta.get("field_bytes")  # tables and shards another tool indexed do not record them
    columns = meta.get("columns", {})
    for f in meta["fields"]:
        size = human_bytes(sizes.get(f, 0)) if sizes is not None else columns.get(f, "")
        lines.append(f"  {f:<10} {meta['field_counts'][f]:>10} samples  {size:>10}")
    if isinstance(store, TarStore):
        shards = store.shards
        on_disk = [s.get("bytes", _size_of(store, i)) for i, s in enumerate(shards)]
        comp = sum(1 for s in shards if s["compressed"])
        lines.append(f"shards:  {len(shards)} ({human_bytes(sum(on_disk))}{f', {comp} compressed' if comp else ''})")
        for s, size in list(zip(shards, on_disk))[:3]:
            lines.append(f"  {s['file']}: {s['count']} samples, {human_bytes(size)}")
        if len(shards) > 3:
            lines.append(f"  ... {len(shards) - 3} more")
    user = meta.get("metadata") or {}
    if user:
        text = json.dumps(user, ensure_ascii=False)
        text = redact(text)  # a URL a user stored there shows no password (local paths stay)
        lines.append(f"metadata: {text[:200]}{'...' if len(text) > 200 else ''}")
    if preview and len(store):
        lines.append("preview:")
        for i in range(min(preview, len(store))):
            try:
                rec = store.read(i)
            except Exception as e:
                lines.append(f"  [{i}] unreadable: {redact(str(e))}")
                continue
            lines.append(f"  [{i}] key={rec['__key__']!r}")
            for f in meta["fields"]:
                if f in rec:
                    lines.append(f"       {f}: {describe_value(f, rec[f])}")
    return "\n".join(lines)


def count_passing(path: str | os.PathLike | Store, where: str) -> str:
    """One line: how many samples pass the filter ``where`` (:func:`mmloader.select`), each field
    that every sample has read as the modality of its name (``json.clip_score``, ``jpg.width``,
    ``cls``; ``.`` in a field's name becomes ``_``).

    Args:
        path: a dataset (local or a URL) or an open store.
        where: a filter expression.
    """
    from ..align.select import select  # (torch)
    from ..align.zip import Zipped
    from ..readers import reader_for
    from ..readers.registry import is_pickle_field

    store, meta = open_with_metadata(path)
    counts = meta["field_counts"]
    fields = [f for f in meta["fields"] if counts.get(f) == len(store) and not is_pickle_field(f)]
    readers = {f.replace(".", "_"): reader_for(store, f) for f in fields}
    if not readers:
        raise ValueError(f"no field of {redact(str(store.path))} is in every sample: nothing to filter on")
    kept = select(Zipped(readers), where)
    share = len(kept) / max(len(store), 1)
    return f"filter:  {where!r} keeps {len(kept)} of {len(store)} samples ({share:.1%})"


# -- the subcommand ------------------------------------------------------------------------------
HELP = "format, counts, fields, shards and a preview of a dataset"
EXAMPLES = [
    "mmloader inspect out.lmdb",
    "mmloader inspect shards/ -n 0",
    "mmloader inspect s3://bucket/shards/",
    "mmloader inspect out.lmdb -n 0 --filter 'json.clip_score >= 0.28'",
]


def add_arguments(s) -> None:
    """The options of ``mmloader inspect``."""
    from .args import int_at_least

    s.add_argument(
        "path",
        help="a dataset: NAME.lmdb, a shard directory, an Arrow/Parquet table, an Energon or img2dataset folder, "
        "local or a URL (s3://, gs://, az://, https://, hf://)",
    )
    s.add_argument("-n", "--preview", type=int_at_least(0), default=3, help="samples to preview (default 3)")
    s.add_argument(
        "--filter",
        metavar="EXPR",
        help='also count the samples that pass a filter, e.g. "json.clip_score >= 0.28 and jpg.width >= 256"',
    )


def run(args) -> int:
    """Print the dataset's description."""
    print(describe(args.path, preview=args.preview))
    if args.filter:
        print(count_passing(args.path, args.filter))
    return 0
