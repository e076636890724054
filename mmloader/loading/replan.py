"""``on_change="continue"``: the rest of a saved epoch under a changed plan, without repeats.

The old plan is rebuilt from the identity the state records
(:func:`mmloader.planning.epoch.plan_from_identity`) and the samples it had delivered are
found there — everything of that epoch the state does not leave to visit, so samples left
out by an earlier change of the same epoch count as delivered too; the new plan's epoch is
then visited without those samples (:func:`mmloader.planning.replan.kept_ranges`). A source
of the old plan is a source of the new one when it has the same name, or else the same
fingerprint (a one-source run that becomes a mix), and holds the same samples or another
selection of the same dataset (rebuilt from the selection the state records). What that means:

* no sample is delivered twice in the epoch (beyond the repeats the new plan itself has,
  upsampling);
* every sample of the new plan's epoch that was not yet delivered is delivered once, so the
  epoch's length is what was delivered plus what is left; with single-source batches
  (``batch_composition="source"``) a batch that was partly delivered is left out whole;
* samples of a dataset that changed (rewritten, grown) are another source's: those delivered
  before may come again; a new source joins for the rest of the epoch;
* what was delivered and the new plan does not hold (a source removed for now, samples a filter
  leaves out) is carried in the state, so a later plan of the epoch that holds it again leaves it
  out too.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..align.select import reselect
from ..errors import PlanChangedError, ResumeError
from ..planning.epoch import plan_from_identity
from ..planning.partition import remaining_ranges, unrepeated_remaining
from ..planning.replan import carried_over, delivered_positions, kept_ranges, sample_ids, whole_units
from .stages.lengths import modality_lengths

log = logging.getLogger("mmloader")


def continue_ranges(stream: Any, state: dict) -> tuple[list[tuple[int, int]], list[dict]]:
    """Ranges of ``stream``'s plan for ``state``'s epoch that are left once the samples
    ``state`` had delivered are taken out, and the delivered samples this plan does not hold
    (as :func:`carried_samples`): a later change in the epoch must still leave them out.

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
    match = match_sources(old["sources"], now["sources"])
    old_plan = plan_from_identity(
        old, seed=int(old.get("seed", state["seed"])), epoch=epoch, lengths=_old_lengths(stream, old, match)
    )
    if state.get("unrepeated"):
        left = unrepeated_remaining(state["ranges"], state["world"], state["consumed"])
    else:
        left = remaining_ranges(
            state["ranges"], state["world"], state["samples_per_rank"], state["consumed"], keep_padding=False
        )
    if any(b > len(old_plan) for _a, b in left):
        raise ResumeError(f"the state does not fit its own plan ({len(old_plan)} positions)")
    positions = delivered_positions(len(old_plan), left)
    src, idx = old_plan.lookup(positions)
    slots, rows, away = [], [], []
    for s in np.unique(src).tolist():
        j = match.get(s)
        r = None if j is None else _old_rows(stream.datasets[j], now["sources"][j], old["sources"][s], idx[src == s])
        if r is None:  # a source removed, or another dataset under its name: not in this plan, carried on
            away.append({"name": old["sources"][s]["name"], "fingerprint": old["sources"][s]["fingerprint"]})
            away[-1]["indices"] = idx[src == s].tolist()  # (a later plan with this very source takes them out)
            continue
        slots.append(np.full(len(r), j, dtype=np.int64))
        rows.append(r)
    delivered = sample_ids(np.concatenate(slots), np.concatenate(rows)) if slots else np.empty(0, np.int64)
    # what earlier plans of the epoch delivered and the saved one did not hold
    earlier, unplaced = _carried_ids(stream, state.get("carried") or [], now["sources"])
    delivered = np.concatenate([delivered, earlier])
    new_plan = stream.plan(epoch)
    nsrc, nidx = new_plan.lookup(np.arange(len(new_plan), dtype=np.int64))
    nrows = np.empty_like(nidx)
    for j in np.unique(nsrc).tolist():
        sel = nsrc == j
        nrows[sel] = _rows(stream.datasets[j], nidx[sel])
    ids = sample_ids(nsrc, nrows)
    ranges = whole_units(kept_ranges(ids, delivered), len(new_plan), new_plan.unit)
    return ranges, carried_samples(carried_over(ids, delivered), now["sources"]) + unplaced + away


def carried_samples(ids: np.ndarray, sources: list[dict]) -> list[dict]:
    """Sample ids (:func:`~mmloader.planning.replan.sample_ids` of this plan's source slots) as
    plain data a state keeps: per source, its name, the fingerprint of the dataset it selects
    from and the rows (a row delivered twice listed twice). Samples of a source this plan does
    not have are kept by the source's own fingerprint and their indices in it."""
    out = []
    slots, rows = np.divmod(np.asarray(ids, dtype=np.int64), 1 << 40)
    for j in np.unique(slots).tolist():
        out.append({"name": sources[j]["name"], "base": _base(sources[j]), "rows": rows[slots == j].tolist()})
    return out


def _carried_ids(stream: Any, carried: list[dict], sources: list[dict]) -> tuple[np.ndarray, list[dict]]:
    """The ids in this plan of samples a state carries, and the entries no source here holds
    (a source that is gone, or whose dataset changed: carried on, in case it comes back)."""
    parts, unplaced = [np.empty(0, np.int64)], []
    for entry in carried:
        for j, source in enumerate(sources):
            if source["name"] != entry.get("name"):
                continue
            if "rows" in entry and _base(source) == entry.get("base"):
                rows = np.asarray(entry["rows"], dtype=np.int64)
            elif "indices" in entry and source["fingerprint"] == entry.get("fingerprint"):
                rows = _rows(stream.datasets[j], np.asarray(entry["indices"], dtype=np.int64))
            else:
                continue
            parts.append(sample_ids(np.full(len(rows), j), rows))
            break
        else:
            unplaced.append(entry)
    return np.concatenate(parts), unplaced


def changed_plan_target(
    stream: Any, state: dict, changed: PlanChangedError, report: bool
) -> tuple[int, list[tuple[int, int]] | None, int, list[dict]]:
    """What a resume from another plan's ``state`` does under ``stream.on_change``
    (``"next_epoch"`` or ``"continue"``): (epoch, plan ranges to visit or None for the epoch from
    its start, steps done before, delivered samples carried on: :func:`continue_ranges`);
    ``report``: log it (once, when the resume is applied)."""
    steps = int(state.get("steps", state.get("consumed", 0) // (state.get("batch_size") or 1)))
    what = "; ".join(changed.changes)
    if stream.on_change == "next_epoch":
        epoch = int(state["epoch"]) + (1 if state["consumed"] else 0)
        (log.warning if report else log.debug)(
            "resume: the plan changed (%s); on_change='next_epoch': the rest of epoch %d is "
            "not delivered, the new plan starts at epoch %d",
            what,
            state["epoch"],
            epoch,
        )
        return epoch, None, 0, []
    ranges, carried = continue_ranges(stream, state)
    (log.warning if report else log.debug)(
        "resume: the plan changed (%s); on_change='continue': epoch %d goes on under the new "
        "plan with %d samples not yet delivered",
        what,
        state["epoch"],
        sum(b - a for a, b in ranges),
    )
    return int(state["epoch"]), ranges, steps, carried


def match_sources(old: list[dict], new: list[dict]) -> dict[int, int]:
    """Old source -> new source: by name, then (for those left) by the samples they hold.

    >>> match_sources([{"name": "dataset", "fingerprint": "f"}], [{"name": "a", "fingerprint": "f"}])
    {0: 0}
    """
    names = {s["name"]: j for j, s in enumerate(new)}
    out = {i: names[s["name"]] for i, s in enumerate(old) if s["name"] in names}
    free = [j for j in range(len(new)) if j not in out.values()]
    for i, s in enumerate(old):
        if i in out:
            continue
        same = [j for j in free if _base(new[j]) == _base(s) and _base(s) is not None]
        if len(same) == 1:
            out[i] = same[0]
            free.remove(same[0])
    return out


def _base(source: dict) -> str | None:
    """The fingerprint of the unselected dataset a source reads."""
    return (source.get("subset") or {}).get("base") or source.get("fingerprint")


def _rows(dataset: Any, indices: np.ndarray) -> np.ndarray:
    """Rows in the unselected dataset (its primary store) of samples ``indices``."""
    positions = getattr(dataset, "positions", None)
    return positions[indices] if positions is not None else indices


def _old_rows(dataset: Any, now: dict, old: dict, indices: np.ndarray) -> np.ndarray | None:
    """Rows (as :func:`_rows`) of the old plan's samples ``indices`` of a source, or None when
    the old source was another dataset."""
    if old["fingerprint"] is not None and old["fingerprint"] == now["fingerprint"]:
        return _rows(dataset, indices)
    if old["fingerprint"] is None and now["fingerprint"] is None and old["size"] == now["size"]:
        return _rows(dataset, indices)  # a dataset that cannot be identified: taken for the same (warned)
    old_sel = old.get("subset")
    if _base(old) is None or _base(old) != _base(now):
        return None
    if old_sel is None:  # the old plan read the whole dataset
        return _rows(getattr(dataset, "_unselected", None) or dataset, indices)
    positions = reselect(dataset, old_sel)
    if positions is None:
        raise ResumeError(
            f"on_change='continue': the saved selection of source {old['name']!r} cannot be rebuilt "
            "(it was made from a key list); use on_change='next_epoch'"
        )
    return positions[indices]


def _old_lengths(stream: Any, old: dict, match: dict[int, int]):
    """Sample lengths of the old plan's sources, when it bucketed: only where they are unchanged."""
    bucket = old.get("bucket_by")
    if bucket is None:
        return None
    for s, entry in enumerate(old["sources"]):
        j = match.get(s)
        if j is None or stream.identity()["sources"][j]["fingerprint"] != entry["fingerprint"]:
            raise ResumeError(
                f"on_change='continue': the saved plan is bucketed and source {entry['name']!r} changed, "
                "so its order cannot be rebuilt; use on_change='next_epoch'"
            )
    slot = np.array([match[s] for s in range(len(old["sources"]))], dtype=np.int64)
    modality = bucket.get("modality")
    if modality is not None:
        return lambda sources, indices: modality_lengths(stream.datasets, slot[sources], indices, modality)
    if stream.identity().get("bucket_by") != bucket:
        raise ResumeError(
            "on_change='continue': the saved plan bucketed by a function this stream does not have "
            f"({bucket['callable']}); use on_change='next_epoch'"
        )
    return lambda sources, indices: stream.lengths.lengths(stream, slot[sources], indices)
