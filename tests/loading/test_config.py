"""Experiment configs, weighted mixing through Stream, presence masks, `mmloader plan`."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import jpeg_bytes

import mmloader
from mmloader.cli import main as cli
from mmloader.errors import ConfigError


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
        "seed": 1,
        "batch_size": 20,
        "mix": {"mode": "proportion", "epoch_size": 10_000},
        "sources": {
            "image_text": {
                "path": str(root / "pairs.lmdb"),
                "weight": 0.5,
                "modalities": {"image": {"field": "jpg"}, "caption": {"field": "txt", "path": str(root / "caps")}},
            },
            "text_only": {"path": str(root / "corpus.txt"), "weight": 0.3, "modalities": {"caption": {"field": "txt"}}},
            "labels": {"path": str(root / "pairs.lmdb"), "weight": 0.2, "modalities": {"label": {"field": "cls"}}},
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


@pytest.mark.slow
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
    keys = Counter(
        k
        for b in mmloader.loader(stream, num_workers=0)
        for k, s in zip(b["__key__"], b["__source__"])
        if s == "image_text"
    )
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


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda c: c["sources"]["labels"].update(path="/no/such/store"),
            "sources.labels.path: /no/such/store does not exist",
        ),
        (
            lambda c: c["sources"]["labels"]["modalities"].update(label={"field": "nope"}),
            "sources.labels.modalities.label.field: 'nope' is not a field",
        ),
        (lambda c: c["sources"]["labels"].update(weight=-1), "sources.labels.weight: -1 is negative"),
        (lambda c: [s.update(weight=0) for s in c["sources"].values()], "all weights are zero"),
        (
            lambda c: c["sources"]["labels"].update(
                modalities=[{"name": "x", "field": "cls"}, {"name": "x", "field": "txt"}]
            ),
            "sources.labels.modalities: duplicate modality name(s) ['x']",
        ),
        (
            lambda c: (
                c["sources"]["image_text"]["modalities"]["caption"].update(path=None)
                or c["sources"]["image_text"].update(
                    modalities={"a": {"field": "txt"}, "b": {"field": "txt", "path": "CORPUS"}}
                )
            ),
            "sources.image_text: its modalities cannot be aligned",
        ),
        (lambda c: c.update(bogus=1), "config: unknown key(s) ['bogus']"),
        (
            lambda c: c["sources"]["labels"]["modalities"]["label"].update(transform="no.such:thing"),
            "sources.labels.modalities.label.transform: cannot import",
        ),
    ],
)
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
    path.write_text(
        "sources:\n  a:\n    path: x\n    modalities:\n      image: {field: jpg}\n      image: {field: png}\n"
    )
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


# -- issue 13: one road for one source; mixes batched; degenerate mixes; paths -----------------
def _single(stores, **over):
    return {
        "seed": 4,
        "batch_size": 16,
        "sources": {
            "pairs": {
                "path": str(stores / "pairs.lmdb"),
                "modalities": {"image": {"field": "jpg"}, "caption": {"field": "txt", "path": str(stores / "caps")}},
            }
        },
        **over,
    }


def test_single_source_config_is_the_python_api(stores, monkeypatch):
    """Defect 5: no mix around one source: the batched path, no __source__, channels_last."""
    calls = Counter()
    real = mmloader.Zipped.get_batch

    def counting(self, indices, **kw):
        calls["get_batch"] += 1
        return real(self, indices, **kw)

    monkeypatch.setattr(mmloader.Zipped, "get_batch", counting)
    stream = mmloader.from_config(_single(stores))
    assert stream.mix is None
    api = mmloader.Stream(
        mmloader.zip(
            image=mmloader.ImageReader(stores / "pairs.lmdb", "jpg"),
            caption=mmloader.TextReader(stores / "caps", "txt"),
        ),
        batch_size=16,
        seed=4,
    )
    got = list(mmloader.loader(stream, backend="thread"))
    want = list(mmloader.loader(api, backend="thread"))
    assert calls["get_batch"] == len(got) + len(want)  # every batch read whole
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    for a, b in zip(got, want):
        assert set(a) == set(b) and "__source__" not in a
        assert a["image"].is_contiguous(memory_format=torch.channels_last) and torch.equal(a["image"], b["image"])


def test_mixes_read_whole_batches_per_source(stores, monkeypatch):
    calls = Counter()
    real_batch, real_item = mmloader.Zipped.get_batch, mmloader.Zipped.__getitem__
    monkeypatch.setattr(
        mmloader.Zipped, "get_batch", lambda self, idx, **kw: (calls.update(["batch"]), real_batch(self, idx, **kw))[1]
    )
    monkeypatch.setattr(
        mmloader.Zipped, "__getitem__", lambda self, i: (calls.update(["sample"]), real_item(self, i))[1]
    )
    stream = mmloader.from_config(config(stores, mix={"epoch_size": 400}))
    batches = list(mmloader.loader(stream, backend="thread"))
    assert calls["sample"] == 0 and calls["batch"] >= len(batches)
    mixed = next(b for b in batches if len(set(b["__source__"])) == 3)
    present = mixed["__present__"]["image"]
    assert mixed["image"].shape[0] == 20 and mixed["image"].is_contiguous(memory_format=torch.channels_last)
    assert not mixed["image"][~present].any()  # rows of sources without images are zeros
    # the same rows read one by one give the same values
    for row, (key, src) in enumerate(zip(mixed["__key__"], mixed["__source__"])):
        if src == "text_only":
            assert mixed["caption"][row] == f"line {int(key)}"


def test_bucketing_with_source_composition_through_a_config(stores):
    """Defect 6: batch_composition='source' with bucket_by keeps every batch single-source."""
    stream = mmloader.from_config(
        config(stores, batch_composition="source", bucket_by="caption", mix={"epoch_size": 1000})
    )
    batches = list(mmloader.loader(stream, backend="thread"))
    assert batches and all(len(set(b["__source__"])) == 1 for b in batches)


def test_degenerate_mixes_are_refused_or_warned(stores):
    """Defect 12: a 1-sample source 0.5/0.5 with a big one."""
    with mmloader.LMDBWriter(stores / "one.lmdb") as w:
        w.write({"__key__": "only", "txt": "lonely"})
    cfg = {
        "batch_size": 8,
        "sources": {
            "tiny": {"path": str(stores / "one.lmdb"), "weight": 0.5, "modalities": {"caption": {"field": "txt"}}},
            "big": {"path": str(stores / "corpus.txt"), "weight": 0.5, "modalities": {"caption": {"field": "txt"}}},
        },
    }
    with pytest.warns(UserWarning, match="source 'tiny' .1 samples. limits the epoch"):
        stream = mmloader.from_config(cfg)
    assert len(stream.plan()) == 2
    with pytest.raises(ConfigError, match="0 samples per epoch in whole batches of 8"):
        mmloader.from_config({**cfg, "batch_composition": "source"})


def test_mix_summary_equals_what_is_delivered(stores):
    stream = mmloader.from_config(config(stores, batch_composition="source", batch_size=64, mix={"epoch_size": 1500}))
    delivered = Counter(s for b in mmloader.loader(stream, backend="thread") for s in b["__source__"])
    summary = {r["name"]: r["per_epoch"] for r in stream.mix.summary(stream.batch_size)}
    assert summary == dict(delivered)
    assert all(v % 64 == 0 for v in summary.values())


def test_config_path_that_is_a_tar_file_is_a_config_error(stores, tmp_path):
    """Defect 15: only text files are taken as line files; nothing is written into the dataset."""
    shard = next((stores / "caps").glob("*.tar"))
    before = set((stores / "caps").iterdir())
    cfg = {"sources": {"s": {"path": str(shard), "modalities": {"caption": {"field": "txt"}}}}}
    with pytest.raises(ConfigError, match=r"sources\.s\.path: .*is a tar shard, not a dataset"):
        mmloader.from_config(cfg)
    assert set((stores / "caps").iterdir()) == before


def test_config_text_file_with_its_index_path(stores, tmp_path):
    index = tmp_path / "idx" / "corpus.lines.npy"
    index.parent.mkdir()
    cfg = {
        "batch_size": 5,
        "sources": {
            "s": {
                "path": str(stores / "corpus.txt"),
                "index_path": str(index),
                "modalities": {"caption": {"field": "txt"}},
            }
        },
    }
    batch = next(iter(mmloader.loader(mmloader.from_config(cfg), backend="thread")))
    assert index.is_file() and len(batch["caption"]) == 5 and batch["caption"][0].startswith("line ")


@pytest.mark.parametrize(
    "over,message",
    [
        ({"block_size": 0}, "config: block_size=0: expected an integer >= 1"),
        ({"shuffle": "false"}, "config: shuffle='false': expected true or false"),
        ({"batch_size": -2}, "config: batch_size=-2"),
        ({"on_error": "ignore"}, "config: on_error='ignore'"),
        ({"batch_composition": "mixed"}, "batch_composition: 'mixed' is not one of"),
    ],
)
def test_config_options_checked_when_read(stores, over, message):
    """Issue 18, item 11: bad option values are named where they are given, not at iteration."""
    with pytest.raises(ConfigError) as e:
        mmloader.from_config(_single(stores, **over))
    assert message in str(e.value)


def test_config_reader_options_checked_when_read(stores):
    cfg = _single(stores)
    cfg["sources"]["pairs"]["modalities"]["image"]["size"] = -5
    with pytest.raises(ConfigError, match=r"sources\.pairs\.modalities\.image: bad reader option: size=-5"):
        mmloader.from_config(cfg)
    cfg["sources"]["pairs"]["modalities"]["image"] = {"field": "jpg", "decode": "raw"}
    with pytest.raises(ConfigError, match="the key is now 'output'"):
        mmloader.from_config(cfg)


def test_more_options_checked_when_read(stores, tmp_path):
    """Review findings: mix sizes, transforms that are not callable, index paths, empty sources."""
    bad = {"mix": {"epoch_size": -5}}
    with pytest.raises(ConfigError, match=r"mix: epoch_size=-5: expected a whole number"):
        mmloader.from_config(config(stores, **bad))
    with pytest.raises(ConfigError, match="epoch_size=2.5"):
        mmloader.from_config(config(stores, mix={"epoch_size": 2.5}))
    with pytest.raises(ValueError, match="whole numbers of samples"):
        mmloader.mix([range(10), range(5)], [1.5, 2], mode="count")
    cfg = _single(stores)
    cfg["sources"]["pairs"]["modalities"]["caption"]["transform"] = "os:sep"
    with pytest.raises(ConfigError, match=r"caption\.transform: 'os:sep' is a str, not a callable"):
        mmloader.from_config(cfg)
    text = {
        "sources": {
            "t": {
                "path": str(stores / "corpus.txt"),
                "index_path": str(tmp_path / "no" / "x.npy"),
                "modalities": {"caption": {"field": "txt"}},
            }
        }
    }
    with pytest.raises(ConfigError, match=r"sources\.t\.path: index_path .*does not exist"):
        mmloader.from_config(text)
    (tmp_path / "empty.txt").write_text("")
    empty = {"sources": {"t": {"path": str(tmp_path / "empty.txt"), "modalities": {"caption": {"field": "txt"}}}}}
    with pytest.raises(ConfigError, match=r"^sources\.t\.path: \S*empty.txt holds no line"):  # said once
        mmloader.from_config(empty)
    cfg = _single(stores)
    cfg["sources"]["pairs"]["modalities"]["caption"]["allow_pickle"] = "yes"
    with pytest.raises(ConfigError, match=r"allow_pickle: 'yes': expected true or false"):
        mmloader.from_config(cfg)
    with pytest.raises(ConfigError, match="not a regular file"):
        mmloader.from_config("/dev/null")
