"""Join datasets converted in parts (``convert --part I/N``, ``--engine ray --parts N``) into one,
without re-encoding, and byte-identical to converting the whole input in one process.

**Parts.** Part I of N of a conversion to ``DST`` is written (atomically) as the dataset
``DST.parts/part-0000I-of-0000N`` (``.lmdb`` for LMDB), and then, last, its **part manifest**
``DST.parts/part-0000I-of-0000N.json`` is published (temporary file + rename): part I of N, the
input fingerprint (the input listing and every option that changes the output), the mmloader
version, sample and skip counts, and the size and sha256 of every file of the part. A part
without a manifest is not finished, whatever else is there; a part with one is never converted
again. :func:`merge_parts` refuses a missing, duplicated or foreign part (another input, other
options, another N, another mmloader version) with one line naming it.

**The shard rule (tar).** The merged shards are exactly the shards one process would write:
``ShardWriter`` cuts a shard before a sample when the shard holds ``shard_size`` samples or when
the sample's members would take it past ``shard_bytes``, and merge replays that rule over the
parts' samples in order. A part's shard is kept as it is (hard-linked, or copied where links are
impossible) when the replay reaches its start with a fresh shard and would cut at its end; the
converters cut parts at multiples of ``--shard-size`` samples, so that is every shard unless
samples were skipped or ``--shard-bytes`` cut a shard early. From a shard that differs on, the
samples are copied member by member (their tar headers are self-contained and their mtimes fixed,
so the bytes are those one process writes) into new shards, until a cut lands on a part's shard
boundary again. LMDB parts are copied record by record.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from .._version import __version__
from ..errors import FormatError
from .atomic import AtomicDirectory
from .shard_index import MANIFEST, ShardIndexBuilder
from .tar_layout import HashingFile, end_of_archive, sample_bytes, sha256_file, should_cut
from .tar_store import TarStore
from .tar_writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE

PART_FORMAT = "mmloader-part"
PART_VERSION = 1
_PART_NAME = re.compile(r"part-(\d+)-of-(\d+)")


class PartError(FormatError):
    """A set of parts that cannot be merged (missing, duplicated, foreign, incomplete)."""


# -- names -------------------------------------------------------------------------------------
def parts_dir_for(dst: str | os.PathLike) -> Path:
    """Where the parts of a conversion to ``dst`` go: ``DST.parts`` beside it."""
    return Path(str(Path(dst).absolute()).rstrip(os.sep) + ".parts")


def part_name(i: int, n: int) -> str:
    return f"part-{i:05d}-of-{n:05d}"


def part_dataset(parts_dir: str | os.PathLike, i: int, n: int, fmt: str) -> Path:
    return Path(parts_dir) / (part_name(i, n) + (".lmdb" if fmt == "lmdb" else ""))


def part_manifest_path(parts_dir: str | os.PathLike, i: int, n: int) -> Path:
    return Path(parts_dir) / f"{part_name(i, n)}.json"


# -- writing a part manifest ---------------------------------------------------------------------
def _dataset_files(path: Path) -> list[Path]:
    """The files of a finished dataset a part manifest lists (LMDB's lock file is not data)."""
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != "lock.mdb")


def write_part_manifest(
    dataset: str | os.PathLike,
    *,
    part: int,
    parts: int,
    fingerprint: str,
    fmt: str,
    count: int,
    skipped: int,
    report: str | os.PathLike | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    extra: dict | None = None,
) -> Path:
    """Publish the manifest of a finished part, last (temporary file + rename).

    The sha256 of the tar shards come from their index (hashed while they were written); every
    other file is hashed here.
    """
    dataset = Path(dataset)
    known: dict[str, str] = {}
    if fmt == "tar":
        index = json.loads((dataset / MANIFEST).read_text())
        known = {s["file"]: s["sha256"] for s in index["shards"]}
    files = {}
    for f in _dataset_files(dataset):
        rel = f.relative_to(dataset).as_posix()
        files[rel] = {"bytes": f.stat().st_size, "sha256": known.get(rel) or sha256_file(f)}
    record = {
        "format": PART_FORMAT,
        "version": PART_VERSION,
        "part": part,
        "parts": parts,
        "fingerprint": fingerprint,
        "tool": f"mmloader {__version__}",
        "dataset": dataset.name,
        "dataset_format": fmt,
        "count": count,
        "skipped": skipped,
        "skipped_report": Path(report).name if report else None,
        "shard_size": shard_size,
        "shard_bytes": shard_bytes,
        "files": files,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    out = part_manifest_path(dataset.parent, part, parts)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    return out


# -- reading and checking parts ------------------------------------------------------------------
def read_part_manifest(path: str | os.PathLike) -> dict | None:
    """The part manifest at ``path``, or None when it is not one."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read(1 << 24))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != PART_FORMAT:
        return None
    record["__path__"] = str(Path(path).absolute())
    return record


def manifests_in(parts_dir: str | os.PathLike) -> list[dict]:
    """Every part manifest in a parts directory, sorted by name."""
    out = []
    for p in sorted(Path(parts_dir).glob("part-*-of-*.json")):
        record = read_part_manifest(p)
        if record is not None:
            out.append(record)
    return out


def same_conversion(record: dict, fingerprint: str | None, parts: int, like: dict | None = None) -> str | None:
    """Why ``record`` is not a part of the conversion (``fingerprint``, ``parts``), or None;
    ``like``: a part of that conversion, to say whether the input or the options differ."""
    if record.get("parts") != parts:
        return f"it is part {record.get('part')} of {record.get('parts')}, not of {parts}"
    if record.get("tool") != f"mmloader {__version__}":
        return f"it was written by {record.get('tool')}, this is mmloader {__version__}"
    if record.get("fingerprint") != fingerprint:
        if like and like.get("input_digest") and record.get("input_digest") != like["input_digest"]:
            return "it was converted from another input (the input listing differs)"
        if like and like.get("options_digest") and record.get("options_digest") != like["options_digest"]:
            return "it was converted with other options (output format, shard limits, image or column options)"
        return "it was converted from another input or with other options (the input fingerprint differs)"
    return None


def _manifest_for_dataset(path: Path) -> dict | None:
    stem = path.name[:-5] if path.name.endswith(".lmdb") else path.name
    return read_part_manifest(path.parent / f"{stem}.json")


def _download_hint(url: str) -> str:
    """How to copy the folder at ``url`` to a local one, for error messages."""
    from .remote import scheme_of

    name = url.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    tool = {"s3": "aws s3 cp --recursive", "gs": "gcloud storage cp -r", "az": "azcopy copy --recursive"}
    cmd = tool.get(scheme_of(url))
    return f"`{cmd} {url.rstrip('/')}/ {name}/`" if cmd else f"with your storage's copy tool, into {name}/"


def check_remote_sources(sources: Sequence[str | os.PathLike]) -> None:
    """Refuse, before anything is read, the URL sources merge cannot read: tar shards (read from
    local folders) and parts (written to a filesystem every task reaches). LMDB datasets on object
    storage are read through their cached copy."""
    from . import format_for
    from .remote import is_url

    for src in sources:
        if not is_url(src):
            continue
        url = str(src)
        last = url.rstrip("/").rsplit("/", 1)[-1]
        if last.endswith(".parts") or _PART_NAME.fullmatch(last.removesuffix(".lmdb").removesuffix(".json")):
            raise PartError(
                f"{url}: merge reads parts from a local parts directory (DST.parts/): download it "
                f"first, e.g. {_download_hint(url)}"
            )
        if format_for(url) == "tar":
            raise FormatError(
                f"{url}: merge reads tar shards from local folders: download them first, e.g. "
                f"{_download_hint(url)}, then merge that folder"
            )


def find_parts(sources: Sequence[str | os.PathLike]) -> list[dict] | None:
    """The part manifests behind ``sources`` (parts directories, part datasets or manifests),
    or None when no source is a part (plain datasets, concatenated as they are). A URL source is
    a plain dataset (parts are local)."""
    from .remote import is_url

    check_remote_sources(sources)
    found: list[dict] = []
    plain: list[str] = []
    for src in sources:
        if is_url(src):  # never through Path(): it would collapse the "//"
            plain.append(str(src))
            continue
        p = Path(src)
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        if p.is_file() and p.suffix == ".json" and (manifest := read_part_manifest(p)) is not None:
            found.append(manifest)
        elif p.is_dir() and (records := manifests_in(p)):
            found += records
        elif p.is_dir() and (record := _manifest_for_dataset(p)) is not None:
            found.append(record)
        elif p.is_dir() and p.name.endswith(".parts"):
            raise PartError(f"{p} holds no part manifest: no part is finished yet (convert with --part I/N)")
        elif p.is_dir() and _PART_NAME.fullmatch(p.name.removesuffix(".lmdb")):
            raise PartError(
                f"{p} has no part manifest: that part is not finished (convert it again with "
                "the same --part I/N: finished parts are skipped)"
            )
        else:
            plain.append(str(p))
    if found and plain:
        raise PartError(
            f"{plain[0]} is not a part written by `convert --part I/N` (no part manifest); "
            "merge the parts of one conversion, or plain datasets, not both"
        )
    return found or None


def check_parts(records: list[dict]) -> list[dict]:
    """The parts ``0..N-1`` of one conversion, in order; :class:`PartError` naming the first part
    that is missing, duplicated or foreign."""
    first = records[0]  # the first given is the reference
    n, fp = first.get("parts"), first.get("fingerprint")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PartError(f"{first['__path__']}: parts {n!r} is not a positive number of parts")
    by_part: dict[int, dict] = {}
    for r in records:
        why = same_conversion(r, fp, n, like=first)
        if why:
            raise PartError(f"foreign part {r['__path__']}: {why} (compared with {first['__path__']})")
        i = r.get("part")
        if not isinstance(i, int) or not 0 <= i < n:
            raise PartError(f"{r['__path__']}: part {i!r} is not one of 0..{n - 1}")
        if i in by_part:
            raise PartError(f"part {i}/{n} given twice: {by_part[i]['__path__']} and {r['__path__']}")
        by_part[i] = r
    missing = [i for i in range(n) if i not in by_part]
    if missing:
        where = Path(first["__path__"]).parent
        raise PartError(
            f"part {missing[0]}/{n} is missing ({part_manifest_path(where, missing[0], n)}"
            + (f", and {len(missing) - 1} more" if len(missing) > 1 else "")
            + f"): convert it with --part {missing[0]}/{n}"
        )
    ordered = [by_part[i] for i in range(n)]
    for r in ordered:
        check_part_files(r)
    return ordered


def part_dataset_of(record: dict) -> Path:
    return Path(record["__path__"]).parent / record["dataset"]


def check_part_files(record: dict, rehash: bool = False) -> None:
    """Every file the manifest lists is there with its size (and, with ``rehash``, its sha256)."""
    root = part_dataset_of(record)
    if not root.is_dir():
        raise PartError(f"part {record['part']}/{record['parts']}: its dataset {root} is missing")
    for rel, want in record["files"].items():
        f = root / rel
        try:
            size = f.stat().st_size
        except OSError:
            raise PartError(f"part {record['part']}/{record['parts']}: {f} is missing") from None
        if size != want["bytes"]:
            raise PartError(
                f"part {record['part']}/{record['parts']}: {f} has {size:,} bytes, its manifest "
                f"says {want['bytes']:,} (changed since the part was written)"
            )
        if rehash and sha256_file(f) != want["sha256"]:
            raise PartError(
                f"part {record['part']}/{record['parts']}: {f} does not match the sha256 in its "
                "manifest (changed since the part was written)"
            )


# -- merging ----------------------------------------------------------------------------------
@dataclass
class MergeResult:
    path: Path
    count: int = 0
    parts: int = 0
    kept_shards: int = 0
    written_shards: int = 0
    skipped: int = 0
    report: str | None = None
    notes: list[str] = field(default_factory=list)


def _where(store) -> str:
    return str(getattr(store, "url", store.path))  # a URL's store names the URL, not its cached copy


def _user_metadata(stores) -> dict:
    first = stores[0].metadata.get("metadata", {})
    for s in stores[1:]:
        if s.metadata.get("metadata", {}) != first:
            raise FormatError(
                f"cannot merge: {_where(s)} has different metadata (e.g. class names) than {_where(stores[0])}"
            )
    return dict(first)


def merge(
    parts: Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    format: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    shard_size: int | None = None,
    shard_bytes: int | None = None,
) -> Path:
    """Concatenate the datasets ``parts`` in order into ``dst``. A part may be an LMDB dataset on
    object storage (read through its cached copy); tar shards are read from local folders.

    Shard datasets: with ``shard_size``/``shard_bytes`` the output shards are cut as one
    ``ShardWriter`` with those limits would cut them (kept shards hard-linked, the others
    rewritten by copying their members); without, every shard is kept as it is. LMDB: records
    are copied byte for byte.

    >>> merge(["a", "b"], "all")     # doctest: +SKIP
    """
    return _merge_stores(
        parts,
        dst,
        format=format,
        overwrite=overwrite,
        progress=progress,
        shard_size=shard_size,
        shard_bytes=shard_bytes,
    ).path


def _merge_stores(
    parts, dst, *, format=None, overwrite=False, progress=True, shard_size=None, shard_bytes=None
) -> MergeResult:
    from . import open_store
    from .remote import is_url

    check_remote_sources(parts)  # before anything is written or uploaded
    if is_url(str(dst)):  # merged locally, then uploaded, the manifest last
        import tempfile

        from .remote import Location
        from .remote_write import _tmp_root, check_destination, upload_existing

        fmt = format or ("lmdb" if str(dst).rstrip("/").lower().endswith(".lmdb") else None)
        for marker_fmt in ("tar", "lmdb"):
            check_destination(Location(str(dst)), marker_fmt, overwrite)
        with tempfile.TemporaryDirectory(prefix=".mmloader-merge-", dir=_tmp_root()) as tmp:
            local = os.path.join(tmp, "merged.lmdb" if fmt == "lmdb" else "merged")
            result = _merge_stores(
                parts, local, format=fmt, progress=progress, shard_size=shard_size, shard_bytes=shard_bytes
            )
            upload_existing(local, str(dst), overwrite=overwrite, progress=progress)
            result.path = str(dst)  # type: ignore[assignment]
            return result
    stores = [open_store(p) for p in parts]
    if any(is_url(p) and s.format == "tar" for p, s in zip(parts, stores)):  # e.g. a .json manifest URL
        raise FormatError("merge reads tar shards from local folders: download them first")
    if not stores:
        raise FormatError("nothing to merge")
    from . import format_for, writer_for

    fmt = format_for(dst, format)  # the one rule: a .lmdb suffix means LMDB, else tar shards
    meta = _user_metadata(stores)
    total = sum(len(s) for s in stores)
    result = MergeResult(Path(dst).absolute(), count=total, parts=len(stores))
    if fmt == "tar" and all(isinstance(s, TarStore) for s in stores):
        _merge_shards(stores, dst, meta, overwrite, progress, shard_size, shard_bytes, result)
        return result
    # LMDB output, or tar shards from LMDB parts: records copied byte for byte, nothing re-encoded
    with writer_for(dst, fmt, overwrite=overwrite, metadata=meta, shard_size=shard_size, shard_bytes=shard_bytes) as w:
        bar = tqdm(total=total, desc="merging", unit="sample", disable=not progress)
        for store in stores:
            for i in range(len(store)):
                rec = store.read(i)
                rec.pop("__index__")
                w.write(rec)
                bar.update(1)
        bar.close()
    return result


def _sample_spans(store: TarStore, s: int, fields: list[str]):
    """Per sample of shard ``s``: (member-ordered offsets, byte span start, end, cut-rule size)."""
    table = store.offset_table(s)
    start = 0
    for row in range(table.shape[0]):
        present = [
            (int(table[row, c, 0]), int(table[row, c, 1]), f) for c, f in enumerate(fields) if table[row, c, 0] >= 0
        ]
        present.sort()  # member order in the tar = the order the sample's fields were written
        end = max(o + n + (-n % tarfile.BLOCKSIZE) for o, n, _f in present)
        yield {f: (o, n) for o, n, f in present}, start, end, sample_bytes(n for _o, n, _f in present)
        start = end


def _first_sample_size(store: TarStore) -> int | None:
    for s, shard in enumerate(store.shards):
        if shard["count"]:
            return next(_sample_spans(store, s, shard["fields"]))[3]
    return None


def _merge_shards(stores, dst, meta, overwrite, progress, shard_size, shard_bytes, result: MergeResult):
    recut = shard_size is not None or shard_bytes is not None
    shard_size = shard_size or DEFAULT_SHARD_SIZE
    shard_bytes = shard_bytes or DEFAULT_SHARD_BYTES
    out = AtomicDirectory(dst, overwrite=overwrite)
    state: dict = {"file": None, "name": "", "samples": 0}

    def full(size: int) -> bool:
        """ShardWriter's rule (:func:`should_cut`) before a sample of ``size``?"""
        f = state["file"]
        return f is not None and should_cut(
            samples=state["samples"], written=f.pos, next_sample=size, shard_size=shard_size, shard_bytes=shard_bytes
        )

    def close_out() -> None:
        f = state["file"]
        f.write(end_of_archive(f.pos))
        f.close()
        builder.end_shard(state["name"], f.pos, f.sha.hexdigest())
        result.written_shards += 1
        state["file"] = None

    try:
        builder = ShardIndexBuilder(out.tmp)
        bar = tqdm(total=result.count, desc="merging", unit="sample", disable=not progress)
        firsts = [_first_sample_size(s) for s in stores]
        for p, store in enumerate(stores):
            keys, _ = store.key_table()
            nonempty = [s for s, shard in enumerate(store.shards) if shard["count"]]
            next_size = next((firsts[q] for q in range(p + 1, len(stores)) if firsts[q] is not None), None)
            for s in nonempty:
                shard = store.shards[s]
                if shard["compressed"]:
                    raise FormatError(f"cannot merge compressed shard {store.shard_path(s)}")
                spans = list(_sample_spans(store, s, shard["fields"]))
                first = store.first_index(s)
                if recut and full(spans[0][3]):
                    close_out()  # the rule cuts where this part shard starts: in step again
                # Would one process cut right after this shard? Inside a part, the part's writer
                # decided that with the same state and the same next sample; after a part's last
                # shard, ask the rule about the next part's first sample.
                cut_after = (
                    not recut
                    or s != nonempty[-1]
                    or next_size is None
                    or shard["count"] >= shard_size
                    or spans[-1][2] + next_size > shard_bytes
                )
                if state["file"] is None and cut_after:
                    name = f"data-{len(builder.shards):06d}.tar"
                    try:
                        os.link(store.shard_path(s), out.tmp / name)
                    except OSError:
                        shutil.copyfile(store.shard_path(s), out.tmp / name)
                    for row, (offsets, _a, _b, _size) in enumerate(spans):
                        builder.add_sample(bytes(keys[first + row]).decode(), offsets)
                    builder.end_shard(name, shard["bytes"], shard["sha256"])
                    result.kept_shards += 1
                    bar.update(shard["count"])
                    continue
                with open(store.shard_path(s), "rb") as src:  # copy the members, cutting as one process
                    for row, (offsets, a, b, size) in enumerate(spans):
                        if full(size):
                            close_out()
                        if state["file"] is None:
                            state["name"] = f"data-{len(builder.shards):06d}.tar"
                            state["file"], state["samples"] = HashingFile(out.tmp / state["name"]), 0
                        f = state["file"]
                        shift = f.pos - a
                        src.seek(a)
                        f.write(src.read(b - a))
                        builder.add_sample(
                            bytes(keys[first + row]).decode(), {k: (o + shift, n) for k, (o, n) in offsets.items()}
                        )
                        state["samples"] += 1
                        bar.update(1)
        if state["file"] is not None:
            close_out()
        bar.close()
        builder.finish(meta, merged_from=[str(s.path) for s in stores])
        out.commit()
    except BaseException:
        if state["file"] is not None:
            try:
                state["file"]._f.close()
            except OSError:
                pass
        out.abort()
        raise


def merge_parts(
    sources: Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
    keep_parts: bool = True,
    rehash: bool = False,
) -> MergeResult:
    """Merge the parts of one conversion (a parts directory, or the part datasets) into ``dst``:
    checked complete and from one conversion, cut exactly as one process cuts, skip reports
    joined into ``DST.skipped.tsv``. With ``keep_parts=False`` the parts directory is removed
    afterwards."""
    records = find_parts(sources)
    if records is None:
        raise PartError(f"{', '.join(map(str, sources))}: no part manifest found")
    records = check_parts(records)
    if rehash:
        for r in records:
            check_part_files(r, rehash=True)
    first = records[0]
    datasets = [part_dataset_of(r) for r in records]
    total = sum(r["count"] for r in records)
    skipped = sum(r["skipped"] for r in records)
    from .remote import is_url

    report = (
        Path.cwd() / (str(dst).rstrip("/").rsplit("/", 1)[-1] + ".skipped.tsv")
        if is_url(str(dst))
        else Path(str(Path(dst).absolute()) + ".skipped.tsv")
    )  # a URL's report stays local
    if total == 0:
        raise PartError(
            f"no sample could be converted: all {skipped} were skipped (reasons in the parts' "
            f"reports in {Path(first['__path__']).parent}); nothing written"
        )
    result = _merge_stores(
        datasets,
        dst,
        format=first["dataset_format"],
        overwrite=overwrite,
        progress=progress,
        shard_size=first["shard_size"],
        shard_bytes=first["shard_bytes"],
    )
    result.parts, result.skipped = len(records), skipped
    reports = [Path(r["__path__"]).parent / r["skipped_report"] for r in records if r.get("skipped_report")]
    if report.exists():
        report.unlink()
    if reports:
        with open(report, "w") as out:
            out.write("key\tfile\treason\n")
            for rp in reports:
                with open(rp) as f:
                    next(f, None)
                    shutil.copyfileobj(f, out)
        result.report = str(report)
    if not keep_parts:
        dirs = {Path(r["__path__"]).parent for r in records}
        for d in dirs:
            if d.name.endswith(".parts"):
                shutil.rmtree(d, ignore_errors=True)
    return result
