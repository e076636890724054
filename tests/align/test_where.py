"""Filter expressions (mmloader.align.where) against a plain-Python reference of the documented
rule: SQL's three-valued logic for missing values, values of different kinds never equal and
never ordered. Random expressions over random documents with missing and null values, nested
fields, ints beside floats, strings, booleans and lists."""

from __future__ import annotations

import json
import operator
import random

import numpy as np
import pytest

import mmloader
from mmloader.align.select import _as_column, _dig
from mmloader.align.where import Expression

FIELDS = ["a", "b", "f", "n.x", "n.y"]
ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
EQUAL = {"==": operator.eq, "!=": operator.ne}
MISSING = object()  # a field absent from the document (null is None)


def _random_value(rng: random.Random, field: str):
    """Each field mostly of one kind, sometimes another, sometimes absent or null."""
    roll = rng.random()
    if roll < 0.15:
        return MISSING
    if roll < 0.25:
        return None
    if roll < 0.32:  # a value of another kind than the field's usual one
        return rng.choice(["7", 7, 2.5, True, [1, 2], "x"])
    if field == "a":
        return rng.choice([rng.randint(-3, 3), float(rng.randint(-3, 3)), rng.randint(-3, 3) + 0.5])
    if field == "b":
        return rng.choice(["x", "y", "z", "", "X"])
    if field == "f":
        return rng.choice([True, False])
    return rng.randint(0, 4) if rng.random() < 0.5 else rng.randint(0, 4) * 1.0


def _random_doc(rng: random.Random) -> dict:
    doc: dict = {}
    nested: dict = {}
    for field in FIELDS:
        v = _random_value(rng, field)
        if v is MISSING:
            continue
        if field.startswith("n."):
            nested[field[2:]] = v
        else:
            doc[field] = v
    roll = rng.random()
    if roll < 0.8:
        doc["n"] = nested
    elif roll < 0.9:
        doc["n"] = None  # the parent null: its fields are missing
    elif roll < 0.95:
        doc["n"] = 3  # the parent not an object: its fields are missing
    return doc


def _constant(rng: random.Random):
    return rng.choice([-1, 0, 1, 2, 2.0, 2.5, 3, "x", "y", "", "7", True, False])


def _literal(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _random_expression(rng: random.Random, depth: int = 0) -> tuple[str, tuple]:
    """(text, tree) where tree is evaluated by the reference below, independently of the parser."""
    roll = rng.random()
    if depth < 3 and roll < 0.3:
        op = rng.choice(["and", "or"])
        parts = [_random_expression(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return "(" + f" {op} ".join(t for t, _ in parts) + ")", (op, [tree for _, tree in parts])
    if depth < 3 and roll < 0.4:
        text, tree = _random_expression(rng, depth + 1)
        return f"(not {text})", ("not", tree)
    field = rng.choice(FIELDS)
    kind = rng.random()
    if kind < 0.45:
        op = rng.choice([*ORDER, *EQUAL])
        c = _constant(rng)
        if rng.random() < 0.5:
            return f"(m.{field} {op} {_literal(c)})", ("cmp", op, ("field", field), ("const", c))
        return f"({_literal(c)} {op} m.{field})", ("cmp", op, ("const", c), ("field", field))
    if kind < 0.6:
        op = rng.choice([*ORDER, *EQUAL])
        other = rng.choice(FIELDS)
        return f"(m.{field} {op} m.{other})", ("cmp", op, ("field", field), ("field", other))
    if kind < 0.7:  # a chain: 0 < a <= 2
        lo, hi = rng.choice([-1, 0, 0.5, 1]), rng.choice([1, 2, 2.5, 3])
        op1, op2 = rng.choice(["<", "<="]), rng.choice(["<", "<="])
        return (
            f"({lo} {op1} m.{field} {op2} {hi})",
            ("and", [("cmp", op1, ("const", lo), ("field", field)), ("cmp", op2, ("field", field), ("const", hi))]),
        )
    if kind < 0.88:
        values = [_constant(rng) for _ in range(rng.randint(1, 3))] + ([None] if rng.random() < 0.3 else [])
        op = rng.choice(["in", "not in"])
        return f"(m.{field} {op} [{', '.join(_literal(v) for v in values)}])", (op, field, values)
    op = rng.choice(["==", "!="])
    return f"(m.{field} {op} None)", ("presence", op, field)


def _get(doc: dict, field: str):
    value = doc
    for part in field.split("."):
        value = value.get(part) if type(value) is dict else None
    return value


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return "str" if isinstance(v, str) else "other"


def _reference(tree: tuple, doc: dict):
    """True, False or None (unknown), one sample at a time, as the docs state the rule."""
    what = tree[0]
    if what in ("and", "or"):
        values = [_reference(t, doc) for t in tree[1]]
        if what == "and":
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if what == "not":
        v = _reference(tree[1], doc)
        return None if v is None else not v
    if what == "presence":
        present = _get(doc, tree[2]) is not None
        return present if tree[1] == "!=" else not present
    if what in ("in", "not in"):
        v = _get(doc, tree[1])
        if v is None:
            hit = True if None in tree[2] else None
        else:
            hit = any(c is not None and _kind(c) == _kind(v) and c == v for c in tree[2])
        if what == "in" or hit is None:
            return hit
        return not hit
    _, op, left, right = tree
    a = _get(doc, left[1]) if left[0] == "field" else left[1]
    b = _get(doc, right[1]) if right[0] == "field" else right[1]
    if a is None or b is None:
        return None
    if _kind(a) != _kind(b):
        return None if op in ORDER else op == "!="
    if op in ORDER and _kind(a) == "other":
        return None  # lists and objects have no order
    fn = {**ORDER, **EQUAL}[op]
    try:
        return bool(fn(a, b))
    except TypeError:
        return None


def _columns(docs: list[dict], expression: Expression) -> dict:
    """The columns as mmloader.select builds them from parsed json documents."""
    return {name: _as_column(_dig(docs, name.split(".")[1:])) for name in expression.names}


@pytest.mark.parametrize("seed", range(4))
def test_random_expressions_match_the_three_valued_reference(seed):
    rng = random.Random(seed)
    checked = 0
    for _ in range(20):  # data sets: 20 per seed
        docs = [_random_doc(rng) for _ in range(rng.randint(1, 60))]
        if seed % 2:  # number-only fields (float columns, the C path) as well as mixed ones
            for d in docs:
                for k in ("a", "b", "f"):
                    if k in d and _kind(d[k]) != "number":
                        d[k] = rng.randint(0, 3)
        for _ in range(50):
            text, tree = _random_expression(rng)
            e = Expression(text)
            got = e.evaluate(_columns(docs, e))
            want = [_reference(tree, d) is True for d in docs]
            assert got.tolist() == want, (text, [(d, w) for d, w, g in zip(docs, want, got) if w != g][:3])
            checked += 1
    assert checked == 1000


def test_not_equal_and_not_in_keep_only_samples_with_the_field(tmp_path):
    """The issue's case: scores 0.1, 0.5, absent, null."""
    docs = [{"score": 0.1}, {"score": 0.5}, {}, {"score": None}]
    with mmloader.LMDBWriter(tmp_path / "s.lmdb") as w:
        for i, d in enumerate(docs):
            w.write({"__key__": f"k{i}", "json": json.dumps(d).encode()})
    ds = mmloader.zip(meta=mmloader.JSONReader(str(tmp_path / "s.lmdb")))
    keys = lambda expr: list(mmloader.select(ds, expr, cache_dir=False).keys)  # noqa: E731
    assert keys("meta.score != 0.5") == ["k0"]
    assert keys("meta.score not in [0.5]") == ["k0"]
    assert keys("not meta.score == 0.5") == ["k0"]  # not unknown is unknown
    assert keys("meta.score != 0.5 or meta.score == None") == ["k0", "k2", "k3"]
    assert keys("meta.score not in [0.5, None]") == ["k0"]
    assert keys("meta.score in [0.5, None]") == ["k1", "k2", "k3"]
    assert keys("meta.score == None") == ["k2", "k3"] and keys("meta.score != None") == ["k0", "k1"]


def test_select_on_a_store_agrees_with_the_reference(tmp_path):
    """End to end: random documents in LMDB, random filters through mmloader.select."""
    rng = random.Random(7)
    docs = [_random_doc(rng) for _ in range(300)]
    with mmloader.LMDBWriter(tmp_path / "r.lmdb") as w:
        for i, d in enumerate(docs):
            w.write({"__key__": f"r{i:04d}", "json": json.dumps(d).encode()})
    ds = mmloader.zip(m=mmloader.JSONReader(str(tmp_path / "r.lmdb")))
    compared = 0
    while compared < 40:
        text, tree = _random_expression(rng)
        want = [f"r{i:04d}" for i, d in enumerate(docs) if _reference(tree, d) is True]
        if not want:
            with pytest.raises(ValueError, match="keeps no sample"):
                mmloader.select(ds, text, cache_dir=False, progress=False)
        else:
            assert list(mmloader.select(ds, text, cache_dir=False, progress=False).keys) == want, text
        compared += 1


def test_a_cached_selection_of_an_older_rule_is_not_reused(tmp_path, monkeypatch):
    """The cache key names the rule's version: a result computed under another is not read back."""
    import mmloader.align.select as select_module

    with mmloader.LMDBWriter(tmp_path / "c.lmdb") as w:
        for i, d in enumerate([{"s": 1}, {}, {"s": 2}]):
            w.write({"__key__": f"c{i}", "json": json.dumps(d).encode()})
    ds = mmloader.zip(m=mmloader.JSONReader(str(tmp_path / "c.lmdb")))
    first = select_module._cache_file(ds, "m.s != 1", tmp_path / "cache")
    monkeypatch.setattr(select_module, "SEMANTICS", "another-rule")
    assert select_module._cache_file(ds, "m.s != 1", tmp_path / "cache") != first


@pytest.mark.parametrize(
    "text, why",
    [
        ("a < None", "None only takes"),
        ("a == [1, 2]", "a list goes only after 'in'"),
        ("[1] == a", "a list goes only after 'in'"),
        ("a in [b]", "a list holds numbers"),
        ("a == b'x'", "not a name, number or string"),
        ("a == -'x'", "not a name, number or string"),
        ("1 in [1] and a == 1", "'in' takes a name on its left"),
        ("a < 3 in [1]", "'in' takes a name on its left"),
        ("a in [1] in [2]", "'in' takes a list|'in' takes a name"),
    ],
)
def test_expressions_that_mean_nothing_are_refused_by_name(text, why):
    with pytest.raises(ValueError, match=why):
        Expression(text)


def test_number_columns_and_object_columns_answer_alike():
    """The same values as a float column (C) and as an object column (row by row)."""
    values = [1, 2.5, None, 3, None, 0]
    floats = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    objects = np.empty(len(values), dtype=object)
    objects[:] = values
    for text in ["a != 1", "not a > 1", "a in [0, 3]", "a not in [0, None]", "2 <= a < 4", "a == None", "a != 'x'"]:
        e = Expression(text)
        assert e.evaluate({"a": floats}).tolist() == e.evaluate({"a": objects}).tolist(), text


def test_nan_labels_beyond_float_and_lists_follow_the_rule(tmp_path):
    """JSON NaN is missing whatever else its chunk holds; labels beyond 2**53 compare exactly;
    lists are never ordered, also against another field."""
    docs = [{"x": float("nan")}, {"x": "s"}, {"x": float("nan"), "a": [1, 2], "b": [1, 3]}]
    with mmloader.LMDBWriter(tmp_path / "n.lmdb") as w:
        for i, d in enumerate(docs):
            w.write({"__key__": f"k{i}", "json": json.dumps(d).encode(), "cls": str(2**53 + 1 + i).encode()})
    ds = mmloader.zip(
        m=mmloader.JSONReader(str(tmp_path / "n.lmdb")), label=mmloader.LabelReader(str(tmp_path / "n.lmdb"))
    )
    keys = lambda expr: list(mmloader.select(ds, expr, cache_dir=False).keys)  # noqa: E731
    assert keys("m.x == None") == ["k0", "k2"]
    assert keys(f"label == {2**53 + 1}") == ["k0"] and keys(f"label > {2**53 + 1}") == ["k1", "k2"]
    with pytest.raises(ValueError, match="keeps no sample"):
        keys("m.a < m.b")


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_the_size_of_an_absent_value_is_missing_not_zero(tmp_path, fmt):
    path = tmp_path / f"b.{fmt}"
    with mmloader.writer_for(path, fmt, **({"shard_size": 2} if fmt == "tar" else {})) as w:
        w.write({"__key__": "k0", "txt": "a", "bin": b"xyz"})
        w.write({"__key__": "k1", "txt": "b"})  # no bin
        w.write({"__key__": "k2", "txt": "c", "bin": b""})  # an empty bin: 0 bytes, present
    ds = mmloader.zip(t=mmloader.TextReader(str(path)), b=mmloader.Reader(str(path), "bin", optional=True))
    keys = lambda expr: list(mmloader.select(ds, expr, cache_dir=False).keys)  # noqa: E731
    assert keys("b.bytes < 10") == ["k0", "k2"] and keys("b.bytes == None") == ["k1"]
