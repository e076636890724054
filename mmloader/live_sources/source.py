"""``mmloader.live``: samples that arrive while training (a generator, a queue, a service).

A live source is a factory of iterables, one per reader of the run: ``factory(rank, world,
worker, workers)`` returns the samples of that slice (a queue partition, a shard of an API).
Samples are dicts of fields, as a WebDataset sample or a store record is; ``decode=`` turns
their encoded fields into a stored dataset's modalities with the same readers, so live and
stored samples batch together.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Mapping

from ..errors import LiveSourceError
from ..readers.base import Reader
from ..storage.detached import DetachedStore

SPLITS = ("factory", "deal")
ON_STALL = ("end", "raise")


class LiveSource:
    """A live source of samples; stream it with :class:`mmloader.Stream` (``steps=``), alone or in
    a :func:`mmloader.mix` with stored datasets. Made by :func:`live`, whose arguments it takes."""

    #: What :func:`mmloader.mix` and :class:`mmloader.Stream` recognise a live source by.
    is_live_source = True

    def __init__(
        self,
        factory: Callable[[int, int, int, int], Iterable[Any]],
        *,
        name: str = "live",
        decode: Any = None,
        split: str = "factory",
        buffer: int = 64,
        timeout: float = 60.0,
        on_stall: str = "end",
    ):
        if not callable(factory):
            raise TypeError(f"live() needs a factory(rank, world, worker, workers) -> iterable, got {factory!r}")
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: expected one of {', '.join(map(repr, SPLITS))}")
        if on_stall not in ON_STALL:
            raise ValueError(f"on_stall={on_stall!r}: expected one of {', '.join(map(repr, ON_STALL))}")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ValueError(f"buffer={buffer!r}: expected a number of samples >= 1")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout={timeout!r}: expected seconds > 0")
        self.factory, self.name, self.split = factory, str(name), split
        self.buffer, self.timeout, self.on_stall = buffer, float(timeout), on_stall
        self.readers, self.transforms = _decoders(decode, self.name)

    def __len__(self) -> int:
        raise TypeError(f"live source {self.name!r} has no length: a run over it is a number of steps")

    def open(self, rank: int, world: int, worker: int, workers: int) -> Iterable[Any]:
        """The iterable of one reader's slice (with ``split="deal"``: the whole stream, which the
        reader deals from; see :class:`mmloader.live_sources.fetch.Fetcher`)."""
        if self.split == "deal":
            return self.factory(0, 1, 0, 1)
        return self.factory(rank, world, worker, workers)

    def decode_sample(self, sample: Any, key: str) -> dict[str, Any]:
        """One produced sample as the stream's row: ``__key__`` (the sample's own, else ``key``)
        and each modality decoded by its reader, then its transform (or the fields as they are,
        without ``decode=``). A bad field raises :class:`mmloader.errors.SampleError` naming the
        sample's key, the field and this source."""
        if not isinstance(sample, Mapping):
            raise LiveSourceError(
                f"live source {self.name!r} yielded a {type(sample).__name__}: samples are dicts of fields "
                "(e.g. {'__key__': ..., 'jpg': b'...', 'txt': '...'})"
            )
        key = str(sample.get("__key__") or key)
        if not self.readers:
            return {**sample, "__key__": key}
        record = {**sample, "__key__": key}
        out: dict[str, Any] = {"__key__": key}
        for modality, reader in self.readers.items():
            value = reader.from_record(record)
            transform = self.transforms.get(modality)
            out[modality] = transform(value) if transform is not None else value
        return out

    @property
    def packed_modalities(self) -> list[str]:
        """Modalities delivered as encoded bytes, packed into one buffer per batch."""
        return [n for n, r in self.readers.items() if r.packs_bytes and n not in self.transforms]

    @property
    def releases_gil(self) -> bool:
        """Whether decoding this source's samples is mostly C that releases the GIL."""
        return any(r.releases_gil for r in self.readers.values())

    def python_work(self) -> list[str]:
        """User Python per sample: the factory's iterables, and transforms or custom decoders."""
        from ..readers.registry import BUILTIN_READERS

        reasons = [f"live source {self.name!r} (its iterables run Python per sample)"]
        reasons += [f"a transform on {m!r}" for m in self.transforms]
        reasons += [
            f"{type(r).__name__} on {m!r}"
            for m, r in self.readers.items()
            if type(r) not in BUILTIN_READERS or not r.decodes_builtin() or r.transform is not None
        ]
        return reasons

    def __repr__(self) -> str:
        mods = f", decode={sorted(self.readers)}" if self.readers else ""
        return f"LiveSource({self.name!r}, split={self.split!r}{mods})"


def _decoders(decode: Any, name: str) -> tuple[dict[str, Reader], dict[str, Callable[[Any], Any]]]:
    """(readers, transforms) from ``decode=``: None, a mapping of modality -> Reader, or a zipped
    dataset (its readers and transforms). Each reader is copied onto a detached store named
    after the source, so errors name the live source rather than some stored dataset."""
    if decode is None:
        return {}, {}
    if hasattr(decode, "readers") and isinstance(decode.readers, Mapping):  # mmloader.zip(...)
        readers, transforms = dict(decode.readers), dict(getattr(decode, "transforms", {}) or {})
    elif isinstance(decode, Mapping):
        readers, transforms = dict(decode), {}
    else:
        raise TypeError(
            f"decode= takes a mapping of modality -> Reader or an mmloader.zip(...) dataset, got {type(decode).__name__}"
        )
    out: dict[str, Reader] = {}
    for modality, reader in readers.items():
        if not isinstance(reader, Reader):
            raise TypeError(f"decode={{{modality!r}: ...}} must be a Reader, got {type(reader).__name__}")
        if modality.startswith("__"):
            raise ValueError(f"decode=: modality name {modality!r} is reserved")
        detached = copy.copy(reader)
        detached._field, detached._fields = reader.field, None  # resolved from its own store first
        detached.store = DetachedStore(f"live source {name!r}")
        out[modality] = detached
    return out, transforms


def live(
    factory: Callable[[int, int, int, int], Iterable[Any]],
    *,
    name: str = "live",
    decode: Any = None,
    split: str = "factory",
    buffer: int = 64,
    timeout: float = 60.0,
    on_stall: str = "end",
) -> LiveSource:
    """A source of samples produced while training, for :class:`mmloader.Stream` (``steps=``).

    >>> source = mmloader.live(lambda rank, world, worker, workers: my_queue_reader(rank * workers + worker))  # doctest: +SKIP
    >>> stream = mmloader.LiveStream(source, batch_size=32, steps=1000)                                           # doctest: +SKIP

    Args:
        factory: ``factory(rank, world, worker, workers)`` -> an iterable of sample dicts for that
            reader's slice; called anew for each pass in each reader. An iterable with
            ``state_dict()``/``load_state_dict()`` (e.g. a queue offset) is checkpointed with the
            loader and resumed exactly; any other resumes from the source's own position.
        name: the source's name in errors, logs, states and ``batch["__source__"]``.
        decode: how to decode fields: ``{"image": mmloader.ImageReader(None, "jpg"), ...}``
            (readers made with ``source=None``, or a stored dataset's own readers), or an
            ``mmloader.zip(...)`` dataset, whose readers and transforms are used. None: the
            sample's fields pass as they are (tensors, numbers, strings).
        split: ``"factory"``: the factory gives each reader its own slice; ``"deal"``: the
            factory's one stream (called as ``factory(0, 1, 0, 1)`` in every reader) is dealt out,
            sample ``i`` to reader ``i % readers``; it must then yield the same samples in every
            reader (a deterministic generator, not a shared queue).
        buffer: samples read ahead per reader, at most (a faster producer waits: memory is bounded).
        timeout: seconds to wait for a sample before the source counts as stalled.
        on_stall: ``"end"``: a stalled reader ends the pass, for every rank together;
            ``"raise"``: :class:`mmloader.errors.LiveSourceError`.
    """
    return LiveSource(factory, name=name, decode=decode, split=split, buffer=buffer, timeout=timeout, on_stall=on_stall)
