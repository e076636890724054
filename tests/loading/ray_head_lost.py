"""A rank reading with backend="ray" on a cluster of its own whose head (with every process on
it) is then killed (tests/loading/test_on_ray.py): ARGV path. Prints, as JSON, what the next
batch raised and how long after the kill. Ray itself ends a process whose cluster has been
gone for 60 s, saying only that; the loader must have said why before that."""

import json
import os
import sys
import time

import ray
from ray.cluster_utils import Cluster

import mmloader


def slow(text):  # builds under way when the head goes
    time.sleep(0.2)
    return text


def main(path: str) -> None:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    ray.init(address=c.address, log_to_driver=False)
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path, transform=slow))
    stream = mmloader.Stream(ds, batch_size=4, seed=5)
    loader = mmloader.loader(stream, backend="ray", actors=1, job="head-lost", timeout_s=30, in_flight=4)
    it = iter(loader)
    next(it)
    c.head_node.kill_all_processes(check_alive=False, allow_graceful=False)  # (remove_node refuses the driver's own)
    start = time.monotonic()
    try:
        for _ in it:  # (batches already built before the kill may still come)
            pass
        error = None
    except Exception as e:  # noqa: BLE001 - reported whatever it is
        error = f"{type(e).__name__}: {e}"
    print(json.dumps({"error": error, "after_s": time.monotonic() - start}), flush=True)
    os._exit(0)  # (Ray's own exit would wait on the head that is gone)


if __name__ == "__main__":
    main(*sys.argv[1:])
