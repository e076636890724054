"""Exceptions. Every error names the file, shard, key or field it is about."""

from __future__ import annotations


class MMLoaderError(Exception):
    """Base class of every error mmloader raises on purpose."""


class FormatError(MMLoaderError):
    """A path is not a dataset mmloader can read, or its metadata is inconsistent."""


class KeyValidationError(MMLoaderError, ValueError):
    """A sample key (or field name) cannot be stored in the target format."""


class DuplicateKeyError(MMLoaderError, ValueError):
    """The same sample key was written twice."""


class SampleError(MMLoaderError):
    """One sample could not be read or decoded.

    ``key``, ``field`` and ``where`` (store path / shard) say which one, so a
    training job can log or skip it without guessing.
    """

    def __init__(self, message: str, *, key: str | None = None, field: str | None = None, where: str | None = None):
        parts = [message]
        loc = ", ".join(f"{k}={v!r}" for k, v in (("key", key), ("field", field), ("in", where)) if v)
        if loc:
            parts.append(f"[{loc}]")
        super().__init__(" ".join(parts))
        self.key, self.field, self.where = key, field, where


class DecodeError(SampleError):
    """A field's bytes are not what its reader expects (corrupt image, bad UTF-8, bad JSON...)."""


class SizeLimitError(SampleError):
    """A field or a decoded image is larger than the configured limit (decompression bomb guard)."""


class UnsafeFieldError(SampleError):
    """A field would need unpickling (code execution) and the user did not opt in."""


class RandomAccessError(MMLoaderError):
    """Random access was asked of data that can only be read sequentially (compressed shards)."""


class AlignmentError(MMLoaderError):
    """Readers zipped together do not hold the same samples."""


class ConfigError(MMLoaderError, ValueError):
    """An experiment config is wrong; the message names the offending config key."""


class ResumeError(MMLoaderError, ValueError):
    """A resume state that does not fit this stream (another seed, another dataset, unknown version)."""


class PlanChangedError(ResumeError):
    """A resume state belongs to another plan (sources, weights, batch size, filters...).

    ``changes`` lists what differs, one line each; ``Stream(on_change=...)`` says what to do
    instead of raising.
    """

    def __init__(self, message: str, changes: list[str]):
        super().__init__(message)
        self.changes = changes


class WorkerStalledError(MMLoaderError, TimeoutError):
    """DataLoader worker processes delivered no batch by the loader's deadline (``timeout=``); the
    message holds where each one was."""


class LiveSourceError(MMLoaderError):
    """A live source (:func:`mmloader.live`) failed: its iterable raised, it stalled past its
    timeout (``on_stall="raise"``), its producer process died, or another rank's source failed."""
