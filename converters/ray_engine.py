"""``--engine ray --parts N``: the N parts of a conversion as Ray tasks, then merged.

Each task runs exactly what ``mmloader convert LAYOUT SRC DST --part I/N`` runs (same code, same
checks, same part manifest), on whichever node Ray places it; Ray re-runs a task whose worker
process died (``--retries``), and the re-run removes the dead attempt's partial (same host) or
leaves it aside (another host) and writes the part again. Parts already finished (their
manifest is there) are not converted again, so re-running an interrupted conversion converts
only what is missing. When every part is done, this process merges them into DST (see
:mod:`mmloader.storage.write.merge` for the shard rule that makes the result byte-identical to one
process) and removes ``DST.parts/`` (``--keep-parts`` keeps it).

The cluster: ``--ray-address``, else ``RAY_ADDRESS``, else a cluster started on this machine with
``ray start --head``, else a new local Ray with this machine's CPUs. Every node needs mmloader
(the same version) installed, the source readable at the same path and DST on storage every node
and this process share.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import socket
import sys
import time

from tqdm import tqdm

from .items import ConversionError, UsageError
from .parts import convert_part
from .sources import check_paths
from .writing import Summary


def part_task(layout: str, args: argparse.Namespace, i: int, n: int) -> dict:
    """One part, in a Ray worker: ``--part I/N`` of the same conversion. Returns a plain dict
    (the summary, or the one-line error and its exit status) so nothing but builtins crosses."""
    import lmdb

    from mmloader.errors import MMLoaderError

    args = copy.copy(args)
    args.part, args.engine, args.quiet, args.parts, args.ray_address = f"{i}/{n}", "local", True, None, None
    module = importlib.import_module(f".{layout}", __package__)
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        s = convert_part(layout, args, module.prepare)
    except UsageError as e:
        return {"part": i, "status": 2, "error": str(e), "where": where}
    except (ConversionError, MMLoaderError, OSError, lmdb.Error) as e:
        return {"part": i, "status": 1, "error": str(e), "where": where}
    return {
        "part": i,
        "status": 0,
        "written": s.written,
        "skipped": sum(s.skipped.values()),
        "bytes": s.bytes,
        "seconds": s.seconds,
        "already": s.already,
        "notes": s.notes,
        "where": where,
    }


def _connect(address: str | None):
    """Ray, and whether this call connected it (then the conversion shuts it down): the cluster a
    caller (a notebook, a test) already joined, else ``address``, within a deadline."""
    import logging

    from mmloader.cluster.ray_cluster import connect, import_ray
    from mmloader.errors import MMLoaderError

    try:
        ray = import_ray()
    except ImportError:
        raise ConversionError("--engine ray needs Ray: pip install 'mmloader[ray]'") from None
    already = ray.is_initialized()  # (then an address naming another cluster is refused)
    try:
        connect(
            address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=True,
        )
    except MMLoaderError as e:  # (ClusterUnreachable, or an address naming another cluster)
        raise ConversionError(str(e)) from None
    return ray, not already


def convert_on_ray(layout: str, args: argparse.Namespace) -> Summary:
    """``--engine ray``: the parts as Ray tasks on the cluster, then merged."""
    # The tasks run elsewhere (another node, another working directory): absolute paths.
    args.src = [os.path.abspath(s) for s in args.src] if isinstance(args.src, list) else os.path.abspath(args.src)
    args.dst = os.path.abspath(args.dst)
    check_paths(args.src, args.dst, args.overwrite, part=True)
    ray, started = _connect(args.ray_address)
    try:
        return _run(ray, layout, args)
    finally:
        if started:
            ray.shutdown()


def _run(ray, layout: str, args: argparse.Namespace) -> Summary:
    from mmloader.storage.write.merge import manifests_in, merge_parts, parts_dir_for

    start = time.perf_counter()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Resuming without --parts: the N of the parts already there, not one from today's cluster size
    # (parts of another N would be parts of another conversion).
    earlier = {r.get("parts") for r in manifests_in(parts_dir_for(args.dst))}
    n = args.parts or (earlier.pop() if len(earlier) == 1 else max(1, cpus // args.workers))
    task = ray.remote(part_task).options(
        num_cpus=min(args.workers, cpus), max_retries=args.retries, retry_exceptions=False
    )
    pending = {task.remote(layout, args, i, n): i for i in range(n)}
    bar = tqdm(total=n, desc=f"converting {n} parts on Ray ({cpus} CPUs)", unit="part", disable=args.quiet)
    done: list[dict] = []
    written = 0
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            i = pending.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:  # the task failed past its retries
                raise ConversionError(
                    f"part {i}/{n} failed on Ray after {args.retries} retries: {str(e).strip().splitlines()[-1]}"
                ) from None
            if result["status"] == 2:
                raise UsageError(f"part {i}/{n}: {result['error']}")
            if result["status"]:
                raise ConversionError(f"part {i}/{n} ({result['where']}): {result['error']}")
            done.append(result)
            written += result["written"]
            bar.update(1)
            bar.set_postfix_str(f"{written / max(time.perf_counter() - start, 1e-9):.0f} samples/s")
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=False)
        bar.close()
        raise
    bar.close()
    converted = time.perf_counter() - start
    result = merge_parts(
        [parts_dir_for(args.dst)],
        args.dst,
        overwrite=args.overwrite,
        progress=not args.quiet,
        keep_parts=args.keep_parts,
    )
    already = sum(1 for r in done if r["already"])
    notes = [
        f"{n} parts on Ray: {n - already} converted in {converted:.1f} s"
        + (f", {already} converted before (not again)" if already else "")
        + f"; merged: {result.kept_shards} shards kept as the parts wrote them, {result.written_shards} rewritten"
    ]
    for r in done:
        notes += [f"part {r['part']}: {x}" for x in r["notes"] if "mmloader merge" not in x]
    summary = Summary(
        written=result.count,
        bytes=sum(r["bytes"] for r in done),
        report=result.report,
        notes=notes,
        seconds=time.perf_counter() - start,
    )
    if result.skipped:
        summary.skipped = {"see the report": result.skipped}
    return summary


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as `mmloader convert LAYOUT SRC DST --engine ray --parts N`")
