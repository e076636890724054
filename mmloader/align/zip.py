"""``mmloader.zip``: per-modality readers -> one map-style dataset of aligned samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Mapping

import numpy as np
import torch.utils.data

from ..errors import AlignmentError
from ..readers.base import Reader, as_bytes
from ..readers.cache import SampleCache, fresh_copy
from ..readers.columns import per_sample
from ..readers.timing import timed
from .alignment import KeysAt, align_stores, store_groups
from .collate import MISSING, present_in_every_row
from .reader_checks import check_coverage, check_one_commit


class Zipped(torch.utils.data.Dataset):
    """Aligned samples ``{"__key__": key, name: value, ...}`` from several readers.

    Build it with ``mmloader.zip`` (:func:`zip_readers`). Readers over the same store share one read per
    sample; only the zipped fields are read.
    """

    def __init__(
        self,
        readers: Mapping[str, Reader],
        align: str = "strict",
        transforms: Mapping[str, Callable[[Any], Any]] | None = None,
        cache: SampleCache | None = None,
    ):
        if not readers:
            raise ValueError("zip() needs at least one reader, e.g. zip(image=ImageReader(...))")
        if align not in ("strict", "inner"):
            raise ValueError(f"align={align!r}: expected 'strict' or 'inner'")
        for name, r in readers.items():
            if not isinstance(r, Reader):
                raise TypeError(f"zip(): {name}= must be a Reader, got {type(r).__name__}")
            if name.startswith("__"):
                raise ValueError(f"zip(): modality name {name!r} is reserved")
            check_coverage(name, r)
        check_one_commit(readers)
        self.readers = dict(readers)
        self.transforms = dict(transforms or {})
        unknown = set(self.transforms) - set(self.readers)
        if unknown:
            raise ValueError(f"zip(): transforms for unknown modalities {sorted(unknown)}")
        for name in list(self.transforms):  # what a reader can run itself (an image pipeline) moves there
            self.readers[name], rest = self.readers[name].fuse(self.transforms[name])
            if rest is None:
                del self.transforms[name]
            else:
                self.transforms[name] = rest
        self.cache = cache
        self._groups = store_groups(self.readers)  # one store.read() per store per sample
        aligned = align_stores(self.readers, self._groups, align)
        self.positions: np.ndarray | None = aligned.positions  # primary-store rows kept (align="inner", select())
        self.selection: dict | None = None  # how select() chose them (recorded in resume states)
        self.by_key = aligned.by_key
        self.report: dict[str, int] = aligned.report

    @property
    def _primary(self) -> Reader:
        """The reader whose store's order defines the zipped order."""
        return self.readers[self._groups[0][0]]

    def _misaligned(self, pos: int, key: str, other: str, store) -> AlignmentError:
        return AlignmentError(
            f"position {pos}: key {key!r} in {self._primary.store.path} but {other!r} in {store.path}"
        )

    # -- map-style access -----------------------------------------------------
    @property
    def modalities(self) -> list[str]:
        return list(self.readers)

    def __len__(self) -> int:
        return len(self.positions) if self.positions is not None else len(self._primary)

    def fingerprint(self) -> str:
        """A digest of the samples this dataset holds: the primary store's key sequence and
        content (its per-field counts, byte totals and checksums, or a sample of its records
        where it keeps no checksums) and, for a selection (``align="inner"``, :meth:`select`),
        exactly which rows it keeps. Where the dataset is stored is not part of it."""
        from .identity import digest, store_content

        base = digest(self._primary.keys.fingerprint(), store_content(self._primary.store))
        return base if self.positions is None else digest(base, self.positions)

    @property
    def keys(self) -> Sequence[str]:
        """The aligned samples' keys, read on demand (never a list of every key)."""
        primary = self._primary
        return primary.keys if self.positions is None else KeysAt(primary.store, self.positions)

    def key(self, index: int) -> str:
        primary = self._primary
        return primary.store.key(int(self.positions[index]) if self.positions is not None else index)

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        """The shard (of the first reader's store) each of the aligned samples ``indices`` lies in."""
        rows = np.asarray(indices, dtype=np.int64)
        if self.positions is not None:
            rows = np.asarray(self.positions, dtype=np.int64)[rows]
        return self._primary.store.shard_of(rows)

    def index_of(self, key: str) -> int | None:
        """The aligned index of the sample named ``key`` (None: not among these samples)."""
        i = self._primary.store.index_of(key)
        if i is None or self.positions is None:
            return i
        where = np.flatnonzero(np.asarray(self.positions) == i)
        return int(where[0]) if len(where) else None

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range ({n} aligned samples)")
        return self._transformed(self._decoded_cached(index % n))

    def _decoded_cached(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range ({n} aligned samples)")
        decoded = self.cache.get(index) if self.cache is not None else None
        if decoded is None:
            decoded = self._decoded(index)
            if self.cache is not None:
                self.cache.put(index, decoded)
        return decoded

    def _decoded(self, index: int) -> dict[str, Any]:
        """Sample ``index`` decoded, before any transform (what the cache keeps, so random
        transforms still run on every access)."""
        pos = int(self.positions[index]) if self.positions is not None else index
        sample: dict[str, Any] = {}
        key = None
        for group in self._groups:
            store = self.readers[group[0]].store
            fields = self._fields_of(group)
            if key is None:
                with timed("read"):
                    record = store.read(pos, fields)
                key = record["__key__"]
            elif self.by_key:
                j = store.index_of(key)
                if j is None:
                    raise AlignmentError(f"sample {key!r} is missing from {store.path}")
                record = store.read(j, fields)
            else:
                record = store.read(pos, fields)
                if record["__key__"] != key:
                    raise self._misaligned(pos, key, record["__key__"], store)
            for name in group:
                reader = self.readers[name]
                if reader.optional and not reader.has_value(record):
                    continue  # left out, as a mix leaves out what a source lacks: the collate marks it
                sample[name] = reader.decode_record(record)
        sample["__key__"] = key
        return sample

    def _transformed(self, decoded: dict[str, Any]) -> dict[str, Any]:
        """The sample after transforms. Cached samples are copied first: a transform (or the
        caller) that changes a value in place must not change what the cache holds."""
        sample = {}
        for name, value in decoded.items():
            if self.cache is not None:
                value = fresh_copy(value)
            reader = self.readers.get(name)
            if reader is not None:
                value = reader.apply_transform(value)
            t = self.transforms.get(name)
            sample[name] = t(value) if t is not None else value
        return sample

    def _fields_of(self, group: list[str]) -> list[str]:
        """The store fields a group of readers needs (alternatives included), each once."""
        return list(dict.fromkeys(f for name in group for f in self.readers[name].fields))

    def get_batch(self, indices: list[int], *, share_memory: bool = False) -> dict[str, Any]:
        """Columns for a batch (``name -> values``; packed for raw images), one store call per store.

        Same values as ``[self[i] for i in indices]``; used by :class:`mmloader.Stream` to cut
        per-sample overhead. ``share_memory``: the batch goes to another process (readers that
        allocate batch tensors put them in shared memory).
        """
        if self.by_key or self.cache is not None:
            # every sample decoded before any transform runs: a bad one fails the batch first
            decoded = [self._decoded_cached(i) for i in indices]
            rows = [self._transformed(d) for d in decoded]
            out = {name: [r.get(name, MISSING) for r in rows] for name in ["__key__", *self.readers]}
            return self._mark_present(out, {n for n in self.readers if any(v is MISSING for v in out[n])})
        n = len(self)
        if len(indices) and (min(indices) < 0 or max(indices) >= n):
            bad = next(i for i in indices if not 0 <= i < n)
            raise IndexError(f"index {bad} out of range ({n} aligned samples)")
        pos = (
            self.positions[np.asarray(indices, dtype=np.int64)].tolist()
            if self.positions is not None
            else list(indices)
        )
        columns: dict[str, Any] = {}
        absent: set[str] = set()  # optional modalities some rows lack
        keys = None
        for group in self._groups:
            store = self.readers[group[0]].store
            views = any(self.readers[name].takes_views for name in group)
            with timed("read"):
                group_keys, raw = store.read_many(pos, self._fields_of(group), views=views)
            if keys is None:
                keys = group_keys
            elif group_keys != keys:
                bad = next(j for j, (a, b) in enumerate(zip(keys, group_keys)) if a != b)
                raise self._misaligned(pos[bad], keys[bad], group_keys[bad], store)
            for name in group:
                reader = self.readers[name]
                column, picked = _first_present(reader, raw, len(pos))
                if views and not reader.takes_views:
                    column = as_bytes(column)
                if reader.optional and any(v is None for v in column):
                    # the rows that have it are decoded as a batch; the others hold MISSING,
                    # which the collate turns into batch["__present__"][name]
                    have = [j for j, v in enumerate(column) if v is not None]
                    absent.add(name)
                    values: list = [MISSING] * len(column)
                    if have:
                        decoded = _decode_column(
                            reader,
                            [column[j] for j in have],
                            [keys[j] for j in have],
                            False,
                            None if picked is None else [picked[j] for j in have],
                        )
                        for j, v in zip(have, per_sample(decoded)):
                            values[j] = v
                    columns[name] = values
                else:
                    columns[name] = _decode_column(reader, column, keys, share_memory, picked)
        for name, reader in self.readers.items():
            if reader.transform is not None:
                columns[name] = [v if v is MISSING else reader.transform(v) for v in per_sample(columns[name])]
            t = self.transforms.get(name)
            if t is not None:
                columns[name] = [v if v is MISSING else t(v) for v in per_sample(columns[name])]
        columns["__key__"] = keys
        return self._mark_present(columns, absent)

    def _mark_present(self, columns: dict[str, Any], absent: set[str]) -> dict[str, Any]:
        """The optional modalities every row has marked so: their batch has ``__present__``
        all True (one schema, whether or not a row of the batch lacks them)."""
        for name, reader in self.readers.items():
            if reader.optional and name not in absent:
                columns[name] = present_in_every_row(columns[name])
        return columns

    def lengths(self, indices: Sequence[int], modality: str) -> np.ndarray:
        """Stored byte size of ``modality`` for each sample (0 where absent), for length
        bucketing: read from the offset index or B-tree, nothing is decoded."""
        reader = self.readers[modality]
        pos = self._rows_in(reader, indices)
        sizes = [reader.store.field_sizes(pos.tolist(), f) for f in reader.fields]
        return np.maximum.reduce(sizes) if len(sizes) > 1 else sizes[0]

    def token_counts(self, indices: Sequence[int], modality: str) -> np.ndarray:
        """Tokens of ``modality`` for each sample, known without decoding (see
        :meth:`mmloader.Reader.token_counts`): what token-budget packing plans with.

        Args:
            indices: samples of this dataset.
            modality: a reader of token ids (or of documents).
        """
        if modality in self.transforms:
            raise TypeError(
                f"zip(transforms={{{modality!r}: ...}}) may change the tokens: give "
                "Stream(length_by=mmloader.tokens(..., length=index -> tokens)) what it delivers"
            )
        reader = self.readers[modality]
        return np.asarray(reader.token_counts(self._rows_in(reader, indices).tolist()), dtype=np.int64)

    def document_counts(
        self, indices: Sequence[int], modality: str, tokens: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """``(text tokens, images)`` of each sample's document in ``modality`` (a
        ``DocumentReader``), from one read of the stored layouts: nothing is decoded.

        Args:
            indices: samples of this dataset.
            modality: a reader of documents.
            tokens: count the text tokens too (else None in their place).
        """
        if tokens and modality in self.transforms:
            self.token_counts(indices, modality)  # raises: a transform may change the tokens
        reader: Any = self.readers[modality]
        return reader.document_counts(self._rows_in(reader, indices).tolist(), tokens)

    def stored_values(self, indices: Sequence[int], modality: str, inflate: bool = True) -> list:
        """The stored (encoded) bytes of ``modality`` for each sample, nothing decoded: what
        filters on metadata read (:func:`mmloader.select`); a ``.gz`` field's gunzipped unless
        ``inflate=False`` (a filter on stored sizes only tells absent from empty)."""
        reader = self.readers[modality]
        pos = self._rows_in(reader, indices).tolist()
        raw = {f: reader.store.field_values(pos, f) for f in reader.fields}
        column, picked = _first_present(reader, raw, len(pos))
        if not reader.gzipped or not inflate:
            return column
        # a filter reads a .gz field's text or JSON, not its compressed bytes
        fields = picked if picked is not None else [reader.field] * len(pos)
        return [
            reader.inflated(v, f, reader.store.key(p)) if v is not None and f and f.endswith(".gz") else v
            for v, f, p in zip(column, fields, pos)
        ]

    def _rows_in(self, reader: Reader, indices: Sequence[int]) -> np.ndarray:
        """Rows of ``reader``'s store holding samples ``indices`` of this dataset."""
        idx = np.asarray(indices, dtype=np.int64)
        pos = self.positions[idx] if self.positions is not None else idx
        if self.by_key and reader is not self._primary:  # this store may order samples differently
            pos = np.array([reader.store.index_of(self.key(int(i))) for i in idx], dtype=np.int64)
        return pos

    def select(self, where: str | None = None, **options: Any) -> "Zipped":
        """The samples that pass a filter, or a subset: see :func:`mmloader.select`."""
        from .select import select

        return select(self, where, **options)

    @property
    def packed_modalities(self) -> list[str]:
        """Modalities whose values are encoded bytes packed into one buffer per batch."""
        return [name for name, r in self.readers.items() if r.packs_bytes and name not in self.transforms]

    def reads_object_storage(self) -> bool:
        """Whether a reader's store reads object storage where samples are read."""
        return any(getattr(r.store, "reads_object_storage", lambda: False)() for r in self.readers.values())

    def python_work(self) -> list[str]:
        """User Python run per sample: transforms, ``decode=`` callables, reader subclasses."""
        from ..readers.registry import BUILTIN_READERS

        reasons = [f"a transform on {name!r}" for name in self.transforms]
        for name, r in self.readers.items():
            if type(r) not in BUILTIN_READERS:
                reasons.append(f"a custom reader ({type(r).__name__}) for {name!r}")
            elif r.transform is not None or r._decode_fn is not None:
                reasons.append(f"a {'transform' if r.transform is not None else 'decode='} on {name!r}")
            elif not r.decodes_builtin():
                reasons.append(f"a decode assigned on the reader for {name!r}")
            elif r.python_per_sample:
                reasons.append(f"{type(r).__name__} (Python per packet) for {name!r}")
        return reasons

    @property
    def releases_gil(self) -> bool:
        """Whether building a batch is mostly decoding that releases the GIL (threads run it in parallel)."""
        return any(r.releases_gil for r in self.readers.values())

    def __repr__(self) -> str:
        mods = ", ".join(f"{n}={r!r}" for n, r in self.readers.items())
        return f"Zipped({mods}, {len(self)} samples{', by key' if self.by_key else ''})"


def _first_present(reader: Reader, raw: dict[str, list], n: int) -> tuple[list, list[str | None] | None]:
    """A reader's column of a batch read by ``store.read_many``, and, for a reader with
    alternatives (``"jpg;png"``), the field each value came from (None where none): a ``.gz``
    one is gunzipped and an error names the field the sample has."""
    if len(reader.fields) == 1:
        return raw[reader.field], None
    column: list = [None] * n
    picked: list[str | None] = [None] * n
    for f in reversed(reader.fields):  # the first present wins: it is written last
        for j, v in enumerate(raw[f]):
            if v is not None:
                column[j], picked[j] = v, f
    return column, picked


def _decode_column(
    reader: Reader, column: list, keys: list[str], share_memory: bool, fields: list[str | None] | None
) -> Any:
    """A batch's values of one reader. A reader with a transform decodes only: transforms run once
    every modality of the batch decoded, so a bad sample found later never makes them run twice."""
    # fields= only where there are alternatives: a subclass written before it took fields= works on
    picked = {} if fields is None else {"fields": fields}
    if reader.transform is not None:
        return reader.decoded_column(column, keys, **picked)
    return reader.from_column(column, keys, share_memory=share_memory, **picked)


def zip_readers(
    align: str = "strict",
    transforms: Mapping[str, Callable] | None = None,
    cache: SampleCache | None = None,
    **readers: Reader,
) -> Zipped:
    """Zip readers (possibly over different stores) into aligned samples named by the keywords.

    Same key sequence in every store -> zip by position (checked per sample);
    otherwise join by key. ``align="strict"`` raises naming the first missing keys;
    ``align="inner"`` keeps the intersection (``.report`` says what each side lost).

    >>> ds = mmloader.zip(image=mmloader.ImageReader("imgs.lmdb"),
    ...                   caption=mmloader.TextReader("caps/"))      # doctest: +SKIP
    >>> ds[0]["caption"]                                            # doctest: +SKIP
    """
    return Zipped(readers, align=align, transforms=transforms, cache=cache)
