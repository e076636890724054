"""``on_change="continue"``: the rest of a saved epoch under a changed plan, without repeats.

The old plan is rebuilt from the identity the state records
(:func:`mmloader.planning.epoch.plan_from_identity`) and the samples it had delivered are
found there; the new plan's epoch is then visited without those samples
(:func:`mmloader.planning.replan.kept_ranges`). A source is the same source in both plans
when it has the same name and holds the same samples, or another selection of the same
dataset (rebuilt from the selection the state records). What that means:

* no sample is delivered twice in the epoch (beyond the repeats the new plan itself has,
  upsampling);
* every sample of the new plan's epoch that was not yet delivered is delivered once, so the
  epoch's length is what was delivered plus what is left;
* samples of a removed source, or of a dataset replaced by another, are simply not there
  any more; a new source joins for the rest of the epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..align.select import reselect
from ..errors import ResumeError
from ..planning.epoch import plan_from_identity
from ..planning.replan import delivered_positions, kept_ranges, sample_ids


def continue_ranges(stream: Any, state: dict) -> list[tuple[int, int]]:
    """Ranges of ``stream``'s plan for ``state``'s epoch that are left once the samples
    ``state`` had delivered are taken out.

    Args:
        stream: the :class:`mmloader.Stream` resuming.
        state: its saved state (of another plan).

    Raises:
        ResumeError: the old plan cannot be rebuilt (a state without a plan identity, a
            bucketed plan whose sources changed, a selection by a key list not known here).
    """
    old = state.get("plan")
    if not old:
        raise ResumeError("on_change='continue' needs a state that records its plan (saved by mmloader >= 0.2)")
    epoch = int(state["epoch"])
    now = stream.identity()
    slot_of = {s["name"]: j for j, s in enumerate(now["sources"])}
    old_plan = plan_from_identity(old, seed=stream.seed, epoch=epoch, lengths=_old_lengths(stream, old, slot_of))
    positions = delivered_positions(state["ranges"], state["world"], state["samples_per_rank"], state["consumed"])
    if len(positions) and positions.max() >= len(old_plan):
        raise ResumeError(f"the state does not fit its own plan: position {positions.max()} of {len(old_plan)}")
    src, idx = old_plan.lookup(positions)
    slots, rows = [], []
    for s in np.unique(src).tolist():
        entry = old["sources"][s]
        j = slot_of.get(entry["name"])
        if j is None:
            continue  # a source removed: its samples are not in the new plan
        r = _old_rows(stream.datasets[j], now["sources"][j], entry, idx[src == s])
        if r is not None:  # None: another dataset under that name
            slots.append(np.full(len(r), j, dtype=np.int64))
            rows.append(r)
    delivered = sample_ids(np.concatenate(slots), np.concatenate(rows)) if slots else np.empty(0, np.int64)
    new_plan = stream.plan(epoch)
    nsrc, nidx = new_plan.lookup(np.arange(len(new_plan), dtype=np.int64))
    nrows = np.empty_like(nidx)
    for j in np.unique(nsrc).tolist():
        sel = nsrc == j
        nrows[sel] = _rows(stream.datasets[j], nidx[sel])
    return kept_ranges(sample_ids(nsrc, nrows), delivered)


def _rows(dataset: Any, indices: np.ndarray) -> np.ndarray:
    """Rows in the unselected dataset (its primary store) of samples ``indices``."""
    positions = getattr(dataset, "positions", None)
    return positions[indices] if positions is not None else indices


def _old_rows(dataset: Any, now: dict, old: dict, indices: np.ndarray) -> np.ndarray | None:
    """Rows (as :func:`_rows`) of the old plan's samples ``indices`` of a source, or None when
    the old source was another dataset."""
    if old["fingerprint"] == now["fingerprint"]:
        return _rows(dataset, indices)
    old_sel, now_base = old.get("subset"), (now.get("subset") or {}).get("base", now["fingerprint"])
    if old_sel is None:
        if old["fingerprint"] != now_base:
            return None
        base = getattr(dataset, "_unselected", None) or dataset  # the old plan read the whole dataset
        return _rows(base, indices)
    if old_sel["base"] != now_base:
        return None
    positions = reselect(dataset, old_sel)
    if positions is None:
        raise ResumeError(
            f"on_change='continue': the saved selection of source {old['name']!r} cannot be rebuilt "
            "(it was made from a key list); use on_change='next_epoch'"
        )
    return positions[indices]


def _old_lengths(stream: Any, old: dict, slot_of: dict[str, int]):
    """Sample lengths of the old plan's sources, when it bucketed: only where they are unchanged."""
    if old.get("bucket_by") is None:
        return None
    now = stream.identity()
    if old["bucket_by"] != now["bucket_by"] or stream.bucket_by is None:
        raise ResumeError("on_change='continue': the saved plan bucketed by another length; use 'next_epoch'")
    mapping = np.full(len(old["sources"]), -1, dtype=np.int64)
    for s, entry in enumerate(old["sources"]):
        j = slot_of.get(entry["name"])
        if j is None or now["sources"][j]["fingerprint"] != entry["fingerprint"]:
            raise ResumeError(
                f"on_change='continue': the saved plan is bucketed and source {entry['name']!r} changed, "
                "so its order cannot be rebuilt; use on_change='next_epoch'"
            )
        mapping[s] = j

    def lengths(sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return stream._lengths(mapping[sources], indices)

    return lengths
