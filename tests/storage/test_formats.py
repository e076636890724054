"""The format registry (mmloader/storage/formats.py) and what mmloader.open says of a path it
does not open."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import write_dataset

import mmloader
from mmloader.errors import FormatError


def test_not_a_dataset(tmp_path):
    import lmdb

    env = lmdb.open(str(tmp_path / "plain"), max_dbs=2)
    with env.begin(write=True) as t:
        t.put(b"k", b"v")
    env.close()
    with pytest.raises(FormatError, match="not an mmloader dataset"):
        len(mmloader.open(tmp_path / "plain"))
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "a.tar").write_bytes(b"")
    with pytest.raises(FormatError, match="mmloader index"):
        mmloader.open(tmp_path / "tars")


@pytest.mark.process
def test_vocabulary_leftovers(tmp_path):
    """Review findings: the .lmdb rule ignores case, submodules are attributes, jfif is jpg."""
    from mmloader.media.imageinfo import canonical_extension

    with mmloader.writer_for(tmp_path / "UPPER.LMDB") as w:
        w.write({"__key__": "k", "txt": "x"})
    assert mmloader.open(tmp_path / "UPPER.LMDB").format == "lmdb"
    done = subprocess.run(
        [sys.executable, "-c", "import mmloader; print(mmloader.loading.config.is_config_path('a.yaml'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "True"
    assert canonical_extension("JFIF") == "jpg"


def test_the_format_registry_opens_and_writes_what_it_names(tmp_path):
    """One registry: open_store, configs, inspect and writer_for all read it."""
    from mmloader.storage import FORMATS, formats, recognise
    from mmloader.storage.formats import writable

    assert writable() == FORMATS == ("lmdb", "tar")
    write_dataset(tmp_path / "a.lmdb", 3, "lmdb")
    write_dataset(tmp_path / "shards", 3, "tar")
    (tmp_path / "lines.txt").write_text("one\ntwo\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"txt": ["x", "y"]}), tmp_path / "t.parquet")
    for name, path, count in (
        ("lmdb", "a.lmdb", 3),
        ("tar", "shards", 3),
        ("text", "lines.txt", 2),
        ("arrow", "t.parquet", 2),
    ):
        fmt = recognise(tmp_path / path)
        assert fmt is not None and fmt.name == name, (path, fmt)
        assert len(mmloader.open(tmp_path / path)) == count
    (tmp_path / "plain").mkdir()
    with pytest.raises(FormatError) as e:
        mmloader.open(tmp_path / "plain")
    assert all(fmt.what in str(e.value) for fmt in formats().values()), str(e.value)


def test_options_a_format_does_not_take_are_named_with_the_path(tmp_path):
    write_dataset(tmp_path / "a.lmdb", 2, "lmdb")
    write_dataset(tmp_path / "shards", 2, "tar")
    with pytest.raises(TypeError, match=r"a.lmdb: options \['bogus'\] do not apply to this dataset \(it takes none\)"):
        mmloader.open(tmp_path / "a.lmdb", bogus=1)
    with pytest.raises(TypeError, match=r"shards: options \['bogus'\] .*it takes: check_headers, verify_checksums"):
        mmloader.open(tmp_path / "shards", bogus=1)
    (tmp_path / "meta.json").write_text("{}")  # a JSON file that is no shard index: not taken for one
    with pytest.raises(FormatError, match="meta.json is not a dataset mmloader opens"):
        mmloader.open(tmp_path / "meta.json")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"txt": ["x"]}), tmp_path / "ONE.PARQUET")
    assert len(mmloader.open(tmp_path / "ONE.PARQUET")) == 1
