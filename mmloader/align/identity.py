"""What identifies a dataset in a resume state: its size and a digest of the samples it holds.

A state saved by a loader names the plan it belongs to; a dataset is part of that plan
through its fingerprint, so a source replaced by another of the same size, or a filter
that keeps other samples, is seen as a change (and never resumed into silently).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def store_content(store: Any, samples: int = 64) -> str:
    """A digest of a store's content: its per-field counts, byte totals and checksums (what the
    writers record over every value), or, for a store without checksums, its count and every
    field of ``samples`` records spread evenly from its first to its last (every record of a
    smaller store).

    Args:
        store: an open store.
        samples: records read when the store keeps no checksums.
    """
    own = getattr(store, "content_digest", None)
    if callable(own):  # a store that can say it without reading samples (a table's footers)
        return own()
    meta = store.metadata
    if meta.get("field_crc32"):
        keep = {k: meta.get(k) for k in ("count", "field_counts", "field_bytes", "field_crc32")}
        return digest(json.dumps(keep, sort_keys=True, default=str))
    n = len(store)
    k = min(samples, n)
    rows = sorted({round(j * (n - 1) / max(k - 1, 1)) for j in range(k)})
    parts: list[Any] = [n]
    for i in rows:
        record = store.read(i)
        parts += [
            f"{k}={bytes(v).hex() if isinstance(v, (bytes, memoryview)) else v}" for k, v in sorted(record.items())
        ]
    return digest(*parts)


def dataset_fingerprint(dataset: Any) -> str | None:
    """A digest of which samples ``dataset`` holds (not of where it is stored: a dataset moved
    from disk to object storage keeps it).

    Datasets with a ``fingerprint()`` method (:class:`mmloader.align.zip.Zipped`; give your own
    dataset one) give theirs; a store, the digest of its keys and content; anything else None:
    it cannot be told from another dataset of its size, and a resume says so.

    Args:
        dataset: a map-style dataset.
    """
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    keys = getattr(dataset, "keys", None)
    if keys is not None and callable(getattr(keys, "fingerprint", None)) and hasattr(dataset, "metadata"):
        return digest(keys.fingerprint(), store_content(dataset))
    return None


def digest(*parts: Any) -> str:
    """A short hex digest of strings, bytes and numpy arrays, in order."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, np.ndarray):
            h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        else:
            h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def callable_name(fn: Any) -> str:
    """How a callable option is recorded in a state: its module, qualified name and, for a
    Python function, a digest of its code (another lambda of the same name is another callable)."""
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    if code is None:
        return name
    return f"{name}@{digest(*_code_parts(code))[:12]}"


class UnidentifiableError(TypeError):
    """A callable option holds a value that cannot be part of a plan identity."""


def callable_identity(fn: Any, option: str) -> str:
    """What identifies a callable option (``Bucketing(by=...)``) in a plan identity: its name and
    a digest of everything it computes from that a resume could not see otherwise: its code
    (nested functions included), the values its closure holds, its defaults, and for
    :func:`functools.partial` the function and arguments; for an object with ``__call__``, its
    class's code and attributes. Globals it reads are not part of it.

    Values are plain data (numbers, strings, bytes, None, containers of them, NumPy arrays,
    tensors), functions (a library's own, as ``len`` or ``np.sum``, by name), modules, classes
    and objects by their class and attributes (the ``self`` of a bound method); anything else
    (a lock, a file, an open store) raises :class:`UnidentifiableError` naming ``option`` and
    the remedy: an explicit ``identity=``.

    >>> def by_table(table):
    ...     return lambda i: table[i]
    >>> callable_identity(by_table([3, 1, 2]), "by") == callable_identity(by_table([9, 1, 2]), "by")
    False
    >>> callable_identity(by_table([3, 1, 2]), "by") == callable_identity(by_table([3, 1, 2]), "by")
    True
    """
    try:
        return f"{_qualified(fn)}@{digest(*_value_parts(fn, set()))[:16]}"
    except UnidentifiableError as e:
        raise UnidentifiableError(
            f"{option}={_qualified(fn)} holds {e}, which cannot be part of the plan identity (a resume "
            f"could not tell this plan from another); give it one: {option.split('=')[0].split('(')[0]}"
            f"(..., identity='a name you change whenever what it computes changes')"
        ) from None


def _qualified(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _code_parts(code: Any) -> list:
    """A code object's bytecode, names and constants, nested code objects digested in turn
    (their repr holds a memory address)."""
    return [code.co_code, repr([_constant(c) for c in code.co_consts]), repr(code.co_names)]


def _constant(c: Any) -> str:
    """A code constant as text that is the same in every process: a nested code object by its own
    digest (its repr holds an address), a frozenset (a set literal) sorted (its order follows
    the process's string hashing)."""
    if hasattr(c, "co_code"):
        return f"code:{digest(*_code_parts(c))}"
    if isinstance(c, frozenset):
        return "frozenset({" + ", ".join(sorted(_constant(x) for x in c)) + "})"
    if isinstance(c, tuple) and any(isinstance(x, (frozenset, tuple)) or hasattr(x, "co_code") for x in c):
        return "(" + ", ".join(_constant(x) for x in c) + ("," if len(c) == 1 else "") + ")"
    return repr(c)  # (as before: the digests of functions without set constants are unchanged)


def _value_parts(value: Any, seen: set) -> list:
    import functools
    import types

    if id(value) in seen:  # a function that refers to itself through its closure
        return ["<cycle>"]
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return [f"{type(value).__name__}:{value!r}"]
    if isinstance(value, np.generic):
        return [f"np:{value.dtype}:{value!r}"]
    if isinstance(value, np.ndarray) and value.dtype.hasobject:  # (its bytes are pointers)
        return [f"ndarray:object:{value.shape}", *_value_parts(value.tolist(), seen)]
    if isinstance(value, np.ndarray):
        return [f"ndarray:{value.dtype}:{value.shape}", np.ascontiguousarray(value).tobytes()]
    seen = seen | {id(value)}
    if isinstance(value, (list, tuple)):
        return [f"{type(value).__name__}:{len(value)}"] + [p for v in value for p in _value_parts(v, seen)]
    if isinstance(value, (set, frozenset)):
        return [f"set:{len(value)}"] + sorted(str(_value_parts(v, seen)) for v in value)
    if isinstance(value, dict):
        items = sorted((str(_value_parts(k, seen)), _value_parts(v, seen)) for k, v in value.items())
        return [f"dict:{len(value)}"] + [p for k, v in items for p in (k, *v)]
    if isinstance(value, types.ModuleType):
        return [f"module:{value.__name__}"]
    if isinstance(value, type):
        return [f"type:{_qualified(value)}"]
    if isinstance(value, functools.partial):
        return ["partial", *_value_parts(value.func, seen), *_value_parts(value.args, seen)] + _value_parts(
            value.keywords, seen
        )
    if isinstance(value, types.MethodType):
        return ["method", *_value_parts(value.__func__, seen), *_value_parts(value.__self__, seen)]
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # a cell not yet filled
                cells.append("<empty cell>")
        return [f"function:{_qualified(value)}", *_code_parts(value.__code__)] + _value_parts(
            (cells, value.__defaults__, value.__kwdefaults__), seen
        )
    if isinstance(value, (types.BuiltinFunctionType, np.ufunc)) or (
        callable(value) and getattr(value, "__module__", None) in _NAMED_BY_MODULE
    ):  # a library's own function (len, np.sum, np.log, math.sqrt): its name says what it computes
        return [f"builtin:{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"]
    if type(value).__module__ == "operator" or isinstance(value, range):  # itemgetter(1), range(3): repr is all
        return [f"{type(value).__qualname__}:{value!r}"]
    if hasattr(value, "__wrapped__") and isinstance(value, functools._lru_cache_wrapper):
        return ["lru_cache", *_value_parts(value.__wrapped__, seen)]
    import torch

    if isinstance(value, torch.Tensor):
        return [f"tensor:{value.dtype}:{tuple(value.shape)}", value.detach().cpu().contiguous().numpy().tobytes()]
    if hasattr(value, "__dict__") and not isinstance(value, types.ModuleType):
        # an object (its own __call__, or the self of a bound method): its class's code and its attributes
        code = getattr(type(value).__dict__.get("__call__"), "__code__", None)
        head = [f"object:{_qualified(type(value))}", *(_code_parts(code) if code is not None else [])]
        return head + _value_parts(vars(value), seen)
    raise UnidentifiableError(f"a {type(value).__qualname__}")


#: Modules whose functions are identified by name (a release that changes what one computes is
#: beyond a plan identity, as the interpreter's own builtins are).
_NAMED_BY_MODULE = frozenset({"builtins", "math", "operator", "numpy", "torch", "_operator"})
