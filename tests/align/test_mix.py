"""mix(weights_by="tokens") (mmloader/align/mix.py, loading/packing.py:token_weighted): a packed
mix's weights are shares of the tokens delivered, measured on the batches the loader delivered."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import yaml

import mmloader
from mmloader.cli import main as cli

CAPACITY = 512
SOURCES = {"captions": 24, "articles": 160, "books": 380}  # long-tailed: mean tokens per sample


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(3)
    for name, mean in SOURCES.items():
        with mmloader.LMDBWriter(root / f"{name}.lmdb") as w:
            for i in range(600):
                n = int(min(CAPACITY, max(1, rng.lognormal(np.log(mean), 0.6))))
                w.write({"__key__": f"{name}{i:04d}", "ids.npy": np.ones(n, dtype=np.int32)})
    return root


def _stream(stores, weights, weights_by, epoch_size=900, **mix):
    ds = [mmloader.zip(ids=mmloader.ArrayReader(stores / f"{n}.lmdb", "ids.npy")) for n in SOURCES]
    m = mmloader.mix(ds, weights, names=list(SOURCES), epoch_size=epoch_size, weights_by=weights_by, **mix)
    return mmloader.Stream(m, batch_size=4, seed=1, lengths=mmloader.Packing(CAPACITY))


def _delivered_token_shares(stream, epoch=0) -> dict[str, float]:
    """Tokens per source in the batches the loader delivered: each packed sample's length."""
    loader = mmloader.loader(stream, 1, backend="thread")
    loader.set_epoch(epoch)
    tokens: Counter = Counter()
    for batch in loader:
        for row, names in enumerate(batch["__source__"]):
            for i, name in enumerate(names):
                tokens[name] += int(batch["seq_lens"][row, i])
    total = sum(tokens.values())
    return {n: tokens[n] / total for n in SOURCES}


def test_token_weights_give_the_delivered_token_shares_and_sample_weights_do_not(stores):
    weights = [0.5, 0.3, 0.2]
    by_tokens = _delivered_token_shares(_stream(stores, weights, "tokens"))
    assert all(abs(by_tokens[n] - w) < 0.02 for n, w in zip(SOURCES, weights)), by_tokens
    by_samples = _delivered_token_shares(_stream(stores, weights, "samples"))
    assert by_samples["captions"] < 0.2  # half the samples, a few percent of the tokens
    # the ledger says the same shares without reading a sample
    stream = _stream(stores, weights, "tokens")
    assert stream.token_shares(0) == pytest.approx(_delivered_token_shares(stream), abs=1e-9)


def test_a_token_weighted_schedule_holds_each_epochs_token_shares(stores):
    schedule = {"points": [{"at": 0, "weights": [0.8, 0.1, 0.1]}, {"at": 1, "weights": [0.1, 0.1, 0.8]}]}
    stream = _stream(stores, None, "tokens", schedule=schedule)
    for epoch, weights in ((0, [0.8, 0.1, 0.1]), (1, [0.1, 0.1, 0.8])):
        shares = _delivered_token_shares(stream, epoch)
        assert all(abs(shares[n] - w) < 0.03 for n, w in zip(SOURCES, weights)), (epoch, shares)


def test_token_weights_are_part_of_the_plan_and_refused_where_they_cannot_work(stores):
    assert _stream(stores, [1, 1, 1], "tokens").identity() != _stream(stores, [1, 1, 1], "samples").identity()
    ds = [mmloader.zip(ids=mmloader.ArrayReader(stores / f"{n}.lmdb", "ids.npy")) for n in SOURCES]
    with pytest.raises(ValueError, match="weighs sources by their tokens, which a packing stream measures"):
        mmloader.Stream(mmloader.mix(ds, weights_by="tokens"), batch_size=4)
    with pytest.raises(ValueError, match="weights_by='tokens' .* needs mode='proportion', not 'repeat'"):
        mmloader.mix(ds, [1, 1, 1], mode="repeat", weights_by="tokens")
    with pytest.raises(ValueError, match="weights_by='rows': expected 'samples' or 'tokens'"):
        mmloader.mix(ds, weights_by="rows")


def test_a_config_weighs_by_tokens_and_plan_quality_prints_the_shares(stores, capsys):
    cfg = {
        "seed": 1,
        "batch_size": 4,
        "pack_tokens": CAPACITY,
        "length_by": "ids",
        "mix": {"mode": "proportion", "epoch_size": 900, "weights_by": "tokens"},
        "sources": {
            n: {
                "path": str(stores / f"{n}.lmdb"),
                "weight": w,
                "modalities": {"ids": {"reader": "array", "field": "ids.npy"}},
            }
            for n, w in zip(SOURCES, (0.5, 0.3, 0.2))
        },
    }
    path = stores / "tokens.yaml"
    path.write_text(yaml.safe_dump(cfg))
    shares = mmloader.from_config(path).token_shares(0)
    assert all(abs(shares[n] - w) < 0.02 for n, w in zip(SOURCES, (0.5, 0.3, 0.2)))
    assert cli(["plan", str(path), "--quality"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    said = ", ".join(f"{n} {100 * v:.1f}%" for n, v in shares.items())
    asked = ", ".join(f"{n} {100 * w:.1f}%" for n, w in sorted(zip(SOURCES, (0.5, 0.3, 0.2))))  # (yaml sorts)
    assert line == f"  token shares: {said} (weights, in tokens: {asked})"


def test_a_schedule_point_that_weighs_a_source_without_tokens_is_refused(stores, tmp_path):
    with mmloader.LMDBWriter(tmp_path / "empty.lmdb") as w:
        for i in range(20):
            w.write({"__key__": f"e{i:03d}", "ids.npy": np.ones(0, dtype=np.int32)})
    ds = [
        mmloader.zip(ids=mmloader.ArrayReader(p, "ids.npy"))
        for p in (stores / "captions.lmdb", tmp_path / "empty.lmdb")
    ]
    later = {"points": [{"at": 0, "weights": [1, 0]}, {"at": 1, "weights": [1, 1]}]}  # only the second weighs it
    m = mmloader.mix(ds, names=["captions", "empty"], epoch_size=100, schedule=later, weights_by="tokens")
    with pytest.raises(
        ValueError, match="source 'empty' has a weight at schedule point 1 but its samples hold no tokens"
    ):
        mmloader.Stream(m, batch_size=4, lengths=mmloader.Packing(CAPACITY))


def test_what_a_token_schedule_shows_is_the_weights_given(stores):
    points = [{"at": 0, "weights": [0.8, 0.1, 0.1]}, {"at": 2, "weights": [0.2, 0.4, 0.4]}]
    stream = _stream(stores, None, "tokens", schedule={"points": points})
    shown = stream.identity()["mix"]["schedule"]["points"]
    assert [w for _at, w in shown] == [[0.8, 0.1, 0.1], [0.2, 0.4, 0.4]]  # not the sample weights planned with
    assert stream.mix.schedule.weights[0].tolist() != [0.8, 0.1, 0.1]


def test_two_sources_of_one_name_are_refused(stores):
    ds = mmloader.zip(ids=mmloader.ArrayReader(stores / "captions.lmdb", "ids.npy"))
    with pytest.raises(ValueError, match=r"mix\(names=...\): \['a'\] name\(s\) more than one source"):
        mmloader.mix([ds, ds], names=["a", "a"])
