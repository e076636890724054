"""``Errors``: what a sample that cannot be read or decoded does to its batch."""

from __future__ import annotations

from dataclasses import dataclass

from .values import choice, whole

ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class Errors:
    """``policy="raise"`` (default): the error is raised, naming key, field and store.
    ``"skip"``: the sample is replaced by the next one of the plan (logged with its key and
    counted in :attr:`mmloader.Stream.skipped`), so batch counts stay equal; more than
    ``max_consecutive`` bad samples in a row raise (a dataset that is mostly broken is not
    silently skipped through). A stream takes ``errors="skip"`` as short for ``Errors("skip")``.

    >>> Errors("skip").policy
    'skip'
    >>> Errors("ignore")
    Traceback (most recent call last):
    ...
    ValueError: on_error='ignore': expected one of 'raise', 'skip'
    """

    policy: str = "raise"
    max_consecutive: int = 100

    def __post_init__(self) -> None:
        choice("on_error", self.policy, ON_ERROR)
        whole("max_consecutive_errors", self.max_consecutive, 0)

    @classmethod
    def of(cls, value: "Errors | str") -> "Errors":
        """An ``Errors`` from what a stream was given: one, or its policy's name."""
        if isinstance(value, Errors):
            return value
        if isinstance(value, str):
            return cls(value)
        raise TypeError(f"errors={value!r}: expected 'raise', 'skip' or mmloader.Errors(...)")
