"""``mmloader.select``: a filtered subset of a zipped dataset, chosen from stored metadata.

A selection is an index of the dataset's rows: which pass a filter expression
(:mod:`mmloader.align.where`) on json fields, labels, image sizes from headers or stored byte
sizes, an explicit key list, a random fraction, a first-N limit. It is computed once, without
decoding any image, and cached on disk keyed by the selection and the dataset's content, so
the next run (and every rank and worker) reads a small array instead. The result is a
dataset like any other: ``zip``'s samples, ``Stream``, ``mix`` and resume work on it
unchanged, and the selection is part of the plan identity that resume states record.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from json.scanner import make_scanner
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DecodeError
from ..media.imageinfo import probe
from ..readers.basic import JSONReader, LabelReader, TextReader
from ..readers.image import ImageReader
from .identity import digest, store_content
from .where import SEMANTICS, Expression

log = logging.getLogger("mmloader")

CHUNK = 16384  # rows read per store call while filtering
IMAGE_SIZES = ("width", "height")
_NUMBERS = {int, float, type(None)}  # json values compared as numbers (bool and str are not)


def select(
    dataset: Any,
    where: str | None = None,
    *,
    keys: Sequence[str] | str | os.PathLike | None = None,
    fraction: float | None = None,
    limit: int | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike | bool | None = None,
    progress: bool = True,
) -> Any:
    """The samples of ``dataset`` (a :func:`mmloader.zip`) that pass ``where``, then the other options.

    Names in ``where`` read, per sample and without decoding:
    ``<json modality>.<field>[.<field>...]`` (or a bare field when one json modality has it),
    ``<image modality>.width`` / ``.height`` (from the header; bare ``width``/``height`` with
    one image modality), ``<label modality>`` (or bare ``label``), ``<text modality>`` (the
    text), ``<modality>.bytes`` (stored size). A missing field or JSON ``null`` makes a comparison
    unknown, and a sample passes only when the whole expression is true (SQL's three-valued
    logic: :mod:`mmloader.align.where`); ``x == None`` / ``x != None`` test presence.

    >>> ds = mmloader.zip(image=mmloader.ImageReader(p), meta=mmloader.JSONReader(p))   # doctest: +SKIP
    >>> good = mmloader.select(ds, "meta.clip_score >= 0.28 and image.width >= 256")   # doctest: +SKIP

    Args:
        dataset: a zipped dataset (or a selection of one: selections stack).
        where: a filter expression, e.g. ``"meta.clip_score >= 0.28 and label in [1, 2]"``.
        keys: keep only these sample keys (a list, or a text file with one key per line).
        fraction: keep this fraction (0 < f <= 1) of what passed, chosen at random from ``seed``.
        limit: keep at most this many of what passed (the first, in stored order).
        seed: the seed of ``fraction``'s choice.
        cache_dir: where filter results are cached (default ``$MMLOADER_CACHE_DIR`` or
            ``~/.cache/mmloader``, subfolder ``selections``); ``False``: no cache.
        progress: a progress bar while a filter reads metadata.

    Returns:
        A dataset of the selected samples, in stored order; ``.selection`` says how they
        were chosen, ``.report`` how many each step kept.

    Raises:
        ValueError: a bad expression or option, an unknown name (the message lists those
            there are), keys that are not in the dataset, or a selection of no sample.
    """
    if not hasattr(dataset, "stored_values"):
        raise TypeError(f"select() takes a zipped dataset (mmloader.zip), got {type(dataset).__name__}")
    expression = Expression(where) if where is not None else None
    if fraction is not None and (
        isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < float(fraction) <= 1
    ):
        raise ValueError(f"fraction={fraction!r}: expected a number in (0, 1]")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ValueError(f"limit={limit!r}: expected a whole number >= 1")
    wanted = _key_list(keys)
    spec: dict[str, Any] = {
        "where": expression.text if expression is not None else None,
        "keys": {"count": len(set(wanted)), "digest": digest(*sorted(set(wanted)))} if wanted is not None else None,
        "fraction": float(fraction) if fraction is not None else None,
        "limit": int(limit) if limit is not None else None,
        "seed": int(seed),
    }
    n = len(dataset)
    report = {"samples": n}
    kept = np.arange(n, dtype=np.int64)
    if expression is not None:
        kept = _filtered(dataset, expression, _cache_file(dataset, expression.text, cache_dir), progress)
        report["where"] = len(kept)
    if wanted is not None:
        kept = np.intersect1d(kept, _indices_of(dataset, wanted), assume_unique=True)
        report["keys"] = len(kept)
    if fraction is not None:
        take = int(round(float(fraction) * len(kept)))
        choice = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0x66726163])))
        kept = np.sort(choice.choice(kept, size=take, replace=False)) if take < len(kept) else kept
        report["fraction"] = len(kept)
    if limit is not None:
        kept = kept[: int(limit)]
        report["limit"] = len(kept)
    if not len(kept):
        steps = ", ".join(f"{k}: {v}" for k, v in report.items())
        raise ValueError(f"select() keeps no sample of {dataset!r} ({steps})")
    out = copy.copy(dataset)
    if dataset.cache is not None:  # a sample cache is keyed by index: the selection's indices are others
        out.cache = type(dataset.cache)(dataset.cache.max_bytes)
    out.positions = dataset.positions[kept] if dataset.positions is not None else kept
    earlier = dataset.selection or {}
    out.selection = {
        "base": earlier.get("base") or dataset.fingerprint(),
        "steps": [*earlier.get("steps", []), spec],
    }
    out._unselected = getattr(dataset, "_unselected", None) or dataset
    out._key_lists = [*getattr(dataset, "_key_lists", []), wanted]
    out.report = {**getattr(dataset, "report", {}), "select": report}
    log.info("select(): %s", ", ".join(f"{k}: {v}" for k, v in report.items()))
    return out


def reselect(dataset: Any, selection: dict) -> np.ndarray | None:
    """The rows of ``dataset``'s primary store that ``selection`` (another selection of the same
    unselected dataset, as recorded in a state) keeps, or None when it cannot be rebuilt (its
    key list is not known here, or it was made from another dataset)."""
    base = getattr(dataset, "_unselected", None) or dataset
    if selection.get("base") != base.fingerprint():
        return None
    known = dict(
        zip(
            (json.dumps(s, sort_keys=True) for s in (dataset.selection or {}).get("steps", [])),
            getattr(dataset, "_key_lists", []),
        )
    )
    out = base
    for step in selection["steps"]:
        keys = None
        if step.get("keys") is not None:
            keys = known.get(json.dumps(step, sort_keys=True))
            if keys is None:
                return None
        out = select(
            out,
            step["where"],
            keys=keys,
            fraction=step["fraction"],
            limit=step["limit"],
            seed=step["seed"],
            progress=False,
        )
    return out.positions if out.positions is not None else np.arange(len(out), dtype=np.int64)


# -- the steps ---------------------------------------------------------------------------


def _key_list(keys: Sequence[str] | str | os.PathLike | None) -> list[str] | None:
    if keys is None:
        return None
    if isinstance(keys, (str, os.PathLike)):
        path = Path(keys)
        if not path.is_file():
            raise ValueError(f"keys={str(keys)!r}: expected a list of keys or a text file with one key per line")
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    out = [str(k) for k in keys]
    if not out:
        raise ValueError("keys=[]: an empty key list selects nothing")
    return out


def _indices_of(dataset: Any, keys: list[str]) -> np.ndarray:
    """Indices in ``dataset`` of ``keys`` (sorted); unknown keys are an error naming them."""
    store = dataset._primary.store
    rows = np.array([-1 if (i := store.index_of(k)) is None else i for k in keys], dtype=np.int64)
    if dataset.positions is None:
        found = rows >= 0
        idx = rows
    else:
        idx = np.searchsorted(dataset.positions, rows)
        idx = np.minimum(idx, len(dataset.positions) - 1)
        found = (rows >= 0) & (dataset.positions[idx] == rows)
    if not found.all():
        missing = [k for k, ok in zip(keys, found) if not ok]
        raise ValueError(
            f"select(keys=...): {len(missing)} of {len(keys)} keys are not samples of {dataset!r}: {missing[:5]}"
        )
    return np.unique(idx)


def _filtered(dataset: Any, expression: Expression, cache: Path | None, progress: bool) -> np.ndarray:
    n = len(dataset)
    if cache is not None and cache.is_file():
        try:
            hit = np.load(cache, allow_pickle=False)
            if hit.dtype == np.int64 and hit.ndim == 1 and (not len(hit) or (hit[0] >= 0 and hit[-1] < n)):
                log.info("select(): filter %r read from the cache %s", expression.text, cache)
                return hit
        except (OSError, ValueError):
            pass  # unreadable: computed again below and written over
    columns = {name: column_reader(dataset, name) for name in expression.names}
    present = dict.fromkeys(columns, False)  # a name no sample has is a typo, not a filter
    parts = []
    bar = _bar(n, f"filter {expression.text!r}", progress)
    for a in range(0, n, CHUNK):
        idx = np.arange(a, min(a + CHUNK, n), dtype=np.int64)
        chunk = _Chunk(dataset, idx)  # each modality read (and json parsed) once for all its names
        values = {name: read(chunk) for name, read in columns.items()}
        for name, v in values.items():
            present[name] = present[name] or bool(_has_values(v))
        parts.append(idx[expression.evaluate(values)])
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    missing = [name for name, seen in present.items() if not seen]
    if missing:
        first = dataset[0] if n else {}
        fields = {m: sorted(v) for m, v in first.items() if isinstance(v, dict)}
        raise ValueError(
            f"filter {expression.text!r}: no sample of {dataset!r} has a value for {missing} (absent or null "
            f"in every sample: a misspelt field? the first sample's json fields: {fields})"
        )
    kept = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if cache is not None:
        _write_atomic(cache, kept)
    return kept


class _Chunk:
    """Rows of a dataset being filtered, with what was read of them (once per modality)."""

    def __init__(self, dataset: Any, idx: np.ndarray):
        self.dataset, self.idx = dataset, idx
        self._values: dict[str, list] = {}
        self._docs: dict[str, list] = {}

    def values(self, modality: str) -> list:
        if modality not in self._values:
            self._values[modality] = self.dataset.stored_values(self.idx, modality)
        return self._values[modality]

    def docs(self, modality: str) -> list:
        if modality not in self._docs:
            self._docs[modality] = _json_docs(self.dataset, modality, self.idx, self.values(modality))
        return self._docs[modality]


def column_reader(dataset: Any, name: str) -> Callable[[_Chunk], np.ndarray]:
    """A function ``chunk -> values`` for a name of a filter expression (see :func:`select`).

    Raises:
        ValueError: the name reads nothing of this dataset (the message lists what it could read).
    """
    readers = dataset.readers
    head, *rest = name.split(".")
    if head not in readers:
        candidates = _bare_candidates(readers, name)
        if len(candidates) == 1:
            return column_reader(dataset, candidates[0])
        raise ValueError(
            f"filter: {name!r} is {'ambiguous' if candidates else 'not a field'} in {dataset!r}"
            + (f": it could be {candidates}" if candidates else "")
            + f"; names are <modality>[.field], modalities: {sorted(readers)} ({_kinds(readers)})"
        )
    reader = readers[head]
    if rest == ["bytes"]:
        return lambda chunk: _byte_sizes(dataset, head, chunk.idx)
    if isinstance(reader, ImageReader) and len(rest) == 1 and rest[0] in IMAGE_SIZES:
        axis = IMAGE_SIZES.index(rest[0])
        return lambda chunk: _image_sizes(dataset, head, chunk.idx, chunk.values(head))[:, axis]
    if isinstance(reader, JSONReader):
        return lambda chunk: _as_column(_dig(chunk.docs(head), rest))
    if isinstance(reader, LabelReader) and not rest:
        return lambda chunk: _labels(chunk.values(head))
    if isinstance(reader, TextReader) and not rest:
        return lambda chunk: _as_column(
            [None if v is None else bytes(v).decode("utf-8", "replace") for v in chunk.values(head)]
        )
    what = {ImageReader: "width, height, bytes", JSONReader: "json fields, bytes"}.get(type(reader), "bytes")
    raise ValueError(f"filter: {name!r}: modality {head!r} ({type(reader).__name__}) gives {what}")


def _byte_sizes(dataset: Any, modality: str, idx: np.ndarray) -> np.ndarray:
    """Stored sizes from the index, NaN where the sample has no value (the index says 0 for
    both an absent and an empty value: only those few rows are read, to tell them apart)."""
    sizes = np.asarray(dataset.lengths(idx, modality), dtype=np.float64)
    zero = np.flatnonzero(sizes == 0)
    if len(zero):
        values = dataset.stored_values(idx[zero], modality, inflate=False)
        sizes[zero[[v is None for v in values]]] = np.nan
    return sizes


def _bare_candidates(readers: dict, name: str) -> list[str]:
    """What a name without a modality could mean: a field of any json modality (its documents
    may hold any field), an image's width/height, the label. More than one is an error."""
    out = []
    for mod, r in readers.items():
        if isinstance(r, JSONReader):
            out.append(f"{mod}.{name}")
        elif isinstance(r, ImageReader) and name in IMAGE_SIZES:
            out.append(f"{mod}.{name}")
        elif isinstance(r, LabelReader) and name == "label":
            out.append(mod)
    return sorted(out)


def _kinds(readers: dict) -> str:
    return ", ".join(f"{m}: {type(r).__name__}" for m, r in readers.items())


_SCAN = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner: (value, end) of a document


def _one_document(value: Any) -> Any:
    """A stored value parsed as exactly one JSON document (anything else raises ValueError)."""
    if value is None:
        return None
    text = value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else bytes(value).decode("utf-8")
    try:
        doc, end = _SCAN(text, 0)
    except StopIteration:  # not a document at position 0 (leading space, or garbage)
        return json.loads(text)
    if end != len(text) and text[end:].strip():
        raise ValueError(f"extra data after the document at character {end}")
    return doc


def _json_docs(dataset: Any, modality: str, idx: np.ndarray, values: list) -> list:
    """Each value parsed on its own (a chunk joined into one array would let two corrupt values
    balance each other and shift their neighbours' documents)."""
    try:
        return list(map(_one_document, values))
    except (ValueError, UnicodeDecodeError):
        pass
    for i, v in zip(idx.tolist(), values):  # find the culprit, to name it
        try:
            _one_document(v)
        except (ValueError, UnicodeDecodeError) as e:
            raise DecodeError(
                f"filter: not valid JSON ({e})", key=dataset.key(i), field=modality, where=dataset._primary.store.path
            ) from None
    raise AssertionError("unreachable: a value failed once and not again")


def _has_values(column: np.ndarray) -> bool:
    if column.dtype == object:
        return any(v is not None for v in column)
    return bool(np.isfinite(column).any())


def _dig(docs: list, path: list[str]) -> list:
    """The value at ``path`` in each document (None where a level is missing)."""
    for part in path:
        docs = [d.get(part) if type(d) is dict else None for d in docs]
    return docs


def _labels(values: list) -> np.ndarray:
    """ASCII integer labels as float (NaN where absent or not an integer)."""
    if None not in values:
        try:  # numpy parses the byte strings in C
            ints = np.array(values, dtype=np.bytes_).astype(np.int64)
            if not (np.abs(ints) >= 2**53).any():  # beyond, float64 is not exact
                return ints.astype(np.float64)
        except (ValueError, OverflowError):
            pass
    out: list = []
    for v in values:
        try:
            out.append(int(bytes(v).decode("ascii").strip()))
        except (TypeError, ValueError):
            out.append(None)
    return _as_column(out)  # floats (NaN: missing), or exact ints where one needs it


def _as_column(values: list) -> np.ndarray:
    """Numbers (and missing values) as float with NaN; anything else as objects with None."""
    if set(map(type, values)) <= _NUMBERS:  # the common case (a C loop): numbers and None
        column = np.array(values, dtype=np.float64)  # None -> NaN
        if not (np.abs(column) >= 2**53).any():  # beyond, float64 is not exact: compared as Python ints
            return column
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _image_sizes(dataset: Any, modality: str, idx: np.ndarray, values: list) -> np.ndarray:
    out = np.full((len(idx), 2), np.nan)
    for j, (i, data) in enumerate(zip(idx.tolist(), values)):
        if data is None:
            continue
        try:
            info = probe(bytes(data))
        except Exception as e:  # noqa: BLE001 - any header failure is this sample's, named
            raise DecodeError(
                f"filter: cannot read the image header ({e})",
                key=dataset.key(i),
                field=modality,
                where=dataset._primary.store.path,
            ) from None
        out[j] = info.width, info.height
    return out


# -- the cache ----------------------------------------------------------------------------


def _cache_file(dataset: Any, where: str | None, cache_dir: str | os.PathLike | bool | None) -> Path | None:
    if cache_dir is False or where is None:
        return None
    if cache_dir is None or cache_dir is True:
        root = Path(os.environ.get("MMLOADER_CACHE_DIR") or Path.home() / ".cache" / "mmloader")
    else:
        root = Path(cache_dir)
    return root / "selections" / f"{digest(content_id(dataset), where, SEMANTICS)}.npy"  # a rule changed: computed anew


def content_id(dataset: Any) -> str:
    """A digest of what a filter over ``dataset`` reads: which rows, which field each modality
    reads with which reader, and each store's content (counts, byte totals, checksums, and the
    identity of its local files: a dataset written again is another file)."""
    parts = [dataset.fingerprint()]
    for name, reader in sorted(dataset.readers.items()):
        parts.append(f"{name}={type(reader).__qualname__}:{';'.join(reader.fields)}")
        store = reader.store
        parts.append(store_content(store))
        parts.append(f"{store.metadata.get('format')}@{store.metadata.get('created')}")  # written when
        parts.append(_file_stamp(getattr(store, "path", None)))
    return digest(*parts)


def _file_stamp(path: Any) -> str:
    """Device, inode, size and modification time of a local store's main file ('' for a URL)."""
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return ""
    p = Path(path)
    for candidate in (p / "data.mdb", p / "index.json", p):
        try:
            st = candidate.stat()
        except OSError:
            continue
        if candidate.is_file():
            return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    return ""


def _write_atomic(path: Path, array: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the filter still works, it is only not cached
        log.warning("select(): cannot cache the filter result in %s (%s)", path.parent, e)


def _bar(total: int, desc: str, enabled: bool):
    if not enabled or total < 4 * CHUNK:  # a bar only where the wait is felt
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="samples", leave=False)
