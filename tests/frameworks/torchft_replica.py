"""One rank of a torchft replica group training a small model on an mmloader QuorumLoader (or,
with ``--sampler``, on torchft's own DistributedSampler), logging each step's keys and commit.

Run by torchft_scenario.py; a JSON line per event goes to ``--log``: ``deal`` (the step, the
quorum's size, this group's place in it, the valid keys of this rank's batch) before the step's
forward pass, ``commit`` (the step and should_commit's answer) after it. ``--die STEP:PHASE``
SIGKILLs this process at that step, before its forward pass (``forward``) or just before
should_commit (``commit``: its gradients are already in the step's allreduce).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from datetime import timedelta

import torch
from torchft import Manager, ProcessGroupGloo
from torchft.optim import OptimizerWrapper

import mmloader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--group", type=int, required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--group-world", type=int, default=1)
    ap.add_argument("--store-port", type=int, required=True)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--die", default="")
    ap.add_argument("--sampler", action="store_true", help="torchft.data.DistributedSampler instead")
    ap.add_argument("--groups", type=int, default=3, help="the sampler's num_replica_groups")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds of 'work' per step")
    ap.add_argument("--hold", action="append", default=[], help="STEP:FILE: wait at STEP until FILE exists")
    ap.add_argument("--stop-at", type=int, default=None, help="checkpoint when STEP is reached, and exit")
    ap.add_argument("--checkpoint", default="", help="where --stop-at writes, and a restarted job reads")
    args = ap.parse_args()
    die_step, _, die_phase = args.die.partition(":")
    log = open(args.log, "a", buffering=1)

    def say(**record) -> None:
        log.write(json.dumps({"group": args.group, "rank": args.rank, "pid": os.getpid(), **record}) + "\n")
        log.flush()
        os.fsync(log.fileno())

    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group{args.group}",
        store_addr="127.0.0.1",
        store_port=args.store_port,
        rank=args.rank,
        world_size=args.group_world,
        lighthouse_addr=args.lighthouse,
        hostname="127.0.0.1",
        init_sync=False,  # the model is seeded alike in every group: step 0 trains every group's batch
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
    )
    optimizer = OptimizerWrapper(manager, inner)
    reader = mmloader.zip(label=mmloader.LabelReader(args.data, "cls"))
    stream = mmloader.Stream(reader, batch_size=args.batch, seed=3)
    if args.sampler:
        from torchft.data import DistributedSampler

        all_keys = [reader.key(i) for i in range(len(reader))]
        sampler = DistributedSampler(
            range(len(all_keys)), replica_rank=args.group, num_replica_groups=args.groups,
            group_rank=args.rank, num_replicas=args.group_world, shuffle=True, seed=3,
        )  # fmt: skip
        loader = torch.utils.data.DataLoader(range(len(all_keys)), batch_size=args.batch, sampler=sampler)
        batches = (
            ([all_keys[int(i)] for i in b], torch.tensor([float(i) for i in b]), torch.ones(len(b), dtype=torch.bool))
            for b in loader
        )
    else:
        # --8<-- [start:loader]
        from mmloader.frameworks.torchft import QuorumLoader

        quorum = QuorumLoader(stream, manager, group_rank=args.rank, group_world_size=args.group_world)
        # --8<-- [end:loader]

        def ours():
            for batch in quorum:  # (__valid__: the rows that count)
                keys = [k for k, v in zip(batch["__key__"], batch["__valid__"].tolist()) if v]
                yield keys, batch["label"].float(), batch["__valid__"]

        batches = ours()
    if args.checkpoint and os.path.exists(args.checkpoint) and args.stop_at is None:  # the whole job restarted
        saved = json.loads(open(args.checkpoint).read())
        manager.load_state_dict(saved["manager"])  # the step count goes on
        if not args.sampler:
            quorum.load_state_dict(saved["loader"])
    say(event="ready")
    holds = {int(h.split(":", 1)[0]): h.split(":", 1)[1] for h in args.hold}
    first = True
    while True:
        if not args.sampler and quorum.epoch >= 1:  # one epoch (in every group the same answer)
            break
        at = 0 if first else manager.current_step()  # 0: before this process's first step
        first = False
        if at in holds:  # all start together; a group started again joins while steps are left
            import time

            flag, deadline = holds.pop(at), time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)
        # --8<-- [start:step]
        optimizer.zero_grad()  # starts the step's quorum (torchft's OptimizerWrapper)
        got = next(batches, None)  # then this quorum's share of the step
        # --8<-- [end:step]
        if got is None:  # (the sampler's shard ended)
            break
        keys, labels, valid = got
        step = manager.current_step()
        say(
            event="deal", step=step, participants=manager.num_participants(),
            participant=manager.participating_rank(), keys=keys,
        )  # fmt: skip
        if die_step and int(die_step) == step and die_phase == "forward":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.delay:
            import time

            time.sleep(args.delay)
        # --8<-- [start:loss]
        per_row = ((model(labels[:, None]) - 1.0) ** 2).squeeze(1)
        loss = (per_row * valid).sum() / valid.sum().clamp(min=1)  # the rows that count (__valid__)
        loss.backward()
        # --8<-- [end:loss]
        for p in model.parameters():  # averaged over the quorum (an error: the step does not commit)
            manager.allreduce(p.grad).wait()
        if die_step and int(die_step) == step and die_phase == "commit":
            os.kill(os.getpid(), signal.SIGKILL)
        committed = optimizer.step()
        committed = manager.current_step() > step if committed is None else bool(committed)
        say(event="commit", step=step, committed=committed)
        if args.stop_at is not None and manager.current_step() >= args.stop_at:  # a checkpoint of the whole job
            if args.group == 0 and args.rank == 0:
                state = {"manager": manager.state_dict(), "loader": None if args.sampler else quorum.state_dict()}
                with open(args.checkpoint + ".part", "w") as f:
                    json.dump(state, f)
                os.replace(args.checkpoint + ".part", args.checkpoint)
            say(event="stopped", step=manager.current_step())
            manager.shutdown(wait=False)
            sys.exit(0)
    ledger = []
    if not args.sampler:  # the loader's ledger of the epoch that ended: every slot of each committed step
        epoch = 0
        for step, _base, size in quorum.committed_steps(epoch):
            slots = {
                f"{p},{g}": quorum.keys_at(step, p, g, epoch=epoch)
                for p in range(size)
                for g in range(args.group_world)
            }
            ledger.append([step, slots])
        quorum.close()
    say(event="done", step=manager.current_step(), ledger=ledger)
    manager.shutdown(wait=False)
    sys.exit(0)


if __name__ == "__main__":
    main()
