"""The registry of reader kinds (mmloader/readers/registry.py), as reader_for reads it."""

from __future__ import annotations

import pytest

import mmloader
from mmloader.errors import UnsafeFieldError


def test_reader_for_refuses_pickle_fields(lmdb_ds):
    with pytest.raises(UnsafeFieldError, match="pyd"):
        mmloader.reader_for(lmdb_ds, "pyd")
    assert isinstance(mmloader.reader_for(lmdb_ds, "jpg"), mmloader.ImageReader)
