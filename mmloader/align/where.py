"""Filter expressions over per-sample metadata: ``"meta.clip_score >= 0.28 and image.width >= 256"``.

An expression is parsed once (Python syntax, a safe subset: comparisons, ``in`` / ``not in``
a list, ``and`` / ``or`` / ``not``, names with dotted fields, numbers, strings, ``None``) and
evaluated column-wise on numpy arrays, so a million samples take one pass per column, not a
Python call each. Nothing is ``eval``-ed. Which column a name reads is the caller's business
(:mod:`mmloader.align.select`).
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Mapping

import numpy as np

_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


class Expression:
    """A parsed filter expression.

    >>> e = Expression("score >= 0.5 and label in [1, 2]")
    >>> e.names
    ['label', 'score']
    >>> e.evaluate({"score": np.array([0.1, 0.9, 0.7]), "label": np.array([1, 2, 3])}).tolist()
    [False, True, False]

    Args:
        text: the expression. A sample whose value is missing fails every comparison with it
            except ``!=`` and ``not in``; ``== None`` / ``!= None`` test for it, and ``None`` in a
            list matches it. Numbers compare with numbers only (``q in ['2']`` keeps no ``q == 2``).
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
            "and/or/not, names like meta.score, numbers, strings)"
        )

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _COMPARE and not isinstance(op, (ast.In, ast.NotIn)):
                    raise self._fail(node, f"the operator {type(op).__name__} is not allowed")
            terms = [node.left, *node.comparators]
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (ast.List, ast.Tuple, ast.Set)):
                    raise self._fail(right, "'in' takes a list of values")
            for term in terms:
                self._check_term(term)
        else:
            raise self._fail(node, "expected a comparison")

    def _check_term(self, node: ast.AST) -> None:
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for e in node.elts:
                if not isinstance(e, ast.Constant):
                    raise self._fail(e, "a list holds constants only")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            pass
        elif isinstance(node, ast.Constant):
            pass
        elif _dotted(node) is not None:
            self._names.add(_dotted(node))  # type: ignore[arg-type]
        else:
            raise self._fail(node, "not a name, number or string")

    def evaluate(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """A boolean mask: which rows pass.

        Args:
            columns: one array per name of :attr:`names`, all of one length (numbers as float
                with NaN for missing, anything else as an object array with None for missing).
        """
        return np.asarray(self._eval(self._tree, columns), dtype=bool)

    def _eval(self, node: ast.AST, columns: Mapping[str, np.ndarray]) -> Any:
        if isinstance(node, ast.BoolOp):
            masks = [self._eval(v, columns) for v in node.values]
            return np.logical_and.reduce(masks) if isinstance(node.op, ast.And) else np.logical_or.reduce(masks)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~self._eval(node.operand, columns)
        assert isinstance(node, ast.Compare)
        out = None
        left = self._value(node.left, columns)
        for op, right_node in zip(node.ops, node.comparators):
            right = self._value(right_node, columns)
            mask = _compare(op, left, right)
            out = mask if out is None else out & mask
            left = right
        return out

    def _value(self, node: ast.AST, columns: Mapping[str, np.ndarray]) -> Any:
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [e.value for e in node.elts]  # type: ignore[attr-defined]
        if isinstance(node, ast.UnaryOp):
            return -node.operand.value  # type: ignore[attr-defined]
        if isinstance(node, ast.Constant):
            return node.value
        return columns[_dotted(node)]  # type: ignore[index]

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _compare(op: ast.cmpop, left: Any, right: Any) -> np.ndarray:
    if isinstance(op, (ast.In, ast.NotIn)):
        hit = _member(left, right)
        return ~hit if isinstance(op, ast.NotIn) else hit
    if right is None or left is None:  # == None / != None: whether the value is missing
        column = left if right is None else right
        missing = _missing(column)
        if isinstance(op, ast.Eq):
            return missing
        if isinstance(op, ast.NotEq):
            return ~missing
        return np.zeros(len(missing), dtype=bool)  # an order with None: never
    fn = _COMPARE[type(op)]
    with np.errstate(invalid="ignore"):
        if _is_object(left) or _is_object(right):
            return _object_compare(fn, left, right)
        if isinstance(left, (str, bool)) or isinstance(right, (str, bool)):  # numbers vs a string/bool: never equal
            column = left if isinstance(right, (str, bool)) else right
            return np.full(len(column), fn is operator.ne, dtype=bool)
        return np.asarray(fn(left, right), dtype=bool)


def _missing(column: Any) -> np.ndarray:
    if not isinstance(column, np.ndarray):
        raise ValueError("a comparison with None needs a field on one side")
    if column.dtype == object:
        return np.array([v is None for v in column], dtype=bool)
    return np.isnan(column)


def _member(column: np.ndarray, values: list) -> np.ndarray:
    """Rows whose value is one of ``values`` (``None`` there: a missing value); numbers match
    numbers, strings strings."""
    out = _missing(column) if any(v is None for v in values) else np.zeros(len(column), dtype=bool)
    wanted = [v for v in values if v is not None]
    if column.dtype != object:
        numbers = [v for v in wanted if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return out | (np.isin(column, np.asarray(numbers, dtype=np.float64)) if numbers else False)
    keyed = {(type(v) is str, v) for v in wanted if isinstance(v, (str, int, float))}
    return out | np.array(
        [v is not None and isinstance(v, (str, int, float)) and (type(v) is str, v) in keyed for v in column],
        dtype=bool,
    )


def _is_object(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype == object


def _object_compare(fn: Callable[[Any, Any], Any], left: Any, right: Any) -> np.ndarray:
    """Element-wise on object arrays (strings, mixed): a missing value or another type fails."""
    n = len(left) if isinstance(left, np.ndarray) else len(right)
    lv = left if isinstance(left, np.ndarray) else [left] * n
    rv = right if isinstance(right, np.ndarray) else [right] * n
    out = np.zeros(n, dtype=bool)
    for i, (a, b) in enumerate(zip(lv, rv)):
        if a is None or b is None:
            out[i] = fn is operator.ne and (a is None) != (b is None)
            continue
        try:
            out[i] = bool(fn(a, b))
        except TypeError:
            out[i] = fn is operator.ne
    return out
