"""What QuorumLoader adds to a torchft training step (mmloader.frameworks.torchft).

Per step it asks the manager the quorum (``num_participants()``, ``participating_rank()``,
``current_step()``, all answered once the quorum formed), settles the step before (committed or
not) and deals this step's positions (``mmloader.planning.quorum.deal`` and the plan's lookup).
This measures that bookkeeping against a real torchft Manager (one replica group, a Lighthouse on
127.0.0.1), apart from building the batch, which any loader does:

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/quorum_step.py'

(``unshare -n``: torchft's manager binds every interface; in a namespace of its own that is
loopback only. Without it the benchmark runs the same, listening on the machine's interfaces.)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torchft import Manager, ProcessGroupGloo
from torchft.coordination import LighthouseServer

import mmloader
from mmloader.frameworks.torchft import QuorumLoader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "labels.lmdb"
        with mmloader.writer_for(path) as w:
            for i in range(args.samples):
                w.write({"__key__": f"s{i:07d}", "cls": str(i % 10).encode()})
        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
            min_replica_size=1,
            load_state_dict=lambda s: None,
            state_dict=lambda: {},
            replica_id="bench",
            store_addr="127.0.0.1",
            store_port=store.port,
            rank=0,
            world_size=1,
            lighthouse_addr=lighthouse.address(),
            hostname="127.0.0.1",
        )
        stream = mmloader.Stream(mmloader.zip(label=mmloader.LabelReader(path, "cls")), batch_size=args.batch, seed=1)
        loader = QuorumLoader(stream, manager, group_rank=0, group_world_size=1, prefetch=False)
        built: list[float] = []
        build = loader._build

        def timed_build(spec):  # the batch's build, which is not the loader's bookkeeping
            t = time.perf_counter()
            out = build(spec)
            built.append(time.perf_counter() - t)
            return out

        loader._build = timed_build  # type: ignore[method-assign]
        batches = iter(loader)
        whole, asked = [], []
        for _ in range(args.steps):
            manager.start_quorum()
            manager.wait_quorum()  # the quorum's own round trip is torchft's, not the loader's
            t = time.perf_counter()
            manager.num_participants(), manager.participating_rank(), manager.current_step()
            asked.append(time.perf_counter() - t)
            t = time.perf_counter()
            next(batches)
            whole.append(time.perf_counter() - t)
            manager.should_commit()
        manager.shutdown(wait=False)
        lighthouse.shutdown()
    us = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    bookkeeping = [w - b for w, b in zip(whole, built)]
    print(f"{args.steps} steps, batch {args.batch}, {args.samples:,} samples, one replica group")
    print(f"  asking the quorum (3 manager calls): {us(asked):8.1f} us per step (median)")
    print(f"  QuorumLoader bookkeeping:            {us(bookkeeping):8.1f} us per step (median; settle, deal, lookup)")
    print(f"  building the batch (for scale):      {us(built):8.1f} us per step (median)")


if __name__ == "__main__":
    main()
