"""The Reader base class (mmloader/readers/base.py): a new modality without editing mmloader,
stores opened lazily, and ``decode`` (overridden, assigned) used on every path, views only for
built-in decoders."""

from __future__ import annotations

import pickle

import numpy as np
import torch
from conftest import jpeg_bytes, write_dataset

import mmloader


def test_custom_modality_without_editing_mmloader(any_ds):
    class LengthReader(mmloader.Reader):
        default_field = "txt"

        def decode(self, data, key):
            return len(data)

    assert LengthReader(any_ds)[0] == len("caption number 0 é".encode())
    assert mmloader.Reader(any_ds, "cls", decode=lambda b: int(b) * 10)[3] == 30


def test_readers_open_nothing_until_read(tmp_path):
    path = write_dataset(tmp_path / "lazy.lmdb", 3, "lmdb")
    from mmloader.storage.lmdb import store as lmdb_store

    before = set(lmdb_store._ENVS)
    reader = mmloader.ImageReader(path)
    assert set(lmdb_store._ENVS) == before
    reader[0]
    assert str(path.resolve()) in lmdb_store._ENVS
    # pickling after the environment is open carries no handle, and works
    clone = pickle.loads(pickle.dumps(reader))
    assert torch.equal(clone[1], reader[1])


def test_one_environment_per_path_shared_by_readers(lmdb_ds):
    a, b = mmloader.ImageReader(lmdb_ds), mmloader.TextReader(str(lmdb_ds))
    a[0], b[0]
    assert a.store._env is b.store._env


def test_subclassed_readers_get_bytes_in_batches(any_ds):
    """Zero-copy views go only to built-in decoders: a subclass may call bytes methods."""

    class Upper(mmloader.TextReader):
        def decode(self, data, key):
            assert isinstance(data, bytes)
            return data.decode("utf-8").upper()

    ds = mmloader.zip(
        image=mmloader.ImageReader(any_ds, output="raw"), caption=Upper(any_ds), plain=mmloader.TextReader(any_ds)
    )
    # get_batch itself, not a Stream: a Stream would hide a failure by retrying sample by sample
    from mmloader.align.collate import collate_columns

    batch = collate_columns(ds.get_batch(list(range(6))))
    assert batch["caption"] == [c.upper() for c in batch["plain"]]
    assert batch["plain"][0] == "caption number 0 é"
    store = mmloader.open(any_ds)
    assert [bytes(t.numpy()) for t in mmloader.unpack(batch, "image")] == [
        store.get(k)["jpg"] for k in batch["__key__"]
    ]


def test_reader_subclass_overriding_decode_is_used_for_whole_batches(tmp_path):
    """A subclass's decode() was bypassed by the batch fast paths of ImageReader (raw packing,
    decoding into the batch tensor) and ArrayReader: batches differed from reader[i]."""
    path = tmp_path / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "jpg": jpeg_bytes(i, (16, 12)), "npy": np.arange(3, dtype=np.int64) + i})

    class RawLength(mmloader.ImageReader):
        def decode(self, data, key):
            return torch.tensor([len(data)])

    class Blank(mmloader.ImageReader):
        def decode(self, data, key):
            return torch.zeros(1, 2, 2, dtype=torch.uint8)

    class Doubled(mmloader.ArrayReader):
        def decode(self, data, key):
            return super().decode(data, key) * 2

    for reader in (RawLength(path, output="raw"), Blank(path), Doubled(path)):
        batch = next(
            iter(
                mmloader.loader(
                    mmloader.Stream(mmloader.zip(x=reader), batch_size=6, shuffle=False), 1, backend="thread"
                )
            )
        )
        assert "x" not in batch.get("__offsets__", {})
        assert torch.equal(batch["x"], torch.stack([reader[i] for i in range(6)])), type(reader).__name__


def test_a_decode_assigned_on_a_reader_is_used_for_whole_batches(tmp_path):
    """decode replaced on one reader (not a subclass) was used by reader[i] but skipped by batches."""
    path = write_dataset(tmp_path / "d.lmdb", 4, "lmdb")
    reader = mmloader.TextReader(path)
    reader.decode = lambda data, key: bytes(data).decode().upper()
    stream = mmloader.Stream(mmloader.zip(t=reader), batch_size=4, shuffle=False)
    assert stream.python_work() == ["a decode assigned on the reader for 't'"]
    batch = next(iter(mmloader.loader(stream, 1, backend="thread")))
    assert batch["t"] == [reader[i] for i in range(4)] and batch["t"][0].isupper()
