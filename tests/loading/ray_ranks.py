"""One training rank under torchrun, reading with backend="ray" (tests/loading/test_on_ray.py):
two epochs, then a mid-epoch state; its keys go to OUT/rank<R>.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

import mmloader


def main(path: str, out: str) -> None:
    dist.init_process_group("gloo")  # as a training script does
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    stream = mmloader.Stream(ds, batch_size=4, seed=5)
    # RAY_ADDRESS names the cluster, torchrun's run id the job; two builders (the module's own
    # pool holds the other two CPUs of the decode nodes)
    loader = mmloader.loader(stream, backend="ray", actors=2, in_flight=3)
    rank, world = stream.where()
    epochs = [[list(b["__key__"]) for b in loader] for _epoch in range(2)]
    it = iter(loader)
    first = [list(next(it)["__key__"]) for _ in range(2)]
    state = loader.state_dict()
    del it
    builders, job = loader.stats()["builders"], loader.job
    result = {"rank": rank, "world": world, "epochs": epochs, "first": first, "state": state, "builders": builders}
    result["job"] = job
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
