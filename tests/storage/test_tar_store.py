"""The tar store (mmloader/storage/tar/store.py): offset tables mapped like np.load, a shard that
cannot be opened."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import write_dataset

import mmloader
from mmloader.errors import FormatError


@pytest.mark.parametrize(
    "array",
    [
        np.arange(60, dtype=np.int64).reshape(15, 2, 2),
        np.zeros((0, 3, 2), dtype=np.int64),
        np.arange(24, dtype=np.int64).reshape(4, 3, 2) * -1,
        np.arange(12, dtype=np.int32).reshape(3, 2, 2),  # other headers: np.load
        np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 2, 2)),
    ],
)
def test_offset_tables_map_like_np_load(tmp_path, array):
    from mmloader.storage.tar.store import map_offsets

    path = tmp_path / "t.idx.npy"
    np.save(path, array)
    got = map_offsets(str(path))
    assert got.shape == array.shape and np.array_equal(got, array) and not got.flags.writeable


def test_a_shard_that_cannot_be_opened_is_a_format_error_naming_it(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = write_dataset(tmp_path / "s", 8, "tar", shard_size=4)
    os.chmod(next(path.glob("*.tar")), 0)
    with pytest.raises(FormatError, match=r"data-000000\.tar .*cannot be opened: Permission denied"):
        mmloader.open(path)[0]
