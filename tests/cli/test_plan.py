"""``mmloader plan`` (mmloader/cli/plan.py): the data ledger's --step and --find print what the
loader of the config's stream delivers."""

from __future__ import annotations

import pytest
import yaml

import mmloader
from mmloader.cli import main as cli


def _mix_config(root, weights: dict[str, float], size: int, seed: int, key=lambda name, i: f"{name}{i:03d}"):
    """A config mixing text stores named after ``weights`` (``size`` samples each, keys from ``key``)."""
    for name in weights:
        with mmloader.LMDBWriter(root / f"{name}.lmdb") as w:
            for i in range(size):
                w.write({"__key__": key(name, i), "txt": f"{name} {i}"})
    cfg = {
        "seed": seed,
        "batch_size": 4,
        "mix": {"mode": "proportion", "epoch_size": 40},
        "sources": {
            name: {"path": str(root / f"{name}.lmdb"), "weight": w, "modalities": {"t": {"field": "txt"}}}
            for name, w in weights.items()
        },
    }
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    return _mix_config(tmp_path_factory.mktemp("plan"), {"a": 0.75, "b": 0.25}, size=30, seed=5)


def _delivered(path, rank, world, epoch):
    stream = mmloader.from_config(path)
    stream.set_world(rank, world)
    loader = mmloader.loader(stream, num_workers=1, backend="thread")
    loader.set_epoch(epoch)
    return [(list(b["__key__"]), list(b["__source__"])) for b in loader]


def test_step_prints_each_ranks_keys_and_sources_as_delivered(config_path, capsys):
    assert cli(["plan", str(config_path), "--world", "2", "--step", "3", "--epoch", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "epoch 1, step 3:"
    for rank in range(2):
        keys, sources = _delivered(config_path, rank, 2, 1)[3]
        line = next(line for line in out if line.startswith(f"  rank {rank}: "))
        assert line.split(": ", 1)[1].split("  (")[0].split() == keys
        counts = ", ".join(f"{n}: {sources.count(n)}" for n in dict.fromkeys(sources))
        assert line.endswith(f"({counts})")
    assert cli(["plan", str(config_path), "--world", "2", "--step", "3", "--rank", "1"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if "rank" in line][0].startswith("  rank 1: ")


def test_find_prints_the_steps_that_hold_a_key(config_path, capsys):
    steps = {}
    for rank in range(3):
        for step, (keys, _sources) in enumerate(_delivered(config_path, rank, 3, 0)):
            for key in keys:
                steps.setdefault(key, set()).add((rank, step))
    key = sorted(k for k in steps if k.startswith("b"))[0]  # a sample of the smaller source
    assert cli(["plan", str(config_path), "--world", "3", "--find", key]) == 0
    printed = capsys.readouterr().out.strip()
    want = "; ".join(
        f"rank {r} at step {', '.join(str(s) for q, s in sorted(steps[key]) if q == r)}"
        for r in sorted({r for r, _s in steps[key]})
    )
    assert printed == f"{key}, epoch 0 on 3 rank(s): {want}"
    assert cli(["plan", str(config_path), "--world", "3", "--find", "zzz"]) == 0
    assert capsys.readouterr().out.strip() == "zzz: no source of this stream holds it"


def test_find_says_per_source_where_a_key_two_sources_hold_comes(tmp_path, capsys):
    """Two sources with keys alike (two crawls of one site): each source's batches, said apart."""
    path = _mix_config(tmp_path, {"x": 0.5, "y": 0.5}, size=20, seed=1, key=lambda _name, i: f"k{i:03d}")
    steps: dict = {}
    for rank in range(2):
        for step, (keys, sources) in enumerate(_delivered(path, rank, 2, 0)):
            for key, source in zip(keys, sources):
                steps.setdefault((key, source), set()).add((rank, step))
    assert cli(["plan", str(path), "--world", "2", "--find", "k007"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 2
    for line, source in zip(printed, ("x", "y")):
        at = sorted(steps.get(("k007", source), ()))
        want = "; ".join(
            f"rank {r} at step {', '.join(str(s) for q, s in at if q == r)}" for r in sorted({r for r, _s in at})
        )
        assert line == f"k007 (source {source!r}), epoch 0 on 2 rank(s): {want or 'not in this epoch'}"
    with pytest.raises(ValueError, match=r"no source 'z' in this stream: its sources are \['x', 'y'\]"):
        mmloader.from_config(path).steps_of("k007", source="z")


def test_quality_prints_the_measures_and_the_verdict_of_the_stream(config_path, capsys):
    assert cli(["plan", str(config_path), "--quality", "--window", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    q = mmloader.from_config(config_path).quality(window_batches=4)
    assert out[0] == "plan quality (4 batches = 16 samples a window):"
    assert f"max {100 * q.drift_max:.1f} points, p99 {100 * q.drift_p99:.1f}" in out[1]
    assert f"{q.spread:.2f} of uniform" in out[2] and f"{q.runs:.2f}x" in out[3]
    assert out[4] == f"  {q.verdict()}"
