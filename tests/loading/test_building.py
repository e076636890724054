"""mmloader/loading/building.py: every batch is read through the one read path (``get_batch``,
one ``read_many`` per store); a sample read alone is a batch of one, and the per-sample path is
the fallback that finds and names (or skips) a bad sample."""

from __future__ import annotations

import torch
from conftest import write_dataset

import mmloader


def _counting(ds: mmloader.Zipped) -> list[int]:
    """Record the batch size of every ``read_many`` the zip's store serves (readers over one path
    share the first one's store)."""
    store = next(iter(ds.readers.values())).store
    sizes: list[int] = []
    real = store.read_many
    store.read_many = lambda rows, fields, **kw: sizes.append(len(rows)) or real(rows, fields, **kw)
    return sizes


def test_a_row_wise_collate_gets_rows_read_as_one_batch(tmp_path):
    path = write_dataset(tmp_path / "ds.lmdb", 12, "lmdb")
    ds = mmloader.zip(image=mmloader.ImageReader(path), caption=mmloader.TextReader(path))
    seen: list[list[dict]] = []
    sizes = _counting(ds)

    def rows(samples):  # a user's collate: it sees samples, as torch's collate_fn would
        seen.append(samples)
        return [s["__key__"] for s in samples]

    stream = mmloader.Stream(ds, batching=mmloader.Batching(4, collate_fn=rows), shuffle=False)
    batches = list(mmloader.loader(stream, num_workers=0))
    assert batches == [[f"s{i:05d}" for i in range(j, j + 4)] for j in (0, 4, 8)]
    assert sizes == [4, 4, 4]  # one store read per batch, not one per sample
    for batch in seen:  # the rows are what a sample read alone gives
        for row in batch:
            alone = ds[int(row["__key__"][1:])]
            assert row.keys() == alone.keys() and row["caption"] == alone["caption"]
            assert torch.equal(row["image"], alone["image"])


def test_a_sample_alone_and_a_torch_dataloader_take_the_same_path(tmp_path):
    path = write_dataset(tmp_path / "ds.lmdb", 10, "lmdb")
    ds = mmloader.zip(caption=mmloader.TextReader(path), label=mmloader.LabelReader(path))
    sizes = _counting(ds)
    assert ds[3] == {"caption": "caption number 3 é", "label": 3, "__key__": "s00003"}
    batches = list(torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=list))
    assert [s["__key__"] for b in batches for s in b] == [f"s{i:05d}" for i in range(10)]
    assert sizes == [1, 5, 5]  # torch fetches through __getitems__: a batch per read


def test_a_bad_sample_falls_back_to_samples_and_is_named_or_skipped(tmp_path):
    path = tmp_path / "ds.lmdb"
    with mmloader.writer_for(path) as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "txt": f"t{i}", "cls": 3 if i != 5 else b"not a label"})
    ds = mmloader.zip(caption=mmloader.TextReader(path), label=mmloader.LabelReader(path))
    sizes = _counting(ds)
    stream = mmloader.Stream(ds, batch_size=4, shuffle=False, errors="skip")
    keys = [list(b["__key__"]) for b in mmloader.loader(stream, num_workers=0)]
    assert keys == [["k0", "k1", "k2", "k3"], ["k4", "k6", "k6", "k7"]]  # k5 replaced by the next planned
    assert sizes[:2] == [4, 4] and set(sizes[2:]) == {1}  # the batch, then its samples one by one
    strict = mmloader.Stream(ds, batch_size=4, shuffle=False)
    try:
        list(mmloader.loader(strict, num_workers=0))
    except mmloader.SampleError as e:
        assert e.key == "k5" and e.field == "cls" and "not an integer" in str(e)
    else:
        raise AssertionError("the bad sample k5 passed")
