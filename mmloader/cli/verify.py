"""``mmloader verify``: check a dataset against its own metadata, byte for byte."""

from __future__ import annotations

import contextlib
import functools
import os
import zlib
from dataclasses import dataclass
from dataclasses import field as dc_field

import numpy as np
from tqdm import tqdm

from ..errors import MMLoaderError
from ..media.imageinfo import IMAGE_EXTENSIONS
from ..storage import LMDBStore, Store, TarStore, open_store
from ..storage.remote.redaction import redact
from ..storage.remote.tar import RemoteTarStore
from ..storage.tar.layout import sha256_file
from ..storage.tar.stages import group_samples, tar_members


@dataclass
class Report:
    """What :func:`verify` found: the dataset, the samples checked and each problem, as shown
    (no credential of a URL or of the environment)."""

    path: str
    samples: int = 0
    problems: list[str] = dc_field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __post_init__(self) -> None:
        self.path = redact(str(self.path))

    def add(self, where: str, what: str) -> None:
        self.problems.append(redact(f"{where}: {what}"))

    def summary(self) -> str:
        head = f"{self.path}: {self.samples} samples checked, "
        if self.ok:
            return head + "no problems"
        return head + f"{len(self.problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in self.problems)


@functools.lru_cache(maxsize=None)  # asked for every value; a dataset has a few field names
def _is_image(field: str) -> bool:
    field = field[:-3] if field.endswith(".gz") else field  # readers gunzip, then decode
    return field.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def _try_decode(report: Report, where: str, key: str, field: str, data: bytes) -> None:
    try:
        from ..readers.base import DEFAULT_MAX_FIELD_BYTES, _gunzip  # (torch: only with --decode)
        from ..readers.image_decode import decode_to_tensor

        decode_to_tensor(_gunzip(data, DEFAULT_MAX_FIELD_BYTES) if field.endswith(".gz") else data)
    except Exception as e:
        report.add(where, f"sample {key!r} field {field!r} does not decode: {e}")


def verify(path: str | os.PathLike | Store, decode: bool = False, progress: bool = True) -> Report:
    """Check a dataset; returns a :class:`Report` listing every bad shard/sample and why.

    >>> r = verify("shards/", decode=True); print(r.summary())    # doctest: +SKIP
    """
    import lmdb

    try:
        store = open_store(path)
        meta = store.metadata
    except (MMLoaderError, OSError, ValueError) as e:
        report = Report(str(path))
        report.add(str(path), str(e))
        return report
    except lmdb.Error as e:  # e.g. data.mdb unreadable: lmdb.ReadonlyError
        report = Report(str(path))
        report.add(str(path), f"cannot open the LMDB environment: {e}")
        return report
    report = Report(getattr(store, "url", store.path))
    if isinstance(store, LMDBStore):
        try:
            _verify_lmdb(store, meta, report, decode, progress)
        except (lmdb.Error, OSError) as e:
            report.add(store.path, f"LMDB unreadable: {type(e).__name__}: {e}")
    elif isinstance(store, TarStore):
        _verify_shards(store, meta, report, decode, progress)
    else:  # a table read in place (Arrow, Parquet): every row of every column read
        _verify_rows(store, meta, report, decode, progress)
    return report


def _verify_rows(store: Store, meta: dict, report: Report, decode: bool, progress: bool, batch: int = 1024) -> None:
    """Read every row's fields (in batches): counts against the metadata, empty and (``decode``)
    undecodable images; a row that cannot be read is reported with its number."""
    n, counts = len(store), dict.fromkeys(meta["fields"], 0)
    kinds = getattr(store, "kinds", {})  # an Image/Audio struct column is checked as an image too
    for start in tqdm(range(0, n, batch), desc="rows", unit="batch", disable=not progress):
        rows = list(range(start, min(start + batch, n)))
        try:
            keys, columns = store.read_many(rows, meta["fields"])
        except (MMLoaderError, OSError, ValueError) as e:
            report.add(store.path, f"rows {rows[0]}-{rows[-1]}: unreadable: {e}")
            continue
        for f, values in columns.items():
            for key, v in zip(keys, values):
                if v is None:
                    continue
                counts[f] += 1
                image = _is_image(f) or (kinds.get(f) == "struct" and "audio" not in f.lower())
                if image and not len(v):
                    report.add(store.path, f"sample {key!r} field {f!r}: empty image (0 bytes)")
                elif decode and image:
                    _try_decode(report, store.path, key, f, v)
        report.samples += len(rows)
    for f, want in meta["field_counts"].items():
        if counts.get(f, 0) != want:
            report.add(store.path, f"field {f!r}: {counts.get(f, 0)} values, the table's metadata says {want}")


def _verify_lmdb(store: LMDBStore, meta: dict, report: Report, decode: bool, progress: bool) -> None:
    n = int(meta["count"])
    where = store.path
    seen = 0
    records = store.key_records()
    for i, (idx, key, back) in enumerate(tqdm(records, total=n, desc="keys", disable=not progress, unit="sample")):
        if idx != i:
            report.add(where, f"key table out of order at entry {i} (index {idx})")
            break
        if back != i:
            report.add(where, f"key {key.decode(errors='replace')!r} does not map back to index {i}")
        seen += 1
    if seen != n:
        report.add(where, f"metadata says {n} samples, the key table holds {seen}")
    for f in meta["fields"]:
        want_count = meta["field_counts"][f]
        count = nbytes = crc = 0
        values = store.field_records(f)
        for idx, v in tqdm(values, total=want_count, desc=f"field {f}", disable=not progress, unit="sample"):
            if not 0 <= idx < n:
                report.add(where, f"field {f!r} has a record for index {idx}, outside 0..{n - 1}")
                continue
            count += 1
            nbytes += len(v)
            crc = zlib.crc32(v, crc)
            if _is_image(f) and not len(v):  # a truncated write; found without decoding
                report.add(where, f"sample {store.key(idx)!r} field {f!r}: empty image (0 bytes)")
            elif decode and _is_image(f):
                _try_decode(report, where, store.key(idx), f, v)
        if count != want_count:
            missing = "" if want_count != n else " (every sample should have it)"
            report.add(where, f"field {f!r}: {count} records, metadata says {want_count}{missing}")
        if nbytes != meta["field_bytes"][f]:
            report.add(where, f"field {f!r}: {nbytes} bytes, metadata says {meta['field_bytes'][f]}")
        if "field_crc32" in meta and crc != meta["field_crc32"][f]:
            report.add(where, f"field {f!r}: CRC32 mismatch: stored bytes changed since writing")
    report.samples = seen


def _verify_shards(store: TarStore, meta: dict, report: Report, decode: bool, progress: bool) -> None:
    keys: np.ndarray | None
    try:
        keys, _order = store.key_table()
        if len(keys) != meta["count"] or len(_order) != meta["count"]:
            report.add(store.path, f"key index holds {len(keys)} keys, manifest says {meta['count']}")
            keys = None
    except (OSError, ValueError) as e:
        report.add(store.path, f"key index unreadable: {e}")
        keys = None
    bar = tqdm(total=int(meta["count"]), desc="verifying shards", unit="sample", disable=not progress)
    field_counts: dict[str, int] = {}
    for s, shard in enumerate(meta["shards"]):
        with _local_copy(store, s, report) as path:
            if path is not None:
                _verify_shard(store, meta, report, decode, s, path, keys, bar, field_counts)
    bar.close()
    for f, want in meta["field_counts"].items():
        if field_counts.get(f, 0) != want and not report.problems:
            report.add(store.path, f"field {f!r}: {field_counts.get(f, 0)} members, manifest says {want}")


@contextlib.contextmanager
def _local_copy(store: TarStore, s: int, report: Report):
    """A local file holding shard ``s`` (the shard itself, or a download of a remote one); None
    (reported) when it is missing."""
    name = store.shards[s]["file"]
    if isinstance(store, RemoteTarStore):
        if store.location.size(name) is None:
            report.add(name, f"listed in the manifest but missing at {store.url}")
            yield None
            return
        copy = store.local_shard(s)
        try:
            path = copy.__enter__()
        except (MMLoaderError, OSError) as e:
            report.add(name, f"unreadable: {e}")
            yield None
            return
        try:
            yield path
        finally:
            copy.__exit__(None, None, None)
        return
    path = store.shard_path(s)
    if not os.path.isfile(path):
        report.add(name, "listed in the manifest but missing on disk")
        yield None
        return
    yield path


def _verify_shard(
    store: TarStore, meta: dict, report: Report, decode: bool, s: int, path: str, keys, bar, field_counts: dict
) -> None:
    shard = meta["shards"][s]
    name = shard["file"]
    size = os.path.getsize(path)
    if "bytes" in shard and size != shard["bytes"]:
        report.add(name, f"size {size} bytes, manifest says {shard['bytes']} (truncated or replaced?)")
    try:
        digest = sha256_file(path) if "sha256" in shard else None  # shards another tool indexed: no checksum
    except OSError as e:  # one unreadable shard is a problem to list, not the end of the check
        report.add(name, f"unreadable: {e.strerror or e}")
        return
    if digest is not None and digest != shard["sha256"]:
        report.add(name, "sha256 checksum mismatch: the file changed since it was written/indexed")
    try:
        if isinstance(store, RemoteTarStore) or "index" not in shard:  # (another tool's index: its offsets)
            table = store.offset_table(s)
        else:
            table = np.load(os.path.join(store.path, shard["index"]), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, MMLoaderError) as e:
        report.add(name, f"offset index {shard.get('index', '')} unreadable: {e}".replace("index  ", "index "))
        return
    cols = {f: c for c, f in enumerate(shard["fields"])}
    start = meta["_starts"][s]
    row = 0
    excluded = getattr(store, "excluded", {}).get(name, set())  # samples an Energon split leaves out
    try:
        for sample in group_samples(tar_members(path), where=path):
            if sample["__key__"] in excluded:
                continue
            if row >= shard["count"]:
                row += 1
                continue
            key = sample["__key__"]
            if keys is not None and bytes(keys[start + row]).decode() != key:
                report.add(
                    name, f"sample {row}: key {key!r} but the key index says {bytes(keys[start + row]).decode()!r}"
                )
            offsets = sample["__offsets__"]
            for f, (off, sz) in offsets.items():
                field_counts[f] = field_counts.get(f, 0) + 1
                c = cols.get(f)
                if c is None or row >= len(table) or tuple(table[row, c]) != (off, sz):
                    report.add(
                        name, f"sample {key!r} field {f!r}: offset index does not match the tar (tar: {off}+{sz})"
                    )
                elif _is_image(f) and not sz:
                    report.add(name, f"sample {key!r} field {f!r}: empty image (0 bytes)")
                elif decode and _is_image(f):
                    _try_decode(report, name, key, f, sample[f])
            row += 1
            bar.update(1)
    except Exception as e:
        report.add(name, f"tar unreadable after {row} samples: {type(e).__name__}: {e}")
    if row != shard["count"]:
        report.add(name, f"{row} samples in the tar, manifest says {shard['count']}")
    report.samples += min(row, shard["count"])


# -- the subcommand ------------------------------------------------------------------------------
HELP = "check manifest, checksums, indexes and fields; exit 1 listing each problem"
EXAMPLES = ["mmloader verify out.lmdb", "mmloader verify shards/ --decode -q", "mmloader verify s3://bucket/shards/"]


def add_arguments(s) -> None:
    """The options of ``mmloader verify``."""
    s.add_argument("path", help="a dataset: NAME.lmdb or a shard directory, local or a URL")
    s.add_argument("--decode", action="store_true", help="also decode every image")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    """Verify; exit status 1 when a problem was found."""
    from .inspect import open_with_metadata

    store, _ = open_with_metadata(args.path)  # not a dataset at all: a one-line error, like every command
    report = verify(store, decode=args.decode, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 1
