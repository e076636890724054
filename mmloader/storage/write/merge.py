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

import os
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from ...errors import FormatError
from ..tar.index import ShardIndexBuilder
from ..tar.layout import HashingFile, end_of_archive, sample_bytes, should_cut
from ..tar.store import TarStore
from ..tar.writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE
from .atomic import AtomicDirectory
from .parts import (  # noqa: F401  (names of the parts' API, imported from here before)
    PART_FORMAT,
    PART_VERSION,
    PartError,
    check_part_files,
    check_parts,
    check_remote_sources,
    find_parts,
    manifests_in,
    part_dataset,
    part_dataset_of,
    part_manifest_path,
    part_name,
    parts_dir_for,
    read_part_manifest,
    same_conversion,
    write_part_manifest,
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
    from .. import open_store
    from ..remote import is_url

    check_remote_sources(parts)  # before anything is written or uploaded
    if is_url(str(dst)):  # merged locally, then uploaded, the manifest last
        import tempfile

        from ..remote import Location
        from ..remote.write import _tmp_root, check_destination, upload_existing

        fmt = format or ("lmdb" if str(dst).rstrip("/").lower().endswith(".lmdb") else None)
        for marker_fmt in ("tar", "lmdb"):
            check_destination(Location(str(dst)), marker_fmt, overwrite)
        with tempfile.TemporaryDirectory(prefix=".mmloader-merge-", dir=_tmp_root()) as tmp:
            local = os.path.join(tmp, "merged.lmdb" if fmt == "lmdb" else "merged")
            result = _merge_stores(
                parts, local, format=fmt, progress=progress, shard_size=shard_size, shard_bytes=shard_bytes
            )
            upload_existing(local, str(dst), overwrite=overwrite, progress=progress)
            result.path = Location(str(dst)).url  # type: ignore[assignment]  # as shown: no credentials
            return result
    stores = [open_store(p) for p in parts]
    if any(is_url(p) and s.format == "tar" for p, s in zip(parts, stores)):  # e.g. a .json manifest URL
        raise FormatError("merge reads tar shards from local folders: download them first")
    if not stores:
        raise FormatError("nothing to merge")
    from .. import format_for, writer_for

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
    from ..remote import is_url

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
