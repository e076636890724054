"""Filter expressions over per-sample metadata: ``"meta.clip_score >= 0.28 and image.width >= 256"``.

An expression is parsed once (Python syntax, a safe subset: comparisons, ``in`` / ``not in``
a list, ``and`` / ``or`` / ``not``, names with dotted fields, numbers, strings, ``True`` /
``False``, ``None``) and evaluated column-wise on numpy arrays, so a million samples take one
pass per column, not a Python call each. Nothing is ``eval``-ed. Which column a name reads is
the caller's business (:mod:`mmloader.align.select`).

Missing values follow SQL's three-valued logic, the rule users of SQL and pandas' nullable
types know: a comparison with a missing value (the field absent, or JSON ``null``) is
*unknown*; ``not`` unknown is unknown; ``and`` is false when any side is false, ``or`` true
when any side is true, unknown otherwise; a sample passes only when the whole expression is
true. So ``score != 0.5`` and ``score not in [0.5]`` keep only samples that have a score.
``x == None`` / ``x != None`` test presence, and ``None`` in a list matches a missing value
(``x in [1, None]``: 1 or missing). Values of different kinds (numbers, strings, booleans,
lists and objects) are never equal (``q == '2'`` is false for the number 2, ``q != '2'``
true), and ordering them (``q < 'a'``) is unknown.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Mapping

import numpy as np

_ORDER: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_EQUAL: dict[type, Callable[[Any, Any], Any]] = {ast.Eq: operator.eq, ast.NotEq: operator.ne}
_COMPARE = {**_ORDER, **_EQUAL}
_LISTS = (ast.List, ast.Tuple, ast.Set)

#: Changes whenever what an expression selects changes (cached selections are keyed by it).
SEMANTICS = "3vl-2"

# A truth value per row: (true, false); rows in neither are unknown.
Truth = tuple[np.ndarray, np.ndarray]


class Expression:
    """A parsed filter expression.

    >>> e = Expression("score >= 0.5 and label in [1, 2]")
    >>> e.names
    ['label', 'score']
    >>> e.evaluate({"score": np.array([0.1, 0.9, 0.7]), "label": np.array([1, 2, 3])}).tolist()
    [False, True, False]

    A missing value (NaN in a number column, None otherwise) makes a comparison unknown, and
    only rows where the whole expression is true pass:

    >>> e = Expression("not score != 0.5")
    >>> e.evaluate({"score": np.array([0.5, 0.1, np.nan])}).tolist()
    [True, False, False]

    Args:
        text: the expression (missing values: see the module's docstring).
    """

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"filter: expected an expression such as 'meta.score >= 0.5', got {text!r}")
        self.text = text.strip()
        try:
            tree = ast.parse(self.text, mode="eval").body
        except SyntaxError as e:
            raise ValueError(f"filter {self.text!r}: not an expression ({e.msg} at column {e.offset})") from None
        self._names: set[str] = set()
        self._check(tree)
        if not self._names:
            raise ValueError(f"filter {self.text!r}: compares no field (name one, e.g. meta.score >= 0.5)")
        self._tree = tree
        self.text = ast.unparse(tree)  # one spelling: "a<1" and "a < 1" are the same filter

    @property
    def names(self) -> list[str]:
        """The (dotted) names the expression reads, sorted."""
        return sorted(self._names)

    def _fail(self, node: ast.AST, why: str) -> ValueError:
        snippet = ast.get_source_segment(self.text, node) or type(node).__name__
        return ValueError(
            f"filter {self.text!r}: {why}: {snippet!r} (allowed: comparisons such as a >= 1, a in [1, 2], "
            "and/or/not, names like meta.score, numbers, strings, True/False, None)"
        )

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand)
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if not isinstance(right, _LISTS):
                        raise self._fail(right, "'in' takes a list of values")
                    if _dotted(left) is None:
                        raise self._fail(node, "'in' takes a name on its left, such as meta.label in [1, 2]")
                elif type(op) not in _COMPARE:
                    raise self._fail(node, f"the operator {type(op).__name__} is not allowed")
                elif isinstance(right, _LISTS) or isinstance(left, _LISTS):
                    raise self._fail(node, "a list goes only after 'in' / 'not in'")
                elif type(op) in _ORDER and (_is_none(left) or _is_none(right)):
                    raise self._fail(node, "None only takes == / != (whether a value is missing) or 'in'")
                left = right
            if isinstance(node.left, _LISTS):
                raise self._fail(node.left, "a list goes only after 'in' / 'not in'")
            for term in [node.left, *node.comparators]:
                self._check_term(term)
        else:
            raise self._fail(node, "expected a comparison")

    def _check_term(self, node: ast.AST) -> None:
        if isinstance(node, _LISTS):
            for e in node.elts:
                if not _is_value(e):
                    raise self._fail(e, "a list holds numbers, strings, True/False or None only")
        elif _is_value(node):
            pass
        elif _dotted(node) is not None:
            self._names.add(_dotted(node))  # type: ignore[arg-type]
        else:
            raise self._fail(node, "not a name, number or string")

    def evaluate(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """A boolean mask: which rows pass (the expression is true, not false or unknown).

        Args:
            columns: one array per name of :attr:`names`, all of one length (numbers as float
                with NaN for missing, anything else as an object array with None for missing).
        """
        n = len(next(iter(columns.values()))) if columns else 0
        true, _false = self._eval(self._tree, columns, n)
        return np.asarray(true, dtype=bool)

    def _eval(self, node: ast.AST, columns: Mapping[str, np.ndarray], n: int) -> Truth:
        if isinstance(node, ast.BoolOp):
            parts = [self._eval(v, columns, n) for v in node.values]
            trues, falses = [t for t, _ in parts], [f for _, f in parts]
            if isinstance(node.op, ast.And):
                return np.logical_and.reduce(trues), np.logical_or.reduce(falses)
            return np.logical_or.reduce(trues), np.logical_and.reduce(falses)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            true, false = self._eval(node.operand, columns, n)
            return false, true
        assert isinstance(node, ast.Compare)
        out: Truth = (np.ones(n, dtype=bool), np.zeros(n, dtype=bool))
        left_node = node.left
        for op, right_node in zip(node.ops, node.comparators):
            t, f = _compare(op, left_node, right_node, columns, n)
            out = out[0] & t, out[1] | f  # a chain is an `and` of its links
            left_node = right_node
        return out

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _is_value(node: ast.AST) -> bool:
    """A constant the language takes: a number (or its negation), a string, True/False, None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and _kind(node.operand.value) == "number"
    return isinstance(node, ast.Constant) and (node.value is None or _kind(node.value) in ("number", "str", "bool"))


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _constant(node: ast.AST) -> Any:
    if isinstance(node, ast.UnaryOp):
        return -node.operand.value  # type: ignore[attr-defined]
    return node.value  # type: ignore[attr-defined]


def _kind(value: Any) -> str:
    """What kind of value: equal only within a kind, ordered only within number, str, bool."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    return "other"  # JSON lists and objects


def _operand(node: ast.AST, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray | Any:
    name = _dotted(node)
    return columns[name] if name is not None else _constant(node)


def _compare(op: ast.cmpop, left_node: ast.AST, right_node: ast.AST, columns: Mapping, n: int) -> Truth:
    left = _operand(left_node, columns, n)
    if isinstance(op, (ast.In, ast.NotIn)):
        hit = _member(left, [_constant(e) for e in right_node.elts], n)  # type: ignore[attr-defined]
        return hit if isinstance(op, ast.In) else (hit[1], hit[0])
    right = _operand(right_node, columns, n)
    if _is_none(left_node) or _is_none(right_node):  # == None / != None: whether the value is missing
        other = right if _is_none(left_node) else left
        missing = _missing(other, n)
        return (missing, ~missing) if isinstance(op, ast.Eq) else (~missing, missing)
    fn = _COMPARE[type(op)]
    if _numeric(left) and _numeric(right):  # the common case, in C
        known = ~(_missing(left, n) | _missing(right, n))
        with np.errstate(invalid="ignore"):
            value = np.broadcast_to(np.asarray(fn(left, right), dtype=bool), (n,))
        return known & value, known & ~value
    return _elementwise(fn, left, right, n)


def _numeric(v: Any) -> bool:
    """A float column (NaN: missing) or a number constant."""
    return (isinstance(v, np.ndarray) and v.dtype != object) or _kind(v) == "number"


def _missing(column: Any, n: int) -> np.ndarray:
    if not isinstance(column, np.ndarray):
        return np.full(n, column is None, dtype=bool)
    if column.dtype == object:
        return np.array([_absent(v) for v in column], dtype=bool)
    return np.isnan(column)


def _member(column: np.ndarray, values: list, n: int) -> Truth:
    """``column in values``: true where the value is one of them (a missing value where ``None``
    is one), false where a present value is none of them, unknown for a missing value otherwise."""
    missing = _missing(column, n)
    if column.dtype != object:
        numbers = np.asarray([v for v in values if _kind(v) == "number"], dtype=np.float64)
        hit = np.isin(column, numbers) if len(numbers) else np.zeros(n, dtype=bool)
    else:
        wanted = {(_kind(v), v) for v in values if v is not None}
        hit = np.array([not _absent(v) and _hashable_pair(v) in wanted for v in column], dtype=bool)
    if any(v is None for v in values):
        return hit | missing, ~(hit | missing)
    return hit, ~hit & ~missing


def _hashable_pair(v: Any) -> tuple[str, Any]:
    kind = _kind(v)
    return (kind, v) if kind != "other" else (kind, id(v))  # a list or object is in no list of constants


def _elementwise(fn: Callable[[Any, Any], Any], left: Any, right: Any, n: int) -> Truth:
    """Row by row (strings, booleans, mixed kinds, integers beyond float's exact range)."""
    lv = left if isinstance(left, np.ndarray) else [left] * n
    rv = right if isinstance(right, np.ndarray) else [right] * n
    true, false = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    ordering = fn not in (operator.eq, operator.ne)
    for i, (a, b) in enumerate(zip(lv, rv)):
        if _absent(a) or _absent(b):
            continue  # unknown
        if _kind(a) != _kind(b) or (ordering and _kind(a) == "other"):
            if ordering:
                continue  # unknown: different kinds, or lists and objects, have no order
            result = fn is operator.ne
        else:
            try:
                result = bool(fn(a, b))
            except TypeError:  # (values of one kind always compare; kept for safety)
                continue
        true[i], false[i] = result, not result
    return true, false


def _absent(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)  # NaN: a float column's missing value
