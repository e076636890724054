"""What ``mmloader.zip`` checks of its readers before any sample is read: each reads a field
every sample has (or is ``optional``), naming alike fields when not, and readers of one Hub
repository read one commit. Apart from :mod:`.zip` since these read only metadata, once."""

from __future__ import annotations

from typing import Mapping

from ..errors import AlignmentError
from ..readers.base import Reader


def check_one_commit(readers: Mapping[str, Reader]) -> None:
    """Readers of one Hub repository must read one commit: modalities of two commits would pair
    one version's images with another's captions."""
    seen: dict[tuple, tuple[str, str]] = {}
    for name, r in readers.items():
        hub = getattr(getattr(r.store, "location", None), "hub", None)
        if hub is None:
            continue
        repo = (hub.endpoint, hub.where.repo_id, hub.where.revision)
        first = seen.setdefault(repo, (name, hub.sha))
        if first[1] != hub.sha:
            raise AlignmentError(
                f"zip(): {first[0]}= reads hf://datasets/{hub.where.repo_id} at commit {first[1]} and {name}= at "
                f"{hub.sha}: open both at one revision (name the commit: @{first[1]})"
            )


def check_coverage(name: str, reader: Reader) -> None:
    """Every sample must have the reader's field (or one of its alternatives), unless the reader
    is ``optional``: checked from the per-field counts in the metadata, so a field that only some
    samples have (a table column holding nulls) fails here, naming it, the samples without it,
    ``optional=True`` and the other fields of the reader's kind, instead of at the first sample
    without it, mid-epoch."""
    store = reader.store
    counts = store.metadata.get("field_counts", {})
    found = [f for f in reader.fields if f in counts]
    if not found:
        raise AlignmentError(
            f"zip(): {name}= reads field {reader.field!r}, which {store.path} does not have (fields: {store.fields})"
        )
    covered, total = sum(counts[f] for f in found), len(store)
    if covered >= total or reader.optional:
        return
    table = getattr(store, "format", None) == "arrow"  # a column's missing values are its nulls
    if table and len(found) == 1:
        nulls = total - covered
        message = (
            f"zip(): {name}= reads column {reader.field!r} of {store.path}, which holds {nulls} "
            f"null{'s' if nulls != 1 else ''} (of its {total} rows)"
        )
    else:
        message = (
            f"zip(): {name}= reads field {reader.field!r}, which only {covered} of the {total} "
            f"samples of {store.path} have"
        )
    kind = reader_kind(reader)
    others = (
        {f: c for f, c in counts.items() if f not in reader.fields and c and field_kind(store, f) == kind}
        if kind != "bytes"  # raw bytes of no known kind: no other field is known to be alike
        else {}
    )
    if others:
        ranked = sorted(others, key=lambda f: -others[f])
        alt = ";".join([*reader.fields, *ranked[:3]])
        message += (
            f"; other {kind} {'columns' if table else 'fields'} there: "
            f"{', '.join(f'{f} ({others[f]})' for f in ranked[:6])}. Read alternatives with "
            f"field={alt!r} (each sample takes the first it has)"
        )
    lacking = max(total - covered, 0)
    rows = "rows" if table else "samples"
    message += (
        f". To read the {lacking} {rows} without it as missing, pass optional=True "
        f"({type(reader).__name__}(..., field={reader.field!r}, optional=True)): their samples leave {name!r} out "
        f"and batch['__present__'][{name!r}] says which rows have it"
    )
    raise AlignmentError(message)


def reader_kind(reader: Reader) -> str:
    """The kind of value a reader reads (a name of :data:`mmloader.readers.registry.KINDS`:
    ``image``, ``text``, ``label``...): its nearest built-in class's, or, for a plain
    :class:`~mmloader.Reader` (``decode=``, a subclass of it), the kind of the field it reads."""
    from ..readers.registry import KINDS

    by_class = {kind.cls: kind.name for kind in KINDS.values() if kind.cls is not Reader}
    for cls in type(reader).__mro__:
        if cls in by_class:
            return by_class[cls]
    return field_kind(reader.store, reader.fields[0]) if reader.fields else "bytes"


def field_kind(store, field: str) -> str:
    """The kind of value a store's field holds: what the store knows of it (a table's column type,
    an HF ``Image`` feature, the first bytes of a binary column), else what its name says
    (``jpg``: image, ``txt``: text, ``cls``: label...; ``bytes`` when it says nothing)."""
    from ..readers.registry import kind_for_field

    judge = getattr(store, "field_kind", None)
    known = judge(field) if callable(judge) else None
    return known or kind_for_field(field).name
