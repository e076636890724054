"""A store with no samples, for readers that decode values handed to them (live sources)."""

from __future__ import annotations

from typing import Any, Sequence

from .base import Store


class DetachedStore(Store):
    """What ``Reader(None, ...)`` reads: nothing. Such a reader only decodes values given to it
    (a live source's samples, :meth:`mmloader.Reader.from_record`); reading by index fails, naming why.

    Args:
        name: what error messages call the values' origin.
    """

    format = "none"

    def __init__(self, name: str = "(no store: values given to the reader)"):
        self.path = name

    @property
    def metadata(self) -> dict:
        return {"fields": [], "field_counts": {}}

    def __len__(self) -> int:
        return 0

    def _refuse(self) -> Any:
        raise TypeError(
            "this reader has no store (it was made with source=None): it decodes values handed to it "
            "(e.g. by mmloader.live), it has no samples to read by index"
        )

    def key(self, index: int) -> str:
        return self._refuse()

    def index_of(self, key: str) -> int | None:
        return None

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        return self._refuse()
