"""mmloader.select: filters on stored metadata (json fields, labels, image sizes, byte sizes), keys,
fraction and limit; cached; through both backends, a config, mixes and resume."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import jpeg_bytes

import mmloader
from mmloader.align.where import Expression

N = 60


def _meta(i: int) -> dict:
    return {"score": round(i / N, 4), "lang": "en" if i % 3 else "de", "nested": {"ok": i % 2 == 0}, "width": 1}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("select") / "d.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(N):
            w.write(
                {
                    "__key__": f"k{i:03d}",
                    "jpg": jpeg_bytes(i, size=(16 + 8 * (i % 4), 16)),
                    "json": _meta(i),
                    "cls": i % 5,
                    "txt": "x" * (i % 10),
                }
            )
    return path


def _ds(path, **readers):
    p = str(path)
    return mmloader.zip(
        image=mmloader.ImageReader(p, size=(16, 16)),
        meta=mmloader.JSONReader(p),
        label=mmloader.LabelReader(p),
        caption=mmloader.TextReader(p),
        **readers,
    )


def _expected(pred) -> list[str]:
    return [f"k{i:03d}" for i in range(N) if pred(i)]


CASES = {
    "meta.score >= 0.5": lambda i: _meta(i)["score"] >= 0.5,
    "score < 0.25 or lang == 'de'": lambda i: _meta(i)["score"] < 0.25 or i % 3 == 0,
    "label in [1, 3]": lambda i: i % 5 in (1, 3),
    "image.width >= 32": lambda i: 16 + 8 * (i % 4) >= 32,
    "image.width == 16 and not (label == 0)": lambda i: i % 4 == 0 and i % 5 != 0,
    "meta.nested.ok == True and caption.bytes > 4": lambda i: i % 2 == 0 and i % 10 > 4,
    "lang not in ['en']": lambda i: i % 3 == 0,
}


@pytest.mark.parametrize("expr", CASES)
def test_filter_keeps_exactly_the_samples_that_pass(path, expr, tmp_path):
    sel = mmloader.select(_ds(path), expr, cache_dir=tmp_path)
    assert list(sel.keys) == _expected(CASES[expr])
    assert sel.report["select"] == {"samples": N, "where": len(_expected(CASES[expr]))}
    assert [s["__key__"] for s in sel] == _expected(CASES[expr])  # samples read through the selection


def test_filter_reads_no_image_pixels(path, tmp_path, monkeypatch):
    from mmloader.readers import image as image_module

    def forbidden(*a, **k):
        raise AssertionError("an image was decoded while filtering")

    monkeypatch.setattr(image_module.ImageReader, "decode", forbidden)
    assert len(mmloader.select(_ds(path), "image.height == 16", cache_dir=tmp_path)) == N


@pytest.mark.process
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_selection_streams_every_selected_sample_once_on_both_backends(path, backend, tmp_path):
    sel = mmloader.select(_ds(path), "meta.score >= 0.3 and label != 2 and image.width >= 24", cache_dir=tmp_path)
    want = _expected(lambda i: _meta(i)["score"] >= 0.3 and i % 5 != 2 and 16 + 8 * (i % 4) >= 24)
    stream = mmloader.Stream(sel, batch_size=4, seed=1)
    loader = mmloader.loader(stream, num_workers=2, backend=backend)
    for _epoch in range(2):
        keys = [k for b in loader for k in b["__key__"]]
        pads = len(keys) - len(want)
        assert sorted(set(keys)) == want and 0 <= pads < 4
        assert all(k in want for k in keys)


def test_a_bare_name_means_the_one_modality_that_has_it(path, tmp_path):
    p = str(path)
    no_json = mmloader.zip(image=mmloader.ImageReader(p), label=mmloader.LabelReader(p))
    assert list(mmloader.select(no_json, "width >= 32 and label == 1", cache_dir=False).keys) == _expected(
        lambda i: 16 + 8 * (i % 4) >= 32 and i % 5 == 1
    )
    assert len(mmloader.select(_ds(path), "lang == 'de'", cache_dir=False)) == 20  # the json's field


def test_keys_fraction_limit_and_stacking(path, tmp_path):
    ds = _ds(path)
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("k005\nk001\n\nk040\n")
    assert list(mmloader.select(ds, keys=keys_file).keys) == ["k001", "k005", "k040"]
    half = mmloader.select(ds, fraction=0.5, seed=3)
    assert len(half) == N // 2 and list(half.keys) == sorted(half.keys)
    assert list(mmloader.select(ds, fraction=0.5, seed=3).keys) == list(half.keys)  # deterministic
    assert list(mmloader.select(ds, fraction=0.5, seed=4).keys) != list(half.keys)
    first = mmloader.select(ds, "label == 1", limit=3, cache_dir=tmp_path)
    assert list(first.keys) == ["k001", "k006", "k011"]
    stacked = mmloader.select(
        mmloader.select(ds, "label == 1", cache_dir=tmp_path), "meta.score > 0.5", cache_dir=tmp_path
    )
    assert list(stacked.keys) == _expected(lambda i: i % 5 == 1 and _meta(i)["score"] > 0.5)
    assert len(stacked.selection["steps"]) == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"where": "nope > 1"}, "no sample .* has a value for \\['nope'\\].*misspelt"),
        ({"where": "width > 1"}, "'width' is ambiguous.*could be \\['image.width', 'meta.width'\\]"),
        ({"where": "caption.width > 1"}, "TextReader"),
        ({"where": "score >"}, "not an expression"),
        ({"where": "__import__('os').system('x') == 0"}, "not a name"),
        ({"where": "score > 2"}, "keeps no sample"),
        ({"keys": ["k001", "zzz"]}, "1 of 2 keys are not samples.*zzz"),
        ({"fraction": 0}, "fraction"),
        ({"limit": 0}, "limit"),
    ],
)
def test_bad_selections_say_what_is_wrong(path, kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        mmloader.select(_ds(path), cache_dir=tmp_path, **kwargs)


def test_a_bad_json_value_is_named_by_key(tmp_path):
    p = tmp_path / "bad.lmdb"
    with mmloader.LMDBWriter(p) as w:
        for i in range(5):
            w.write({"__key__": f"b{i}", "json": b"{nope" if i == 3 else b'{"a": 1}'})
    with pytest.raises(mmloader.DecodeError, match="b3"):
        mmloader.select(mmloader.zip(meta=mmloader.JSONReader(str(p))), "a == 1", cache_dir=False)


def test_filter_results_are_cached_by_filter_and_content(tmp_path, caplog):
    p = tmp_path / "c.lmdb"

    def write(scores):
        with mmloader.LMDBWriter(p, overwrite=True) if p.exists() else mmloader.LMDBWriter(p) as w:
            for i, s in enumerate(scores):
                w.write({"__key__": f"c{i}", "json": {"s": s}})

    cache = tmp_path / "cache"
    write([0.1, 0.9, 0.8, 0.2])
    ds = lambda: mmloader.zip(meta=mmloader.JSONReader(str(p)))  # noqa: E731
    assert list(mmloader.select(ds(), "s > 0.5", cache_dir=cache).keys) == ["c1", "c2"]
    files = list((cache / "selections").glob("*.npy"))
    assert len(files) == 1
    with caplog.at_level(logging.INFO, logger="mmloader"):
        assert list(mmloader.select(ds(), "s > 0.5", cache_dir=cache).keys) == ["c1", "c2"]
    assert "read from the cache" in caplog.text
    mmloader.select(ds(), "s > 0.1", cache_dir=cache)  # another filter, another entry
    assert len(list((cache / "selections").glob("*.npy"))) == 2
    write([0.9, 0.1, 0.1, 0.9])  # same keys, other content: not the cached answer
    assert list(mmloader.select(ds(), "s > 0.5", cache_dir=cache).keys) == ["c0", "c3"]
    files[0].write_bytes(b"garbage")  # a damaged entry is computed again
    assert len(mmloader.select(ds(), "s > 0.5", cache_dir=cache)) == 2


def test_config_filter_limit_keys_per_source(path, tmp_path):
    cfg = {
        "batch_size": 4,
        "sources": {
            "good": {
                "path": str(path),
                "filter": "meta.score >= 0.5",
                "modalities": {"caption": {"field": "txt"}, "meta": {"field": "json"}},
            },
            "few": {
                "path": str(path),
                "limit": 5,
                "keys": ["k001", "k002", "k003"],
                "modalities": {"caption": {"field": "txt"}},
            },
        },
        "mix": {"mode": "repeat"},
    }
    stream = mmloader.from_config(cfg)
    sizes = {r["name"]: r["size"] for r in stream.mix.summary()}
    assert sizes == {"good": len(_expected(lambda i: _meta(i)["score"] >= 0.5)), "few": 3}
    keys = [k for b in mmloader.loader(stream, num_workers=0) for k in b["__key__"]]
    assert set(keys) == set(_expected(lambda i: _meta(i)["score"] >= 0.5)) | {"k001", "k002", "k003"}
    with pytest.raises(mmloader.ConfigError, match="sources.good: filter 'meta.nope >= 1'"):
        mmloader.from_config({**cfg, "sources": {"good": {**cfg["sources"]["good"], "filter": "meta.nope >= 1"}}})


def test_expression_evaluates_column_wise_with_missing_values():
    e = Expression("a >= 1 and b != 'x'")
    cols = {"a": np.array([1.0, np.nan, 2.0]), "b": np.array(["y", "y", None], dtype=object)}
    assert e.evaluate(cols).tolist() == [True, False, False]  # a missing b is unknown, not 'not x'
    assert Expression("b in ['y']").evaluate(cols).tolist() == [True, True, False]
    assert json.dumps(e.names) == '["a", "b"]'


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_field_values_match_read_many_with_absent_values(tmp_path, fmt):
    path = tmp_path / f"sparse.{fmt}"
    with mmloader.writer_for(path, fmt, **({"shard_size": 3} if fmt == "tar" else {})) as w:
        for i in range(10):
            w.write({"__key__": f"s{i}", "a": b"x" * i, **({"b": f"{i}".encode()} if i % 3 else {})})
    store = mmloader.open(path)
    for indices in ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [2, 3, 4], [9, 0, 5], [4], []):
        for field in ("a", "b"):
            want = store.read_many(indices, [field])[1][field]
            assert [None if v is None else bytes(v) for v in store.field_values(indices, field)] == [
                None if v is None else bytes(v) for v in want
            ]
    with pytest.raises(IndexError):
        store.field_values([8, 9, 10], "a")


@pytest.mark.process
def test_mmloader_inspect_counts_what_a_filter_keeps(path):
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmloader.cli",
            "inspect",
            str(path),
            "-n",
            "0",
            "--filter",
            "json.score >= 0.5 and jpg.width >= 24",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    kept = len(_expected(lambda i: _meta(i)["score"] >= 0.5 and 16 + 8 * (i % 4) >= 24))
    assert f"filter:  'json.score >= 0.5 and jpg.width >= 24' keeps {kept} of {N} samples" in out


def _json_store(path, docs, **extra):
    with mmloader.LMDBWriter(path) as w:
        for i, doc in enumerate(docs):
            w.write(
                {"__key__": f"j{i:04d}", "json": doc if isinstance(doc, bytes) else json.dumps(doc).encode(), **extra}
            )
    return mmloader.zip(m=mmloader.JSONReader(str(path)))


def test_values_compare_exactly_and_missing_values_consistently(tmp_path):
    big = 2**60
    ds = _json_store(tmp_path / "v.lmdb", [{"id": big + i, "q": i % 3, "s": "x" if i == 0 else None} for i in range(6)])
    keys = lambda expr: [int(k[1:]) for k in mmloader.select(ds, expr, cache_dir=False).keys]  # noqa: E731
    assert keys(f"m.id == {big + 3}") == [3] and keys(f"m.id > {big + 3}") == [4, 5]  # not rounded to float
    assert keys("m.q in [2]") == [2, 5] and keys("m.q == 2") == [2, 5]
    with pytest.raises(ValueError, match="keeps no sample"):
        keys("m.q in ['2']")  # a string is not the number 2
    with pytest.raises(ValueError, match="keeps no sample"):
        keys("m.q == True")
    assert keys("m.s == None") == [1, 2, 3, 4, 5] and keys("m.s != None") == [0]
    assert keys("m.s in ['x', None]") == list(range(6))
    # the same answers when the column holds only numbers and missing values
    nums = _json_store(tmp_path / "n.lmdb", [{"s": 1.5} if i == 0 else {} for i in range(6)])
    got = [int(k[1:]) for k in mmloader.select(nums, "m.s != None", cache_dir=False).keys]
    assert got == [0] and len(mmloader.select(nums, "m.s in [None]", cache_dir=False)) == 5
    with pytest.raises(ValueError, match="compares no field"):
        mmloader.select(ds, "1 < 2")


def test_corrupt_json_values_never_shift_their_neighbours(tmp_path):
    """Two corrupt values that would balance each other in one joined array parse."""
    docs = [b'{"s": 0.1}', b'{"s": 0.2}, {"s": 0.95}', b'{"s": 0.3}', b'{"s": 0.4', b'"t": 1}', b'{"s": 0.99}']
    with pytest.raises(mmloader.DecodeError, match="j0001"):
        mmloader.select(_json_store(tmp_path / "c.lmdb", docs), "m.s >= 0.9", cache_dir=False)


def test_the_cache_tells_apart_fields_readers_and_rewritten_files(tmp_path):
    p = tmp_path / "two.lmdb"
    with mmloader.LMDBWriter(p) as w:
        for i in range(10):
            w.write({"__key__": f"t{i}", "json": {"score": i / 10}, "alt.json": {"score": 1 - i / 10}})
    cache = tmp_path / "cache"
    first = mmloader.zip(m=mmloader.JSONReader(str(p)))
    other = mmloader.zip(m=mmloader.JSONReader(str(p), field="alt.json"))
    assert list(mmloader.select(first, "m.score >= 0.8", cache_dir=cache).keys) == ["t8", "t9"]
    assert list(mmloader.select(other, "m.score >= 0.8", cache_dir=cache).keys) == ["t0", "t1", "t2"]
    text = tmp_path / "lines.txt"
    text.write_text("".join("short\n" if i < 10 else "other line\n" for i in range(20)))
    lines = lambda: mmloader.zip(t=mmloader.TextLinesReader(str(text)))  # noqa: E731
    assert len(mmloader.select(lines(), "t == 'short'", cache_dir=cache)) == 10
    text.write_text("".join("short\n" if i < 3 else "other line\n" for i in range(20)))  # same line count
    assert len(mmloader.select(lines(), "t == 'short'", cache_dir=cache)) == 3


def test_filters_read_gz_fields_as_their_text_and_json(tmp_path):
    """A ``.gz`` field is filtered on what it holds, not on its compressed bytes."""
    import gzip

    path = tmp_path / "gz.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(10):
            meta = json.dumps({"score": i / 10}).encode()
            w.write(
                {
                    "__key__": f"k{i}",
                    **({"txt.gz": gzip.compress(f"item {i}".encode())} if i % 2 else {"txt": f"item {i}"}),
                    **({"json.gz": gzip.compress(meta)} if i % 3 else {"json": meta}),
                }
            )
    ds = mmloader.zip(caption=mmloader.TextReader(path, "txt;txt.gz"), meta=mmloader.JSONReader(path, "json;json.gz"))
    assert [s["__key__"] for s in mmloader.select(ds, "meta.score >= 0.5")] == [f"k{i}" for i in range(5, 10)]
    assert [s["caption"] for s in mmloader.select(ds, "caption in ['item 3', 'item 4']")] == ["item 3", "item 4"]


def test_a_size_filter_on_a_gz_field_reads_its_stored_bytes(tmp_path):
    """``.bytes`` is the stored size: an empty ``.gz`` value is empty, not a broken gzip stream."""
    import gzip

    path = tmp_path / "sizes.lmdb"
    with mmloader.LMDBWriter(path) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "txt.gz": b"" if i == 2 else gzip.compress(b"x" * i)})
    ds = mmloader.zip(caption=mmloader.TextReader(path, "txt.gz"))
    assert [s["__key__"] for s in mmloader.select(ds, "caption.bytes > 0", cache_dir=False)] == ["k0", "k1", "k3"]
