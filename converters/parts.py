"""Conversions in parts: what a part holds (--part I/N), the fingerprints that say what it was
made from, converting one part into ``DST.parts/``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mmloader.storage import format_for
from mmloader.storage.write.atomic import clean_stale_partials

from .items import ConversionError, Item
from .options import RUN_OPTIONS, options_from, parse_part
from .provenance import describe_input
from .reading import _load_safe, ordered_map
from .sources import check_paths
from .writing import Summary, check_required_fields, write_samples


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
        found = {"samples": len(items), "files": sum(len(it.files) for it in items)}
        metadata = describe_input(metadata, args, items_digest(items, args.src), found)

        def convert(part: tuple[int, int] | None, dst: str) -> Summary:
            chosen = select(items, args.shuffle_seed, part, align=shard_alignment(args))
            opts = options_from(args)
            loaded = ordered_map(_load_safe, ((it, opts) for it in chosen), args.workers)
            return write_samples(loaded, dst, args, metadata, total=len(chosen), notes=notes)

        return items_digest(items, args.src, stamps=True), convert  # (what parts are matched by)

    return prepare


def items_digest(items: Sequence[Item], root: str, stamps: bool = False) -> str:
    """A digest of the input listing: keys, files (relative to ``root``), inline values: the
    same for the same listing on any machine, from any folder (the one a dataset records).
    ``stamps``: each file's size and modification time too, what the parts of one conversion
    are matched by: another folder with the same names, or a file edited between two part runs,
    is another input (a copy that keeps modification times, ``cp -a`` or ``rsync -t``, is not)."""
    import hashlib

    h = hashlib.sha256()
    root = os.path.abspath(root)
    for it in items:
        files = sorted(
            (f, os.path.relpath(os.path.abspath(p), root), *([_stamp(p)] if stamps else []))
            for f, p in it.files.items()
        )
        h.update(
            json.dumps([it.key, files, it.values, it.error], sort_keys=True, default=str, ensure_ascii=False).encode(
                "utf-8", "surrogateescape"
            )
            + b"\n"
        )
    return h.hexdigest()


def _stamp(path: str) -> list[int] | str:
    """A file's size and modification time (ns), or why there is none."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    return [st.st_size, st.st_mtime_ns]


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


def convert_part(layout: str, args: argparse.Namespace, prepare: Callable) -> Summary:
    """``--part I/N``: convert one part into ``DST.parts/`` and publish its manifest last; a part
    whose manifest is there (same input, options, N) is not converted again."""
    from mmloader.storage.write.merge import (
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

    from mmloader.storage.write.merge import part_dataset_of

    path = Path(record["__path__"])
    report = record.get("skipped_report")
    path.unlink(missing_ok=True)  # the manifest first: without it the rest is an unfinished part
    shutil.rmtree(part_dataset_of(record), ignore_errors=True)
    if report:
        (path.parent / report).unlink(missing_ok=True)
