"""What identifies a stored stream's plan in its states: sources (name, size, fingerprint,
selection), the mix, and every stage option that changes the plan. A state carries it, and a
resume compares it (:mod:`mmloader.planning.resume`) to refuse, or follow ``on_change`` for, a
state of another plan."""

from __future__ import annotations

from typing import Any

from ..align.identity import dataset_fingerprint


def plan_identity(stream: Any) -> dict:
    """The plan identity of ``stream`` (plain data)."""
    names = stream.mix.names if stream.mix is not None else ["dataset"]
    sources = []
    for name, ds in zip(names, stream.datasets):
        entry = {"name": name, "size": len(ds), "fingerprint": dataset_fingerprint(ds)}
        if getattr(ds, "selection", None) is not None:
            entry["subset"] = ds.selection
        sources.append(entry)
    lengths = stream.lengths
    return {
        **stream.order.identity(),
        "sources": sources,
        "mix": stream.mix.identity() if stream.mix is not None else None,
        **stream.batching.identity(),
        **(
            lengths.identity(stream)
            if lengths is not None
            else {"bucket_by": None, "bucket_window": None, "pack": None}
        ),
    }
