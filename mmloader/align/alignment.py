"""How ``mmloader.zip`` lines its readers up: readers grouped by the store they read (one read
per sample serves a group), then the stores matched by position or by key (``align="strict"`` /
``"inner"``). Apart from :mod:`.zip`, which reads the aligned samples: this runs once, as a zip
is built."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Mapping, NamedTuple

import numpy as np

from ..errors import AlignmentError
from ..readers.base import Reader

log = logging.getLogger("mmloader")


def _store_id(reader: Reader) -> tuple:
    """Which readers read one store (one read per sample serves them): the store's identity,
    which for an Energon dataset includes its split."""
    store = reader.store
    identity = getattr(store, "identity", None)
    if callable(identity):
        return identity()
    location = getattr(store, "location", None)  # one bucket name on two endpoints: two stores
    return (store.format, store.path, location.identity() if location is not None else "")


def store_groups(readers: Mapping[str, Reader]) -> list[list[str]]:
    """The names of the readers, grouped by store (one ``store.read()`` per store per sample);
    the first group's store is the primary one, whose order is the zipped order."""
    groups: dict[tuple, list[str]] = {}
    for name, r in readers.items():
        groups.setdefault(_store_id(r), []).append(name)
    return list(groups.values())


class Alignment(NamedTuple):
    """How the stores line up: ``by_key`` (else by position), the primary store's rows kept
    (``align="inner"``; None: all) and what each modality lost to the intersection."""

    by_key: bool
    positions: np.ndarray | None
    report: dict[str, int]


def align_stores(readers: Mapping[str, Reader], groups: list[list[str]], align: str) -> Alignment:
    """Match the stores of ``groups`` (from :func:`store_groups`): by position when every store
    holds the same key sequence (checked per sample), else by key; ``align="strict"`` raises
    naming the first missing keys, ``"inner"`` keeps the intersection."""

    def name_of(reader: Reader) -> str:
        return next(n for n, r in readers.items() if r is reader)

    primary = readers[groups[0][0]]
    others = [readers[g[0]] for g in groups[1:]]
    if not others:
        return Alignment(False, None, {})
    n = len(primary)
    fp = primary.keys.fingerprint()
    if all(len(o) == n and o.keys.fingerprint() == fp for o in others):
        return Alignment(False, None, {})  # same key sequence: zip by position, checked per sample
    counts = {name_of(primary): n, **{name_of(o): len(o) for o in others}}
    made_up = [name_of(r) for r in (primary, *others) if getattr(r.store, "synthetic_keys", False)]
    if made_up:  # a table without a key column: its "keys" are row numbers, other rows elsewhere
        raise AlignmentError(
            f"zip(): the readers' keys differ (counts {counts}) and {made_up} read a table without a "
            "key column, whose keys are row numbers: matched by key they would pair one table's row 5 with "
            "another's. Give the tables a __key__ (or key) column, or zip readers of one table"
        )
    if align == "strict":
        for o in others:
            missing = _missing(primary, o, limit=5)
            extra = _missing(o, primary, limit=5)
            if missing or extra:
                raise AlignmentError(
                    f"zip(align='strict'): readers do not hold the same samples (counts {counts}); "
                    f"keys of {name_of(primary)!r} missing from {name_of(o)!r}: {missing}; "
                    f"keys of {name_of(o)!r} missing from {name_of(primary)!r}: {extra}. "
                    "Use align='inner' to keep the intersection."
                )
        return Alignment(True, None, {})
    keep = np.fromiter(
        (i for i, k in enumerate(primary.keys) if all(o.store.index_of(k) is not None for o in others)),
        dtype=np.int64,
    )
    report = {name: c - len(keep) for name, c in counts.items()}
    log.info("zip(align='inner'): %d aligned samples; lost per modality: %s", len(keep), report)
    return Alignment(True, keep, report)


def _missing(a: Reader, b: Reader, limit: int) -> list[str]:
    out = []
    for k in a.keys:
        if b.store.index_of(k) is None:
            out.append(k)
            if len(out) >= limit:
                break
    return out


class KeysAt(Sequence):
    """Keys of a store at selected rows (``align="inner"``), looked up lazily."""

    def __init__(self, store, positions: np.ndarray):
        self._store, self._positions = store, positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._store.key(int(p)) for p in self._positions[i]]
        return self._store.key(int(self._positions[i]))
