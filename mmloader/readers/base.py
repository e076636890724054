"""The reader protocol: one modality (field) of one store, decoded lazily."""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from typing import Any, Callable, Iterator, Sequence, cast

import numpy as np

from ..errors import DecodeError, SampleError, SizeLimitError
from ..storage import Store, open_store
from ..storage.base import KeysView
from ..storage.detached import DetachedStore

#: Refuse fields larger than this (bytes, after .gz decompression) unless raised per reader.
DEFAULT_MAX_FIELD_BYTES = 256 << 20


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise SizeLimitError(f"gzip field inflates beyond the {limit}-byte limit")
    if not d.eof:
        raise gzip.BadGzipFile("truncated gzip stream")
    return out


def accepts_views(decode: Callable) -> Callable:
    """Mark a reader's ``decode`` as accepting any bytes-like value (``memoryview`` too)."""
    decode.accepts_views = True  # type: ignore[attr-defined]
    return decode


def as_bytes(values: list) -> list:
    """``values`` with every bytes-like view copied into ``bytes`` (None and bytes kept)."""
    return [v if v is None or isinstance(v, bytes) else bytes(v) for v in values]


class Reader:
    """One field of a store, decoded on access. Subclass and override :meth:`decode`
    (or pass ``decode=``) to add a modality without touching mmloader.

    The store is opened lazily in the process that reads, and the reader pickles
    without handles, so it can be created in the main process and used in
    DataLoader workers (fork, spawn or forkserver).

    >>> class WavReader(Reader):                                     # doctest: +SKIP
    ...     def decode(self, data, key):
    ...         return torchaudio.load(io.BytesIO(data))[0]
    >>> wav = WavReader("speech.lmdb", field="wav"); wav[0]          # doctest: +SKIP

    ``decode`` (and ``transform=``) are the hooks: :func:`mmloader.zip` and batches read the
    store themselves and call them, not a subclass's ``__getitem__`` or ``from_record``.

    ``optional=True``: a sample may lack the field (a table column holding nulls, a field only
    some samples of a shard or LMDB have). Such a sample reads as None here; zipped, its sample
    leaves the modality out, and a batch says which rows have it in
    ``batch["__present__"][name]`` (the absent rows hold the collate's placeholder: zeros for
    tensors and numbers, None for the rest), as a mix's batches do. Without it, ``mmloader.zip``
    refuses a field that not every sample has.
    """

    default_field: str = ""
    #: Field names (extensions) this reader can read, in order of preference: without a field
    #: name it reads every one of them the dataset has, as alternatives (``"jpg;png"``).
    field_extensions: tuple[str, ...] = ()
    #: Whether decoding releases the GIL (C decoders), so threads decode batches in parallel.
    releases_gil: bool = False
    #: Whether decoding runs Python per sample all the same (e.g. PyAV's per-packet calls), so
    #: ``loader(backend="auto")`` prefers worker processes (measured faster for video and audio).
    python_per_sample: bool = False
    #: Whether values are encoded bytes to pack into one buffer per batch (``batching.pack``).
    packs_bytes: bool = False

    def __init__(
        self,
        source: str | os.PathLike | Store | None,
        field: str | None = None,
        *,
        decode: Callable[[bytes], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES,
        optional: bool = False,
    ):
        if not isinstance(optional, bool):
            raise TypeError(f"optional={optional!r}: expected True or False")
        #: Whether a sample may lack the field: it then reads as missing (see the class's text).
        self.optional = optional
        # None: no store, the reader decodes values handed to it (a live source's samples)
        self.store = open_store(source) if source is not None else DetachedStore()
        if field is None and not (
            self.default_field or self.field_extensions or type(self)._default_field is not Reader._default_field
        ):
            raise ValueError(f"{type(self).__name__} needs a field name")
        self._field = field  # None: the reader's default, resolved on first use (nothing opened here)
        self._fields: tuple[str, ...] | None = None
        if decode is not None and not callable(decode):
            raise TypeError(f"decode= must be a callable bytes -> value, got {decode!r}")
        self._decode_fn = decode
        self.transform = transform
        self.max_field_bytes = max_field_bytes

    def _default_field(self) -> str:
        if not self.field_extensions:
            return self.default_field
        try:
            present = self.store.metadata.get("field_counts", {})
        except Exception:  # metadata problems are reported where the store is used
            return self.default_field
        found = [f for ext in self.field_extensions for f in sorted(present) if f.lower() == ext]
        return ";".join(found) or self.default_field

    @property
    def field(self) -> str:
        """The field read, as given: ``"jpg"``, or alternatives ``"jpg;png"`` (WebDataset's
        spelling: each sample reads the first of them it has)."""
        if self._field is None:
            self._field = self._default_field()
        return self._field

    @property
    def fields(self) -> tuple[str, ...]:
        if self._fields is None:
            self._fields = tuple(f for f in self.field.split(";") if f)
        return self._fields

    @property
    def gzipped(self) -> bool:
        return any(f.endswith(".gz") for f in self.fields)

    # -- the map-style view ---------------------------------------------------
    def __len__(self) -> int:
        return len(self.store)

    @property
    def keys(self) -> KeysView:
        return self.store.keys

    def __getitem__(self, index: int) -> Any:
        return self.from_record(self.store.read(index, self.fields))

    def get(self, key: str) -> Any:
        return self.from_record(self.store.get(key, self.fields))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    @property
    def takes_views(self) -> bool:
        """Whether :meth:`from_column` accepts ``memoryview`` values (zero-copy store reads)
        as well as ``bytes``: only when the ``decode`` in use is marked :func:`accepts_views`
        (a subclass's own ``decode``, or ``decode=``, may call ``bytes`` methods)."""
        return (
            self._decode_fn is None
            and "decode" not in vars(self)
            and getattr(type(self).decode, "accepts_views", False)
        )

    # -- decoding -------------------------------------------------------------
    def pick(self, record: dict) -> tuple[str, Any]:
        """(field, bytes) of the first of this reader's fields the record has (bytes None if none)."""
        for f in self.fields:
            data = record.get(f)
            if data is not None:
                return f, data
        return self.field, None

    def from_record(self, record: dict) -> Any:
        """Decode this reader's field of a record returned by ``store.read``, then ``transform``
        (None, with ``optional=True``, for a record without the field)."""
        if self.optional and self.pick(record)[1] is None:
            return None
        return self.apply_transform(self.decode_record(record))

    def has_value(self, record: dict) -> bool:
        """Whether ``record`` holds one of this reader's fields."""
        return self.pick(record)[1] is not None

    def fuse(self, transform: Callable[[Any], Any]) -> tuple["Reader", Callable[[Any], Any] | None]:
        """This reader with as much of ``transform`` (run after it) as it can run itself, and the rest.

        The default runs nothing itself: ``(self, transform)``. :class:`ImageReader` takes a
        torchvision pipeline's crop, flip and normalisation (``zip(transforms=...)`` calls this).
        """
        return self, transform

    def apply_transform(self, value: Any) -> Any:
        """A decoded value -> the sample's value (``transform``, if any). What a sample cache
        and per-sample reads run after :meth:`decode_record`."""
        return self.transform(value) if self.transform is not None else value

    def inflated(self, data: bytes, field: str, key: str) -> bytes:
        """A ``.gz`` field's stored value gunzipped, within ``max_field_bytes`` (what filters
        read); a bad or oversized stream raises naming the sample."""
        try:
            return _gunzip(bytes(data), self.max_field_bytes)
        except SizeLimitError as e:
            raise SizeLimitError(str(e), key=key, field=field, where=self.store.path) from None
        except (OSError, zlib.error, EOFError) as e:
            raise DecodeError(f"cannot gunzip: {e}", key=key, field=field, where=self.store.path) from e

    def decode_record(self, record: dict) -> Any:
        """The decoded value, before ``transform`` (what a sample cache keeps: random
        transforms must run again on every access); None, with ``optional=True``, for a record
        without the field."""
        key = record["__key__"]
        field, data = self.pick(record)
        if data is None:
            if self.optional:
                return None
            raise SampleError(
                "sample has no such field (optional=True reads such samples as missing)",
                key=key,
                field=self.field,
                where=self.store.path,
            )
        if len(data) > self.max_field_bytes:
            raise SizeLimitError(
                f"field is {len(data)} bytes, over the {self.max_field_bytes}-byte limit (max_field_bytes)",
                key=key,
                field=field,
                where=self.store.path,
            )
        if field.endswith(".gz"):
            data = self.inflated(data, field, key)
        try:
            return self.decode(data, key)
        except SampleError as e:
            if e.key is None:  # add the location the decoder could not know
                raise type(e)(str(e), key=key, field=field, where=self.store.path) from e
            raise
        except Exception as e:
            raise DecodeError(
                f"cannot decode: {type(e).__name__}: {e}", key=key, field=field, where=self.store.path
            ) from e

    def plain_column(self, datas: list) -> bool:
        """Whether a batch can take a reader's whole-batch fast path: built-in decoding, no
        transform, no ``.gz``, every value present and within ``max_field_bytes`` (anything else
        goes sample by sample, where problems are reported by key)."""
        return (
            self.transform is None
            and not self.gzipped
            and self.decodes_builtin()
            and self.all_present_within_limit(datas)
        )

    def decodes_builtin(self) -> bool:
        """Whether values go through the built-in reader's own ``decode``: no ``decode=``, and
        no subclass (or assignment on this reader) replacing ``decode``, which fast paths skip."""
        return (
            self._decode_fn is None
            and "decode" not in vars(self)
            # mypy takes a class for unhashable when it defines (its instances') __hash__
            and decode_is_builtin(type(self))  # type: ignore[arg-type]
        )

    def all_present_within_limit(self, datas: list) -> bool:
        """Every value present and at most ``max_field_bytes`` (one pass in C: a batch's check
        costs ~1 us instead of ~5 us of Python per value)."""
        try:
            return max(map(len, datas), default=0) <= self.max_field_bytes
        except TypeError:  # len(None): a value is absent
            return False

    def from_column(
        self,
        datas: list[bytes | None],
        keys: list[str],
        *,
        share_memory: bool = False,
        fields: Sequence[str | None] | None = None,
    ) -> Any:
        """Decode this field for a whole batch (a list of values, or a packed column), then ``transform``.

        ``share_memory``: the batch will be sent to another process (a DataLoader worker's
        output), so a reader that allocates the batch tensor itself may put it in shared memory.
        ``fields``: the field each value was read from, when this reader has alternatives
        (``"txt;txt.gz"``: a ``.gz`` one is gunzipped, and an error names it); None: its first.
        """
        values = self.decoded_column(datas, keys, fields=fields)
        if self.transform is None:
            return values
        return [None if v is None and d is None else self.transform(v) for v, d in zip(values, datas)]

    def decoded_column(
        self, datas: list[bytes | None], keys: list[str], *, fields: Sequence[str | None] | None = None
    ) -> list:
        """The batch's values decoded, before ``transform``: a bad sample raises here, naming its
        key and field, before any transform ran (a batch built again sample by sample then runs
        each transform once, as an uninterrupted one would). ``fields``: see :meth:`from_column`."""
        if not self.gzipped and self.all_present_within_limit(datas):
            try:  # the common case without per-sample bookkeeping
                present = cast("list[bytes]", datas)  # all present (checked above)
                return [self.decode(d, k) for d, k in zip(present, keys)]
            except Exception:
                pass  # redo sample by sample: the error must name its key
        picked = fields if fields is not None else [self.fields[0]] * len(keys)
        return [
            self.decode_record({"__key__": k, f or self.fields[0]: d} if d is not None else {"__key__": k})
            for d, k, f in zip(datas, keys, picked)
        ]

    def token_counts(self, rows: Sequence[int]) -> np.ndarray:
        """The tokens each of store rows ``rows`` holds, known without decoding them (what
        token-budget packing plans with). Readers of token ids override it.

        Args:
            rows: rows of this reader's store.
        """
        raise TypeError(
            f"{type(self).__name__} cannot tell a sample's tokens without decoding it: store token ids "
            "(`mmloader convert textlines --tokenizer`), read text with TextReader(tokenizer=...), or give "
            "Stream(length_by=mmloader.tokens(..., length=index -> tokens))"
        )

    def decode(self, data: bytes, key: str) -> Any:
        """Turn a field's bytes into a value. The default returns the bytes (or applies ``decode=``)."""
        return self._decode_fn(data) if self._decode_fn is not None else data

    def __repr__(self) -> str:
        optional = ", optional=True" if self.optional else ""
        return f"{type(self).__name__}({self.store.path!r}, field={self.field!r}{optional})"


@functools.lru_cache(maxsize=None)
def decode_is_builtin(cls: type[Reader]) -> bool:
    """Whether ``cls`` decodes with its built-in reader's ``decode`` (no subclass overrides it):
    whole-batch fast paths bypass ``decode``, so a subclass that overrides it reads sample by sample.

    >>> class Upper(mmloader.TextReader):                       # doctest: +SKIP
    ...     def decode(self, data, key): return bytes(data).decode().upper()
    >>> decode_is_builtin(Upper), decode_is_builtin(mmloader.TextReader)   # doctest: +SKIP
    (False, True)
    """
    # mmloader's own readers are the classes defined in this package (the registry's kinds and
    # the companions); the nearest of them in the MRO is the built-in one ``cls`` extends.
    builtin = cast("type[Reader]", next(c for c in cls.__mro__ if c.__module__.startswith(f"{__package__}.")))
    return cls.decode is builtin.decode
