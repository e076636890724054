"""Experiment configs, weighted mixing through Stream, presence masks, `mmloader plan`."""
from __future__ import annotations

from collections import Counter

import pytest

import mmloader
from mmloader.cli import main as cli
from mmloader.errors import ConfigError

from conftest import jpeg_bytes


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg")
    with mmloader.LMDBWriter(root / "pairs.lmdb") as w:
        for i in range(300):
            w.write({"__key__": f"p{i:04d}", "jpg": jpeg_bytes(i % 5), "txt": f"pair {i}", "cls": i % 3})
    with mmloader.ShardWriter(root / "caps", shard_size=100) as w:
        for i in range(300):
            w.write({"__key__": f"p{i:04d}", "txt": f"caption {i}"})
    (root / "corpus.txt").write_text("".join(f"line {i}\n" for i in range(2000)))
    return root


def config(root, **over):
    cfg = {
        "seed": 1, "batch_size": 20,
        "mix": {"mode": "proportion", "epoch_size": 10_000},
        "sources": {
            "image_text": {"path": str(root / "pairs.lmdb"), "weight": 0.5,
                           "modalities": {"image": {"field": "jpg"},
                                          "caption": {"field": "txt", "path": str(root / "caps")}}},
            "text_only": {"path": str(root / "corpus.txt"), "weight": 0.3,
                          "modalities": {"caption": {"field": "txt"}}},
            "labels": {"path": str(root / "pairs.lmdb"), "weight": 0.2,
                       "modalities": {"label": {"field": "cls"}}},
        },
    }
    cfg.update(over)
    return cfg


def _sources(loader):
    out = []
    for batch in loader:
        out += batch["__source__"]
    return out


def test_realised_proportions_within_one_point(stores):
    stream = mmloader.from_config(config(stores))
    got = Counter(_sources(mmloader.loader(stream, num_workers=2)))
    total = sum(got.values())
    assert total == 10_000
    for name, w in [("image_text", 0.5), ("text_only", 0.3), ("labels", 0.2)]:
        assert abs(got[name] / total - w) <= 0.01


def test_mixed_stream_deterministic_and_differs_by_epoch(stores):
    def keys(epoch, workers):
        loader = mmloader.loader(mmloader.from_config(config(stores)), num_workers=workers)
        loader.set_epoch(epoch)
        return [k for b in loader for k in b["__key__"]]
    assert keys(0, 2) == keys(0, 0)  # same across runs and worker counts
    assert keys(0, 0) != keys(1, 0)


def test_presence_masks_when_batches_mix_modalities(stores):
    loader = mmloader.loader(mmloader.from_config(config(stores)), num_workers=0)
    batch = next(iter(loader))
    present = batch["__present__"]
    src = batch["__source__"]
    assert present["image"].tolist() == [s == "image_text" for s in src]
    assert present["label"].tolist() == [s == "labels" for s in src]
    assert batch["image"].shape[0] == 20 and batch["label"].shape == (20,)
    i = src.index("text_only")
    assert batch["image"][i].abs().sum() == 0 and batch["caption"][i].startswith("line ")


def test_source_composition_one_source_per_batch(stores):
    stream = mmloader.from_config(config(stores, batch_composition="source"))
    loader = mmloader.loader(stream, num_workers=2)
    per_batch = [set(b["__source__"]) for b in loader]
    assert all(len(s) == 1 for s in per_batch)
    counts = Counter(next(iter(s)) for s in per_batch)
    assert abs(counts["image_text"] / sum(counts.values()) - 0.5) <= 0.01


def test_repeat_mode_upsamples_a_small_source(stores):
    cfg = config(stores, mix={"mode": "repeat"})
    cfg["sources"]["image_text"]["weight"] = 3
    cfg["sources"]["text_only"]["weight"] = 0.5
    cfg["sources"]["labels"]["weight"] = 0
    stream = mmloader.from_config(cfg)
    assert [int(q) for q in stream.mix.quotas] == [900, 1000, 0]
    keys = Counter(k for b in mmloader.loader(stream, num_workers=0) for k, s in zip(b["__key__"], b["__source__"])
                   if s == "image_text")
    assert set(keys.values()) == {3} and len(keys) == 300


def test_resume_mid_epoch_in_mixed_stream(stores):
    full = [b["__key__"] for b in mmloader.loader(mmloader.from_config(config(stores)), num_workers=2)]
    loader = mmloader.loader(mmloader.from_config(config(stores)), num_workers=2)
    it = iter(loader)
    for _ in range(37):
        next(it)
    state = loader.state_dict()
    del it
    resumed = mmloader.loader(mmloader.from_config(config(stores)), num_workers=1)
    resumed.load_state_dict(state)
    assert [b["__key__"] for b in resumed] == full[37:]


def test_yaml_file_and_overrides(stores, tmp_path):
    import yaml
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config(stores)))
    stream = mmloader.from_config(path, batch_size=50, seed=9)
    assert stream.batch_size == 50 and stream.seed == 9 and len(stream) == 200


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c["sources"]["labels"].update(path="/no/such/store"), "sources.labels.path: /no/such/store does not exist"),
    (lambda c: c["sources"]["labels"]["modalities"].update(label={"field": "nope"}),
     "sources.labels.modalities.label.field: 'nope' is not a field"),
    (lambda c: c["sources"]["labels"].update(weight=-1), "sources.labels.weight: -1 is negative"),
    (lambda c: [s.update(weight=0) for s in c["sources"].values()], "all weights are zero"),
    (lambda c: c["sources"]["labels"].update(modalities=[{"name": "x", "field": "cls"}, {"name": "x", "field": "txt"}]),
     "sources.labels.modalities: duplicate modality name(s) ['x']"),
    (lambda c: c["sources"]["image_text"]["modalities"]["caption"].update(path=None) or
     c["sources"]["image_text"].update(modalities={"a": {"field": "txt"}, "b": {"field": "txt", "path": "CORPUS"}}),
     "sources.image_text: its modalities cannot be aligned"),
    (lambda c: c.update(bogus=1), "config: unknown key(s) ['bogus']"),
    (lambda c: c["sources"]["labels"]["modalities"]["label"].update(transform="no.such:thing"),
     "sources.labels.modalities.label.transform: cannot import"),
])
def test_config_errors_name_the_key(stores, mutate, message):
    cfg = config(stores)
    mutate(cfg)
    mods = cfg["sources"]["image_text"]["modalities"]
    if "b" in mods:
        mods["b"]["path"] = str(stores / "corpus.txt")
    with pytest.raises(ConfigError) as e:
        mmloader.from_config(cfg)
    assert message in str(e.value)


def test_duplicate_yaml_keys_are_an_error(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("sources:\n  a:\n    path: x\n    modalities:\n      image: {field: jpg}\n      image: {field: png}\n")
    with pytest.raises(ConfigError, match="duplicate key 'image' at line 6"):
        mmloader.from_config(path)


def test_plan_cli(stores, tmp_path, capsys):
    import yaml
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config(stores)))
    assert cli(["plan", str(path), "--world", "4", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "image_text" in out and "5000" in out and "50.0%" in out and "30.0%" in out
    assert "2500 samples per rank = 125 batches of 20" in out
    assert "text_only[0000000000]: caption='line 0'" in out
