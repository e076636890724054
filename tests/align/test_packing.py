"""Token-budget packing: the pure planner exhaustively, then packed streams on real stores."""

from __future__ import annotations

import bisect
import io
import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import deliver, jpeg_bytes

import mmloader
from mmloader.planning import RangeList, remaining_ranges
from mmloader.planning.packing import best_fit_rows, pack_rows


def reference_best_fit(lengths: list[int], capacity: int) -> int:
    """Rows of best-fit decreasing, one item at a time (the textbook algorithm)."""
    rooms: list[tuple[int, int]] = []
    rows = 0
    for s in sorted(lengths, reverse=True):
        i = bisect.bisect_left(rooms, (s, -1))
        if i < len(rooms):
            room, r = rooms.pop(i)
            bisect.insort(rooms, (room - s, r))
        else:
            bisect.insort(rooms, (capacity - s, rows))
            rows += 1
    return rows


def rows_of(members: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [members[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


SMALL = [
    (lengths, capacity)
    for n in range(0, 6)
    for lengths in itertools.product([0, 1, 2, 3, 5], repeat=n)
    for capacity in (5, 6)
]


@pytest.mark.parametrize("capacity", [5, 6])
def test_best_fit_rows_every_item_once_within_budget_as_textbook_bfd(capacity):
    for lengths, cap in SMALL:
        if cap != capacity:
            continue
        lengths_a = np.array(lengths, dtype=np.int64)
        row_of, rows = best_fit_rows(lengths_a, capacity)
        assert len(row_of) == len(lengths)
        if len(lengths):
            assert set(row_of.tolist()) == set(range(rows))  # no empty row
            assert np.bincount(row_of, weights=lengths_a, minlength=rows).max() <= capacity
        assert rows == reference_best_fit(list(lengths), capacity), lengths


def test_best_fit_rows_matches_textbook_bfd_on_random_sets():
    rng = np.random.default_rng(5)
    for _ in range(400):
        capacity = int(rng.integers(1, 64))
        lengths = rng.integers(0, capacity + 1, int(rng.integers(1, 200)))
        row_of, rows = best_fit_rows(lengths, capacity)
        assert np.bincount(row_of, weights=lengths, minlength=rows).max() <= capacity
        assert rows == reference_best_fit(lengths.tolist(), capacity)


@pytest.mark.parametrize("window", [1, 3, 1000])
def test_pack_rows_partitions_positions_deterministically(window):
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 50):
        lengths = rng.integers(1, 9, n)
        members, offsets = pack_rows(lengths, 8, seed=3, epoch=1, window=window)
        assert sorted(members.tolist()) == list(range(n))  # every sample exactly once
        rows = rows_of(members, offsets)
        assert all(sum(lengths[r]) <= 8 and r for r in rows)
        assert all(r == sorted(r) for r in rows)  # a row keeps plan order
        assert all(len({p // window for p in r}) == 1 for r in rows)  # within one window
        again = pack_rows(lengths, 8, seed=3, epoch=1, window=window)
        assert np.array_equal(again[0], members) and np.array_equal(again[1], offsets)
    lengths = rng.integers(1, 9, 400)
    e1, e2 = (rows_of(*pack_rows(lengths, 8, seed=3, epoch=e)) for e in (1, 2))
    assert e1 != e2  # another epoch, another order of rows


def test_pack_rows_refuses_a_sample_over_the_budget():
    with pytest.raises(ValueError, match="plan position 2 has 9 tokens, outside 0..8"):
        pack_rows(np.array([1, 2, 9]), 8)


def test_pack_rows_fills_long_tailed_lengths():
    rng = np.random.default_rng(1)
    lengths = np.minimum(rng.lognormal(4.0, 1.0, 20000).astype(np.int64) + 1, 4096)
    members, offsets = pack_rows(lengths, 4096)
    rows = len(offsets) - 1
    assert lengths.sum() / (rows * 4096) > 0.99


def _rank_rows(n_rows: int, world: int, workers: int, batch: int, ranges=None):
    return deliver(n_rows, world, workers, batch, False, ranges)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_packed_rows_split_exactly_once_equal_batches_resume_every_step(world, batch):
    rng = np.random.default_rng(world * 10 + batch)
    lengths = rng.integers(1, 7, 23)
    members, offsets = pack_rows(lengths, 8, seed=0, epoch=0)
    rows = rows_of(members, offsets)
    full, per = _rank_rows(len(rows), world, 2, batch)
    assert len({len(r) for r in full}) == 1  # equal batches per rank
    samples = Counter(s for r in full for b in r for row in b for s in rows[row])
    assert set(samples) == set(range(len(lengths)))  # every sample, once but for padding rows
    padding_rows = per * world - len(rows)
    assert sum(samples.values()) - len(lengths) == sum(len(rows[i]) for i in range(padding_rows))
    for k in range(len(full[0]) + 1):  # resume after every step, same world
        left = remaining_ranges([(0, len(rows))], world, per, k * batch, keep_padding=True)
        resumed, _ = _rank_rows(len(rows), world, 3, batch, left)
        assert all(resumed[r] == full[r][k:] for r in range(world))
        for other in {1, 2, 3, 4} - {world}:  # and onto another world size
            seen = {s for r in full for b in r[:k] for row in b for s in rows[row]}
            left = remaining_ranges([(0, len(rows))], world, per, k * batch, keep_padding=False)
            visit = RangeList(left)
            unseen = [s for row in visit.take(np.arange(len(visit))).tolist() for s in rows[row]]
            assert sorted(unseen) == sorted(set(range(len(lengths))) - seen)
            after, _ = _rank_rows(len(rows), other, 2, batch, left)
            assert len({len(r) for r in after}) == 1


# -- packed streams on real stores -----------------------------------------------------------------


def _npy(values) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(values, dtype=np.int32), allow_pickle=False)
    return out.getvalue()


def _token_store(path: Path, n: int, seed: int = 0, images: bool = False) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    ids = [list(range(i % 50 + 1, i % 50 + 1 + int(rng.integers(1, 40)))) for i in range(n)]
    with mmloader.writer_for(path, shard_size=16) as w:
        for i, row in enumerate(ids):
            sample = {"__key__": f"k{i:04d}", "ids.npy": _npy(row), "cls": str(i).encode()}
            if images:
                sample["jpg"] = jpeg_bytes(i, size=(24, 16))
            w.write(sample)
    return ids


@pytest.fixture(scope="module")
def token_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    ids = _token_store(root / "tokens.lmdb", 120)
    return root / "tokens.lmdb", ids


def _check_batch(batch, ids, capacity):
    """Each row: its samples' ids end to end, then padding; positions restart per sample."""
    assert batch["ids"].shape[1] == capacity and batch["ids"].dtype == torch.int64
    bounds = batch["cu_seqlens"].tolist()
    assert bounds[0] == 0 and bounds[-1] == batch["ids"].numel()
    flat_positions = batch["position_ids"].reshape(-1)
    starts = set(bounds[:-1])
    assert all((flat_positions[i] == 0) == (i in starts) for i in range(len(flat_positions)))
    for r, keys in enumerate(batch["__key__"]):
        expected = [t for k in keys for t in ids[int(k[1:])]]
        row = batch["ids"][r]
        assert row[: len(expected)].tolist() == expected
        assert not row[len(expected) :].any()  # pad_id 0 after the row's last sample
        assert batch["__mask__"]["ids"][r].sum() == len(expected)
        lens = [n for n in batch["seq_lens"][r].tolist() if n]
        assert lens == [len(ids[int(k[1:])]) for k in keys]
        assert batch["cls"][r] == [int(k[1:]) for k in keys]


@pytest.mark.process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_packed_stream_every_sample_once_rows_checked(token_ds, backend):
    path, ids = token_ds
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), cls=mmloader.LabelReader(path))
    stream = mmloader.Stream(ds, batch_size=4, seed=1, lengths=mmloader.Packing(64, length_by="ids"))
    loader = mmloader.loader(stream, num_workers=2, backend=backend)
    batches = list(loader)
    assert len(batches) == len(stream) == -(-len(stream.plan()) // 4)
    for b in batches:
        _check_batch(b, ids, 64)
    keys = [k for b in batches for row in b["__key__"] for k in row]
    assert sorted(keys) == sorted(f"k{i:04d}" for i in range(len(ids)))
    again = [
        b["__key__"]
        for b in mmloader.loader(
            mmloader.Stream(ds, batch_size=4, seed=1, lengths=mmloader.Packing(64, length_by="ids")),
            num_workers=1,
            backend="thread",
        )
    ]
    assert again == [b["__key__"] for b in batches]  # deterministic, whatever the backend and workers
    assert [b["__key__"] for b in loader] != again  # the next pass is the next epoch


def test_packed_stream_resumes_mid_epoch_and_on_another_world(token_ds):
    path, _ids = token_ds
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))

    def stream(rank, world):
        s = mmloader.Stream(ds, batch_size=2, seed=4, lengths=mmloader.Packing(50, length_by="ids"))
        s.set_world(rank, world)
        return s

    full = [[b["__key__"] for b in stream(r, 2).iter_worker(0, 1)] for r in range(2)]
    assert len(full[0]) == len(full[1])
    k = 3
    state = stream(0, 2).progress(k)
    for r in range(2):
        resumed = stream(r, 2)
        resumed.resume(state)
        assert [b["__key__"] for b in resumed.iter_worker(0, 1)] == full[r][k:]
    seen = Counter(s for r in full for b in r[:k] for row in b for s in row)
    one = stream(0, 1)
    one.resume(state)
    rest = Counter(s for b in one.iter_worker(0, 1) for row in b["__key__"] for s in row)
    assert not set(rest) & set(seen)
    assert set(rest) | set(seen) == {f"k{i:04d}" for i in range(len(_ids))}
    assert max(rest.values()) == 1


def test_packed_images_and_placeholders(tmp_path):
    path = tmp_path / "pairs"
    ids = _token_store(path, 30, images=True)
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), image=mmloader.ImageReader(path))
    layout = mmloader.tokens("ids", images="image", per_image=8, image_token_id=999)
    stream = mmloader.Stream(ds, batch_size=3, lengths=mmloader.Packing(64, length_by=layout))
    for batch in mmloader.loader(stream, num_workers=0):
        rows, where = batch["__row__"]["image"].tolist(), batch["__sample__"]["image"].tolist()
        assert batch["image"].shape[0] == sum(len(k) for k in batch["__key__"]) == len(rows)
        assert [(r, j) for r, keys in enumerate(batch["__key__"]) for j in range(len(keys))] == list(zip(rows, where))
        for r, keys in enumerate(batch["__key__"]):
            expected = [t for k in keys for t in [999] * 8 + ids[int(k[1:])]]
            assert batch["ids"][r, : len(expected)].tolist() == expected
        n = 0
        for r, keys in enumerate(batch["__key__"]):
            for k in keys:
                want = mmloader.ImageReader(path).get(k)
                assert torch.equal(batch["image"][n], want)
                n += 1


def test_packing_errors_name_what_is_wrong(token_ds, tmp_path):
    path, _ids = token_ds
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), cls=mmloader.LabelReader(path))
    with pytest.raises(ValueError, match=r"sample 'k\d+' has \d+ tokens, over pack_tokens=20"):
        len(mmloader.Stream(ds, batch_size=2, lengths=mmloader.Packing(20, length_by="ids")))
    cut = mmloader.Stream(
        ds, batch_size=2, lengths=mmloader.Packing(20, length_by=mmloader.tokens("ids", overlong="truncate"))
    )
    assert all(b["ids"].shape == (len(b["__key__"]), 20) for b in mmloader.loader(cut, num_workers=0))
    with pytest.raises(TypeError, match=r"lengths=mmloader\.Bucketing.*lengths=mmloader\.Packing"):
        mmloader.Stream(ds, batch_size=2, pack_tokens=64, bucket_by="ids")  # one slot: the pair cannot be written
    with pytest.raises(TypeError, match="expected mmloader.Bucketing"):
        mmloader.Stream(ds, batch_size=2, lengths=(mmloader.Bucketing("ids"), mmloader.Packing(64)))
    with pytest.raises(ValueError, match="Packing needs a batch size"):
        mmloader.Stream(ds, lengths=mmloader.Packing(64, length_by="ids"))
    with pytest.raises(ValueError, match="not a modality"):
        mmloader.Stream(ds, batch_size=2, lengths=mmloader.Packing(64, length_by="caption"))
    with pytest.raises(TypeError, match="LabelReader cannot tell a sample's tokens"):
        len(mmloader.Stream(ds, batch_size=2, lengths=mmloader.Packing(64, length_by="cls")))
    with pytest.raises(ValueError, match="image_token_id"):
        mmloader.tokens("ids", images="image", per_image=4)
    # lengths that understate what the reader delivers never pass silently
    lying = mmloader.Stream(
        ds, batch_size=2, lengths=mmloader.Packing(64, length_by=mmloader.tokens("ids", length=lambda i: 1))
    )
    with pytest.raises(mmloader.SampleError, match=r"sample .k\d+. has \d+ tokens, more than the 1 planned"):
        list(mmloader.loader(lying, num_workers=0))


def test_packing_plan_identity_guards_resume(token_ds):
    path, _ids = token_ds
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    state = mmloader.Stream(ds, batch_size=2, lengths=mmloader.Packing(64, length_by="ids")).progress(1)
    other = mmloader.Stream(ds, batch_size=2, lengths=mmloader.Packing(96, length_by="ids"))
    with pytest.raises(mmloader.PlanChangedError, match="pack"):
        other.resume(state)


def test_packed_mix_tags_sources_and_pads_with_mask(token_ds, tmp_path):
    path, ids = token_ds
    other = tmp_path / "other.lmdb"
    ids_b = _token_store(other, 40, seed=3)
    a = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    b = mmloader.zip(ids=mmloader.ArrayReader(other, "ids.npy"))
    mixed = mmloader.mix([a, b], names=["a", "b"], weights=[0.5, 0.5])
    stream = mmloader.Stream(
        mixed, batching=mmloader.Batching(3, padding="mask"), lengths=mmloader.Packing(64, length_by="ids")
    )
    batches = list(mmloader.loader(stream, num_workers=0))
    for batch in batches:
        for r, (keys, sources) in enumerate(zip(batch["__key__"], batch["__source__"])):
            expected = [t for k, s in zip(keys, sources) for t in (ids if s == "a" else ids_b)[int(k[1:])]]
            assert batch["ids"][r, : len(expected)].tolist() == expected
    rows = sum(int(b["__valid__"].sum()) for b in batches)
    assert rows == len(stream.plan())


def test_live_streams_refuse_packing():
    def generated(rank, world, worker, workers):
        yield from ({"__key__": f"g{i}", "txt": b"x"} for i in range(10))

    fresh = mmloader.live(generated, name="g", decode={"caption": mmloader.TextReader(None, "txt")})
    with pytest.raises(ValueError, match="does not apply to a live stream"):
        mmloader.LiveStream(fresh, batch_size=2, steps=2, lengths=mmloader.Packing(64, length_by="caption"))


def test_packing_from_a_config_and_mmloader_plan(token_ds):
    from mmloader.cli.plan import describe_plan

    path, _ids = token_ds
    config = {
        "batch_size": 4,
        "pack_tokens": 64,
        "length_by": {"text": "ids", "overlong": "truncate"},
        "sources": {"tokens": {"path": str(path), "modalities": {"ids": {"field": "ids.npy", "reader": "array"}}}},
    }
    stream = mmloader.from_config(config)
    assert stream.packer is not None and stream.packer.layout.overlong == "truncate"
    text = describe_plan(config, world=2)
    rows = len(stream.plan())
    assert f"into {rows} rows of 64 tokens" in text and "token utilisation" in text
    assert f"{stream.plan().utilisation():.1%}" in text
    with pytest.raises(mmloader.ConfigError, match="length_by: unknown key"):
        mmloader.from_config({**config, "length_by": {"txt": "ids"}})


def _packed_rank(rank: int, init: str, path: str, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))

    def loader():
        stream = mmloader.Stream(ds, batch_size=3, seed=5, lengths=mmloader.Packing(48, length_by="ids"))
        return mmloader.loader(stream, num_workers=2, backend="process", multiprocessing_context="fork")

    first = loader()
    full = [b["__key__"] for b in first]
    first.set_epoch(0)  # the same epoch again, left after two batches
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(2)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [b["__key__"] for b in resumed]
    counts = torch.tensor([len(full)])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"full": full, "head": head, "rest": rest, "max": int(counts), "state": state})
    )
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.process
def test_packed_stream_on_two_ddp_ranks(token_ds, tmp_path):
    import json

    import torch.multiprocessing as tmp

    path, ids = token_ds
    tmp.spawn(_packed_rank, args=(str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]["full"]) == len(ranks[1]["full"]) == ranks[0]["max"]  # equal batches, no hang
    keys = Counter(k for r in ranks for b in r["full"] for row in b for k in row)
    assert set(keys) == {f"k{i:04d}" for i in range(len(ids))}
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    rows = len(mmloader.Stream(ds, batch_size=3, seed=5, lengths=mmloader.Packing(48, length_by="ids")).plan())
    repeated = sum(keys.values()) - len(ids)
    assert (repeated == 0) == (rows % 2 == 0)  # only a padding row repeats (an odd row count)
    for r in ranks:
        assert r["head"] == r["full"][:2] and r["rest"] == r["full"][2:]  # resumed where it stopped


def test_packing_a_plain_map_style_dataset_with_given_lengths():
    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 30

        def __getitem__(self, i):
            return {"__key__": f"p{i}", "ids": torch.arange(1, i % 7 + 2)}

    layout = mmloader.tokens("ids", length=lambda i: i % 7 + 1)
    stream = mmloader.Stream(Tokens(), batch_size=2, lengths=mmloader.Packing(16, length_by=layout))
    keys = [k for b in mmloader.loader(stream, num_workers=0) for row in b["__key__"] for k in row]
    assert sorted(keys) == sorted(f"p{i}" for i in range(30))
    with pytest.raises(ValueError, match=r"length_by: 3 token counts for 30 samples"):
        len(
            mmloader.Stream(
                Tokens(), batch_size=2, lengths=mmloader.Packing(16, length_by=mmloader.tokens("ids", length=[1, 2, 3]))
            )
        )


def test_review_cases_images_mixes_and_layout(tmp_path):
    path = tmp_path / "pairs"
    _token_store(path, 12, images=True)
    other = tmp_path / "other.lmdb"
    with mmloader.writer_for(other) as w:  # a source without labels, and one without token ids
        for i in range(6):
            w.write({"__key__": f"o{i}", "ids.npy": _npy([7] * (i + 1)), "jpg": jpeg_bytes(50 + i, size=(24, 16))})
    layout = mmloader.tokens("ids", images="image", per_image=4, image_token_id=999)
    # PIL images are images too: placeholders and the image itself
    pil = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), image=mmloader.ImageReader(path, output="pil"))
    batch = next(
        iter(
            mmloader.loader(
                mmloader.Stream(pil, batch_size=2, lengths=mmloader.Packing(64, length_by=layout)), num_workers=0
            )
        )
    )
    n = sum(map(len, batch["__key__"]))
    assert len(batch["image"]) == n and int(batch["ids"].eq(999).sum()) == 4 * n
    # a mix: a field one source lacks is None in its rows, never a placeholder object
    a = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), cls=mmloader.LabelReader(path))
    b = mmloader.zip(ids=mmloader.ArrayReader(other, "ids.npy"))
    mixed = mmloader.mix([a, b], names=["a", "b"], weights=[0.5, 0.5])
    for batch in mmloader.loader(
        mmloader.Stream(mixed, batch_size=2, lengths=mmloader.Packing(64, length_by="ids")), num_workers=0
    ):
        for labels, sources in zip(batch["cls"], batch["__source__"]):
            assert [label is None for label in labels] == [s == "b" for s in sources]
    # an image-only source in a mix: its rows hold its images' placeholders
    images_only = mmloader.zip(image=mmloader.ImageReader(other))
    pairs = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), image=mmloader.ImageReader(path))
    both = mmloader.mix([pairs, images_only], names=["pairs", "images"], weights=[0.5, 0.5])
    stream = mmloader.Stream(both, batch_size=3, lengths=mmloader.Packing(64, length_by=layout))
    seen = [s for batch in mmloader.loader(stream, num_workers=0) for row in batch["__source__"] for s in row]
    assert "images" in seen and "pairs" in seen
    # seq_lens stay aligned with the keys when a sample is empty
    empty = tmp_path / "empty.lmdb"
    with mmloader.writer_for(empty) as w:
        for i, n_ids in enumerate([0, 4, 3]):
            w.write({"__key__": f"e{i}", "ids.npy": _npy(list(range(1, n_ids + 1)))})
    e = mmloader.zip(ids=mmloader.ArrayReader(empty, "ids.npy"))
    batch = next(
        iter(
            mmloader.loader(
                mmloader.Stream(e, batch_size=1, shuffle=False, lengths=mmloader.Packing(16, length_by="ids")),
                num_workers=0,
            )
        )
    )
    lens = {k: n for k, n in zip(batch["__key__"][0], batch["seq_lens"][0].tolist())}
    assert lens == {"e0": 0, "e1": 4, "e2": 3}
    assert batch["cu_seqlens"].tolist() == [0, 4, 7, 16]


def test_review_cases_lengths_and_plans(token_ds, tmp_path):
    path, ids = token_ds
    ds = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"))
    counts = [len(x) for x in ids]
    # a state of rows made from other lengths is refused as another plan, even with as many rows
    state = mmloader.Stream(
        ds, batch_size=2, lengths=mmloader.Packing(64, length_by=mmloader.tokens("ids", length=counts))
    ).progress(1)
    more = [c + (1 if i == 0 else 0) for i, c in enumerate(counts)]
    other = mmloader.Stream(
        ds, batch_size=2, lengths=mmloader.Packing(64, length_by=mmloader.tokens("ids", length=more))
    )
    with pytest.raises(mmloader.PlanChangedError, match="pack"):
        other.resume(state)
    # shuffle=False: the same rows in the same order every epoch
    fixed = mmloader.Stream(ds, batch_size=2, shuffle=False, lengths=mmloader.Packing(64, length_by="ids"))
    fixed.set_epoch(0)
    e0 = [b["__key__"] for b in fixed.iter_worker(0, 1)]
    fixed.set_epoch(3)
    assert [b["__key__"] for b in fixed.iter_worker(0, 1)] == e0
    # zip-level transforms may change the ids: their counts are not guessed
    changed = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), transforms={"ids": lambda t: t[:-1]})
    with pytest.raises(TypeError, match="transforms"):
        len(mmloader.Stream(changed, batch_size=2, lengths=mmloader.Packing(64, length_by="ids")))
    # bad length_by values say so
    with pytest.raises(ValueError, match="whole"):
        len(
            mmloader.Stream(
                ds,
                batch_size=2,
                lengths=mmloader.Packing(64, length_by=mmloader.tokens("ids", length=[0.5] * len(ids))),
            )
        )
    with pytest.raises(ValueError, match="ImageReader"):
        mmloader.Stream(
            mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), cls=mmloader.LabelReader(path)),
            batch_size=2,
            lengths=mmloader.Packing(64, length_by=mmloader.tokens("ids", images="cls", per_image=2, image_token_id=5)),
        )


def test_review_cases_stored_token_counts(tmp_path):
    import gzip

    from tokenizers import Tokenizer

    # mixed dtypes: counts cannot come from sizes
    mixed = tmp_path / "mixed.lmdb"
    with mmloader.writer_for(mixed) as w:
        for i in range(20):
            arr = np.arange(1, 5 + i, dtype=np.int32 if i % 2 else np.int64)
            out = io.BytesIO()
            np.save(out, arr)
            w.write({"__key__": f"m{i:02d}", "ids.npy": out.getvalue()})
    with pytest.raises(TypeError, match="more than one dtype"):
        mmloader.zip(ids=mmloader.ArrayReader(mixed, "ids.npy")).token_counts(list(range(20)), "ids")
    # a corrupt value counts 0 when planning and is skipped, by key, when read
    bad = tmp_path / "bad.lmdb"
    with mmloader.writer_for(bad) as w:
        for i in range(6):
            w.write({"__key__": f"b{i}", "ids.npy": _npy([1, 2, 3]) if i != 3 else b"xx"})
    bad_ds = mmloader.zip(ids=mmloader.ArrayReader(bad, "ids.npy"))
    stream = mmloader.Stream(bad_ds, batch_size=2, lengths=mmloader.Packing(8, length_by="ids"), errors="skip")
    keys = [k for b in mmloader.loader(stream, num_workers=0) for row in b["__key__"] for k in row]
    assert sorted(keys) == ["b0", "b1", "b2", "b4", "b5"] and stream.skipped == 1
    # gzipped text is tokenized as text
    tokenizer = tmp_path / "tok.json"
    from conftest import train_tokenizer

    lines = [f"line number {i} of the corpus" for i in range(30)]
    train_tokenizer(lines * 3, tokenizer)
    gz = tmp_path / "gz.lmdb"
    with mmloader.writer_for(gz) as w:
        for i, line in enumerate(lines):
            w.write({"__key__": f"g{i:02d}", "txt.gz": gzip.compress(line.encode())})
    reader = mmloader.TextReader(gz, "txt.gz", tokenizer=tokenizer)
    want = [len(e.ids) for e in Tokenizer.from_file(str(tokenizer)).encode_batch(lines)]
    assert reader.token_counts(list(range(30))).tolist() == want


def test_review_cases_truncation(tmp_path):
    path = tmp_path / "pairs"
    _token_store(path, 6, images=True)
    pairs = mmloader.zip(ids=mmloader.ArrayReader(path, "ids.npy"), image=mmloader.ImageReader(path))
    layout = mmloader.tokens("ids", images="image", per_image=40, image_token_id=999, overlong="truncate")
    with pytest.raises(ValueError, match="images take 40 tokens, over pack_tokens=32"):
        len(mmloader.Stream(pairs, batch_size=2, lengths=mmloader.Packing(32, length_by=layout)))
    docs = tmp_path / "docs.lmdb"
    with mmloader.writer_for(docs) as w:  # a long text, then an image that no longer fits
        w.write(
            {"__key__": "d", "json": {"document": [{"text": "x " * 60}, {"image": "0.jpg"}]}, "0.jpg": jpeg_bytes(9)}
        )
    from conftest import train_tokenizer

    train_tokenizer(["x " * 60] * 10, tmp_path / "tok.json")
    reader = mmloader.DocumentReader(docs, tokenizer=tmp_path / "tok.json")
    doc_layout = mmloader.tokens("doc", per_image=8, image_token_id=299, overlong="truncate")
    batch = next(
        iter(
            mmloader.loader(
                mmloader.Stream(
                    mmloader.zip(doc=reader), batch_size=1, lengths=mmloader.Packing(16, length_by=doc_layout)
                ),
                num_workers=0,
            )
        )
    )
    assert batch["__mask__"]["doc"].all() and not batch["doc"].eq(299).any()  # text cut; the image left out
    assert len(batch["__images__"]["doc"]) == 0
