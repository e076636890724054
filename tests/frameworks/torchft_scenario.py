"""A torchft job on this machine: a Lighthouse on 127.0.0.1 and replica groups of torchft_replica.py,
some of them SIGKILLed at a step and started again later, as a scenario says.

Run inside a network namespace of its own holding only loopback (torchft's managers bind every
interface, and have no option not to; there, every interface is loopback):
``unshare -n sh -c 'ip link set lo up && exec python torchft_scenario.py SPEC.json'``. SPEC:
``data`` (a dataset with ``cls``), ``log`` (the JSON-lines log every rank appends to),
``groups``, ``group_world``, ``batch``, ``sampler`` (bool), ``events``: ``[{"group": 1, "die":
"5:forward", "restart_after": 3}]`` (``restart_after``: committed steps of the others before
the group starts again; null: it stays down), ``deadline_s``. Exit status 0 when every rank
that was not killed ended its epoch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torchft.coordination import LighthouseServer

HERE = Path(__file__).parent


def committed_steps(log: Path) -> int:
    """The highest step any rank committed, from the log so far."""
    best = 0
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:  # a line being written
                continue
            if r.get("event") == "commit" and r.get("committed"):
                best = max(best, r["step"] + 1)
    return best


def ready_pids(log: Path) -> set[int]:
    found = set()
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("event") == "ready":
            found.add(r["pid"])
    return found


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    log = Path(spec["log"])
    # a majority: two quorums of disjoint groups cannot both go on (torchft's split brain)
    majority = spec.get("min_replicas", spec["groups"] // 2 + 1)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=majority, join_timeout_ms=1000)
    stores = [dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) for _ in range(spec["groups"])]
    events = {e["group"]: e for e in spec.get("events", [])}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}

    flags = {g: log.parent / f"ready-{g}" for g in events}
    start_flag = log.parent / "start"
    holds = {  # all wait at step 0 until all are ready (one first quorum, not one per group as each
        # comes up), and at the step a group is started again until it is ready
        g: [f"0:{start_flag}"]
        + [
            f"{int(e['die'].split(':')[0]) + e['restart_after']}:{flags[o]}"
            for o, e in events.items()
            if o != g and e.get("restart_after") is not None
        ]
        for g in range(spec["groups"])
    }

    def start(group: int, die: str = "") -> list[subprocess.Popen]:
        procs = []
        for rank in range(spec["group_world"]):
            cmd = [
                sys.executable, str(HERE / "torchft_replica.py"), "--data", spec["data"], "--group", str(group),
                "--rank", str(rank), "--group-world", str(spec["group_world"]), "--store-port",
                str(stores[group].port), "--lighthouse", lighthouse.address(), "--log", str(log),
                "--batch", str(spec["batch"]), "--groups", str(spec["groups"]), "--delay", str(spec.get("delay", 0)),
            ]  # fmt: skip
            if die:
                cmd += ["--die", die]
            for hold in holds[group]:
                cmd += ["--hold", hold]
            if spec.get("sampler"):
                cmd.append("--sampler")
            if spec.get("stop_at") is not None:
                cmd += ["--checkpoint", str(log.parent / "checkpoint.json")]
                if not (log.parent / "checkpoint.json").exists():
                    cmd += ["--stop-at", str(spec["stop_at"])]
            # each rank's own stderr apart from torchft's interleaved logs: a failing rank's traceback is said
            err = log.parent / f"rank-{group}-{rank}-{len(list(log.parent.glob(f'rank-{group}-{rank}-*.err')))}.err"
            with err.open("w") as stderr:  # (the rank holds its own copy of the file)
                proc = subprocess.Popen(cmd, env=env, stderr=stderr)
            proc.err_path = err  # type: ignore[attr-defined]
            procs.append(proc)
        return procs

    running = {g: start(g, events.get(g, {}).get("die", "")) for g in range(spec["groups"])}
    first = {p.pid for procs in running.values() for p in procs}
    restarted: set[int] = set()
    restarted_job = False
    deadline = time.monotonic() + spec.get("deadline_s", 150)
    status = 0
    try:
        while time.monotonic() < deadline:
            for g, event in events.items():
                died = all(p.poll() == -9 for p in running[g])
                after = event.get("restart_after")
                if died and after is not None and g not in restarted:
                    if committed_steps(log) >= int(event["die"].split(":")[0]) + after:
                        for p in running[g]:
                            p.wait()
                        # a store of its own, as a replaced group gets: the old one names the dead manager
                        stores[g] = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
                        running[g] = start(g)
                        restarted.add(g)
            if not start_flag.exists() and first <= ready_pids(log):
                start_flag.touch()
            for g in restarted:  # started again and ready: the others go on
                pids = {p.pid for p in running[g]}
                if not flags[g].exists() and len(ready_pids(log) & pids) == len(pids):
                    flags[g].touch()
            alive = [p for procs in running.values() for p in procs if p.poll() is None]
            if not alive and spec.get("stop_at") is not None and not restarted_job:
                # the whole job stopped at its checkpoint: start it again, every group, from there
                restarted_job = True
                for procs in running.values():
                    for p in procs:
                        p.wait()
                stores[:] = [dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) for _ in stores]
                start_flag.unlink()
                running = {g: start(g) for g in range(spec["groups"])}
                first = {p.pid for procs in running.values() for p in procs}
                continue
            if not alive:
                break
            time.sleep(0.1)
        else:
            print("torchft_scenario: the deadline passed with ranks still running", file=sys.stderr)
            status = 1
        for procs in running.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                if p.returncode not in (0, -9):
                    said = p.err_path.read_text()[-3000:]
                    print(f"torchft_scenario: a rank exited with {p.returncode}:\n{said}", file=sys.stderr)
                    status = 1
    finally:
        lighthouse.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
