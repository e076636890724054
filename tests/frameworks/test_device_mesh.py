"""A 2x2 DeviceMesh (data parallel x tensor parallel, gloo, 4 processes): tensor-parallel peers get
the same batches, data-parallel ranks split the data."""

from __future__ import annotations

import json

from runs import (
    PER_RANK,
    assert_each_epoch_exactly_once,
    data,  # noqa: F401 (a fixture)
    per_epoch,
    run_script,
    seen,
)


def test_device_mesh_tp_peers_get_the_same_batches_dp_ranks_split_the_data(data, tmp_path):
    run_script("mesh_loop.py", str(data), str(tmp_path), nproc=4)
    info = [json.loads((tmp_path / f"info-rank{r}.json").read_text()) for r in range(4)]
    assert all("2-D mesh" in i["two_d_error"] for i in info)
    rows = seen(tmp_path, ranks=4)
    for backend in ("thread", "process"):
        by_rank = [[row for row in r if row["backend"] == backend] for r in rows]
        by_dp: dict[int, list] = {}
        for i, r in zip(info, by_rank):
            by_dp.setdefault(i["dp"], []).append([(row["epoch"], row["keys"]) for row in r])
        for dp, peers in by_dp.items():
            assert len(peers) == 2 and peers[0] == peers[1], (backend, dp)  # tp peers: identical
        one_per_dp = [by_rank[next(r for r, i in enumerate(info) if i["dp"] == dp and i["tp"] == 0)] for dp in (0, 1)]
        assert_each_epoch_exactly_once(per_epoch(one_per_dp), [0, 1])
        assert one_per_dp[0][0]["keys"] != one_per_dp[0][PER_RANK]["keys"]
