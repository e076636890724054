"""One rank of a job reading with backend="ray" (tests/loading/test_on_ray.py): ARGV path, job,
lease in seconds. After its first batch it prints "ready", then waits for a line on stdin:
"exit" ends it normally (leaving the job's lease), "read SECONDS" waits that long, reads the
rest of the epoch and one more, prints them as JSON and ends normally. Killed, it leaves nothing."""

import json
import sys
import time

import mmloader
from mmloader.loading.on_ray import lease


def main(path: str, job: str, lease_s: str) -> None:
    lease.LEASE_S = float(lease_s)  # (the job's first rank sets its lease)
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    stream = mmloader.Stream(ds, batch_size=4, seed=5)
    loader = mmloader.loader(stream, backend="ray", actors=1, job=job, timeout_s=120)
    it = iter(loader)
    keys = [list(next(it)["__key__"])]
    print("ready", flush=True)
    order = sys.stdin.readline().split()
    if order[0] == "read":
        time.sleep(float(order[1]))
        keys += [list(b["__key__"]) for b in it]
        keys += [list(b["__key__"]) for b in loader]
        print(json.dumps({"keys": keys, "joins": loader.pool().joins}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
