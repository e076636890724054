"""The Store interface (mmloader/storage/base.py) on both formats: round trips of every field
type, reads in DataLoader workers, pickles without handles, views equal to copies."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from conftest import make_samples

import mmloader
from mmloader.storage.encoding import encode_value


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_round_trip_every_field_type(tmp_path, fmt):
    path = tmp_path / ("ds.lmdb" if fmt == "lmdb" else "ds")
    samples = list(make_samples(11))
    samples[3]["bin"] = bytes(range(256))  # a field only one sample has
    with mmloader.writer_for(path, fmt, shard_size=4, metadata={"classes": ["x", "y"]}) as w:
        for s in samples:
            w.write(s)
    ds = mmloader.open(path)
    assert len(ds) == 11 and set(ds.fields) == {"jpg", "txt", "cls", "json", "npy", "bin"}
    assert ds.metadata["metadata"] == {"classes": ["x", "y"]}
    assert ds.metadata["field_counts"]["bin"] == 1
    for i, s in enumerate(samples):
        rec = ds[i]
        assert rec["__key__"] == s["__key__"]
        for f, v in s.items():
            if not f.startswith("__"):
                assert rec[f] == encode_value(f, v), (i, f)
        assert ds.get(s["__key__"])["__index__"] == i
        assert ds.keys[i] == s["__key__"]
    assert ds[-1]["__key__"] == samples[-1]["__key__"]
    assert "s00003" in ds.keys and "nope" not in ds.keys
    assert ds.read(2, ["txt"]).keys() == {"__key__", "__index__", "txt"}
    with pytest.raises(IndexError):
        ds[11]
    with pytest.raises(KeyError, match="nope"):
        ds.get("nope")
    with pytest.raises(KeyError, match="no field 'zzz'"):
        ds.read(0, ["zzz"])


def _worker_read(args):
    ds, i = args
    return ds[i]["__key__"], os.getpid()


class _Keys(torch.utils.data.Dataset):
    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        return self.store[i]["__key__"], self.store[i]["txt"].decode()


@pytest.mark.process
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_reads_in_dataloader_workers(any_ds, method):
    store = mmloader.open(any_ds)
    store[0]  # open in the parent first: children must not reuse its handles
    dl = torch.utils.data.DataLoader(_Keys(store), batch_size=None, num_workers=2, multiprocessing_context=method)
    got = list(dl)
    assert [k for k, _ in got] == [store.key(i) for i in range(len(store))]
    assert got[7][1] == "caption number 7 é"


def test_pickles_without_handles(any_ds):
    store = mmloader.open(any_ds)
    store[3]
    clone = pickle.loads(pickle.dumps(store))
    assert clone[3] == store[3]
    assert len(pickle.dumps(store)) < 20_000


def test_read_many_views_equal_copies(any_ds):
    store = mmloader.open(any_ds)
    indices = [22, 0, 7, 7, 13, 5, 19]
    keys, copies = store.read_many(indices, store.fields)
    vkeys, views = store.read_many(indices, store.fields, views=True)
    assert vkeys == keys == [store.key(i) for i in indices]
    for f in store.fields:
        assert all(isinstance(v, bytes) for v in copies[f] if v is not None)
        assert [None if v is None else bytes(v) for v in views[f]] == copies[f]
        assert copies[f] == [store.read(i, [f]).get(f) for i in indices]
