"""Parts of a conversion (``convert --part I/N``, ``--engine ray --parts N``): their names, the
part manifest each publishes last (its files' sizes and sha256, the input fingerprint), and the
checks that find, order and refuse parts (missing, duplicated, foreign, changed, unfinished).
:mod:`.merge` joins them.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import Sequence

from ..._version import __version__
from ...errors import FormatError
from ..tar.index import MANIFEST
from ..tar.layout import sha256_file
from ..tar.writer import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE

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
    from ..remote import scheme_of

    name = url.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    tool = {"s3": "aws s3 cp --recursive", "gs": "gcloud storage cp -r", "az": "azcopy copy --recursive"}
    cmd = tool.get(scheme_of(url))
    return f"`{cmd} {url.rstrip('/')}/ {name}/`" if cmd else f"with your storage's copy tool, into {name}/"


def check_remote_sources(sources: Sequence[str | os.PathLike]) -> None:
    """Refuse, before anything is read, the URL sources merge cannot read: tar shards (read from
    local folders) and parts (written to a filesystem every task reaches). LMDB datasets on object
    storage are read through their cached copy."""
    from .. import format_for
    from ..remote import is_url
    from ..remote.redaction import redact_url

    for src in sources:
        if not is_url(src):
            continue
        url = redact_url(str(src))  # named in messages: no credentials
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
    from ..remote import is_url

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
