"""Sample-key and field-name rules (mmloader/storage/keys.py) on both formats."""

from __future__ import annotations

import pytest
import webdataset as wds
from conftest import _tar_with

import mmloader
from mmloader.errors import DuplicateKeyError, KeyValidationError


@pytest.mark.parametrize("key", ["", "/abs/x", "a/../b", "a.b", "dir/x.y", "a//b", "tab\tkey"])
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_bad_keys_rejected(tmp_path, key, fmt):
    w = mmloader.writer_for(tmp_path / ("x.lmdb" if fmt == "lmdb" else "x"), fmt)
    with pytest.raises(KeyValidationError) as e:
        w.write({"__key__": key, "txt": "x"})
    assert repr(key)[1:-1][:5] in str(e.value) or key == ""
    w.abort()


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_duplicate_key_rejected(tmp_path, fmt):
    w = mmloader.writer_for(tmp_path / ("x.lmdb" if fmt == "lmdb" else "x"), fmt)
    w.write({"__key__": "same", "txt": "1"})
    with pytest.raises(DuplicateKeyError, match="'same'"):
        w.write({"__key__": "same", "txt": "2"})
        w.close()
    w.abort()


def test_field_names_are_lower_case_as_webdataset_reads_them(tmp_path):
    """keys.split_member_name follows WebDataset, which lower-cases extensions when it reads."""
    src = tmp_path / "foreign" / "a.tar"
    _tar_with(src, [("x.JPG", b"jpeg-bytes"), ("x.Txt", b"caption"), ("y.jpg", b"j2"), ("y.txt", b"c2")])
    wds_fields = [sorted(k for k in s if not k.startswith("__")) for s in wds.WebDataset(str(src), shardshuffle=False)]
    assert wds_fields == [["jpg", "txt"], ["jpg", "txt"]]
    mmloader.build_index(src.parent, progress=False)
    store = mmloader.open(src.parent)
    assert store.fields == ["jpg", "txt"] and store.read(0) == {
        "__key__": "x",
        "__index__": 0,
        "jpg": b"jpeg-bytes",
        "txt": b"caption",
    }
    with pytest.raises(KeyValidationError, match="upper-case.*use 'jpg'"):
        with mmloader.writer_for(tmp_path / "out", "tar") as w:
            w.write({"__key__": "k", "JPG": b"x"})
