"""--engine ray on a real local Ray (2 CPUs, started and shut down here): the same shards as one
process, resumption, a worker killed mid-write, errors."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, jpeg_bytes, write_pairs_folder

import mmloader
from mmloader.cli import main as cli

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """A local Ray for this module: its address, for conversions run in other processes."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def run(*argv) -> int:
    try:
        return cli(["convert", *map(str, argv), "-q"])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


def _shas(path) -> list[str]:
    return [s["sha256"] for s in json.loads((Path(path) / "index.json").read_text())["shards"]]


def _read_all(path):
    ds = mmloader.open(path)
    return [ds[i] for i in range(len(ds))]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-inputs")
    raw = write_pairs_folder(root / "raw", 60, 40)
    (root / "tables").mkdir()
    for f in range(2):
        n = range(25 * f, 25 * f + 25)
        pq.write_table(
            pa.table(
                {
                    "image": [jpeg_bytes(i, size=(40, 24)) for i in n],
                    "text": [f"t{i}" for i in n],
                    "label": [i % 4 for i in n],
                }
            ),
            root / "tables" / f"{f}.parquet",
            row_group_size=6,
        )
    return {"pairs": raw, "parquet": root / "tables"}


CASES = {
    "pairs-tar": ("pairs", "", []),
    "parquet-tar": ("parquet", "", ["--image-column", "image", "--text-column", "text", "--label-column", "label"]),
    "parquet-lmdb": ("parquet", ".lmdb", ["--image-column", "image", "--text-column", "text"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ray_gives_the_shards_of_one_process(cluster, inputs, tmp_path, case):
    layout, suffix, opts = CASES[case]
    opts = [*opts, "--shard-size", "7", "--resize-max", "32"]
    assert run(layout, inputs[layout], tmp_path / f"one{suffix}", *opts, "--workers", "1") == 0
    assert run(layout, inputs[layout], tmp_path / f"ray{suffix}", *opts, "--engine", "ray", "--parts", "3") == 0
    assert _read_all(tmp_path / f"ray{suffix}") == _read_all(tmp_path / f"one{suffix}")  # same records
    if not suffix:
        assert _shas(tmp_path / "ray") == _shas(tmp_path / "one")  # same sha256 per shard
    assert not (tmp_path / f"ray{suffix}.parts").exists()


def test_ray_converts_only_the_parts_without_a_manifest(cluster, inputs, tmp_path, capsys):
    opts = ["--shard-size", "7"]
    assert run("pairs", inputs["pairs"], tmp_path / "one", *opts) == 0
    # an interrupted conversion: part 1 finished (its manifest published), the others never ran
    assert run("pairs", inputs["pairs"], tmp_path / "out", *opts, "--part", "1/3") == 0
    mtime = (tmp_path / "out.parts" / "part-00001-of-00003.json").stat().st_mtime_ns
    capsys.readouterr()
    assert (
        cli(
            [
                "convert",
                "pairs",
                str(inputs["pairs"]),
                str(tmp_path / "out"),
                *opts,
                "--engine",
                "ray",
                "--keep-parts",
                "-q",
            ]
        )
        == 0
    )  # no --parts: the N of the parts already there, not the 2 CPUs
    out = capsys.readouterr().out
    assert "3 parts on Ray: 2 converted" in out and "1 converted before (not again)" in out, out
    assert (tmp_path / "out.parts" / "part-00001-of-00003.json").stat().st_mtime_ns == mtime
    assert _shas(tmp_path / "out") == _shas(tmp_path / "one")


def test_ray_retries_a_part_whose_worker_was_killed_and_the_result_is_the_same(cluster, tmp_path):
    raw = write_pairs_folder(tmp_path / "raw", 1600, 128)
    opts = ["--shard-size", "100", "--check-decode", "-q"]
    assert run("pairs", raw, tmp_path / "one", *opts) == 0
    cmd = [
        sys.executable,
        "-m",
        "mmloader.converters.pairs",
        str(raw),
        str(tmp_path / "out"),
        *opts,
        "--engine",
        "ray",
        "--parts",
        "2",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "RAY_ADDRESS": cluster},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    parts = tmp_path / "out.parts"
    victim, deadline = None, time.time() + 120
    while victim is None and time.time() < deadline:  # a part's partial holding data: its writer is a Ray worker
        for p in parts.glob(".part-*.partial-*") if parts.is_dir() else []:
            try:
                if sum(f.stat().st_size for f in p.iterdir() if f.suffix == ".tar") > 300_000:
                    victim = p
                    break
            except FileNotFoundError:
                continue
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    assert victim is not None, "no part was seen writing"
    pid = int(victim.name.split(".partial-")[1].split("-")[0])
    os.kill(pid, signal.SIGSTOP)  # frozen inside its write window: no manifest, the partial holds data
    try:
        assert victim.is_dir() and not (parts / f"{victim.name[1:20]}.json").exists()
    finally:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"removed stale partial {victim}" in out  # the retry, on this host, cleaned the dead attempt
    assert _shas(tmp_path / "out") == _shas(tmp_path / "one")
    assert not parts.exists()


def test_ray_bad_input_is_one_line_naming_the_part_and_the_file(cluster, tmp_path, capsys):
    raw = write_pairs_folder(tmp_path / "raw", 20, 16)
    (raw / "00015.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    assert run("pairs", raw, tmp_path / "out", "--engine", "ray", "--parts", "2") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "part 1/2" in err and "00015.jpg: bad image" in err, err
    assert not (tmp_path / "out").exists()
    assert run("pairs", raw, tmp_path / "out", "--part", "0/2", "--engine", "ray") == 2  # --part is for one process
    assert run("pairs", raw, tmp_path / "skip", "--engine", "ray", "--parts", "2", "--on-error", "skip") == 0
    assert len(mmloader.open(tmp_path / "skip")) == 19
    assert "00015.jpg" in (tmp_path / "skip.skipped.tsv").read_text()
