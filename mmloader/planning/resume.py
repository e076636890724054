"""Resume state: where a rank is in an epoch, as plain data, and what is left of the epoch.

A state records the epoch, the plan ranges of the pass, how many samples each
rank has delivered and the identity of the plan (its sources and their
fingerprints, weights, batch size, bucketing, filters); resuming is then
arithmetic (:func:`remaining_ranges`): the same world size gets exactly the
batches an uninterrupted run would have delivered, another world size every
unseen sample once. A state of another plan is never resumed silently
(:func:`plan_changes` says what differs).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import PlanChangedError, ResumeError
from .partition import remaining_ranges, unrepeated_remaining

STATE_VERSION = 3
#: States before the plan identity was recorded: resumed with a warning (nothing to check against).
OLD_STATE_VERSIONS = (1,)
#: States whose source fingerprints hashed only some of the keys (before 2026-12): their
#: fingerprints are not compared (see :func:`upgraded`); everything else of the plan is.
SAMPLED_FINGERPRINT_VERSIONS = (2,)


def progress_state(
    *,
    seed: int,
    epoch: int,
    world: int,
    plan_len: int,
    ranges: list,
    samples_per_rank: int,
    consumed: int,
    batch_size: int | None,
    drop_last: bool,
    steps: int | None = None,
    plan: dict | None = None,
    unrepeated: bool = False,
) -> dict:
    """The state after every rank delivered ``consumed`` of its ``samples_per_rank`` samples.

    ``plan``: the identity of the plan (plain data, see :func:`plan_changes`), checked on resume.
    ``unrepeated``: ranks split the visit without repeats (``Stream(padding="mask")``).

    ``steps``: batches (samples unbatched) each rank has delivered of this epoch in all,
    counting passes before a resume (default: those of ``consumed``): what a framework
    restored from the same checkpoint counts as the epoch's steps done.

    >>> progress_state(seed=0, epoch=2, world=1, plan_len=8, ranges=[[0, 8]], samples_per_rank=8,
    ...                consumed=4, batch_size=4, drop_last=False)["consumed"]
    4
    """
    return {
        "version": STATE_VERSION,
        "seed": int(seed),
        "epoch": int(epoch),
        "world": int(world),
        "plan_len": int(plan_len),
        "ranges": [list(map(int, r)) for r in ranges],
        "samples_per_rank": int(samples_per_rank),
        "consumed": min(int(consumed), int(samples_per_rank)),
        "batch_size": batch_size,
        "drop_last": bool(drop_last),
        "steps": int(consumed) // (batch_size or 1) if steps is None else int(steps),
        "plan": plan,
        **({"unrepeated": True} if unrepeated else {}),
    }


def plan_changes(saved: dict | None, current: dict | None) -> list[str]:
    """What differs between two plan identities, one line each (empty: the same plan).

    An identity is ``{"sources": [{"name", "size", "fingerprint", ...}], "mix": {...} | None,
    option: value, ...}``.

    >>> a = {"sources": [{"name": "a", "size": 10, "fingerprint": "x"}], "batch_size": 4}
    >>> plan_changes(a, {**a, "batch_size": 3})
    ['batch_size: 4 -> 3']
    """
    if saved is None or current is None:
        return []
    out: list[str] = []
    old = {s["name"]: s for s in saved.get("sources", [])}
    new = {s["name"]: s for s in current.get("sources", [])}
    out += [f"source {n!r} removed" for n in old if n not in new]
    out += [f"source {n!r} added" for n in new if n not in old]
    for name in (n for n in old if n in new):
        a, b = old[name], new[name]
        if _steps(a.get("subset")) != _steps(b.get("subset")):
            out.append(f"source {name!r}: selection {_selection(a.get('subset'))} -> {_selection(b.get('subset'))}")
        if a["size"] != b["size"]:
            out.append(f"source {name!r}: {a['size']} samples -> {b['size']}")
        elif a["fingerprint"] != b["fingerprint"]:
            out.append(f"source {name!r}: other samples, same count ({a['size']}): another dataset or selection")
    if [n for n in old if n in new] != [n for n in new if n in old]:
        out.append(f"sources reordered: {list(old)} -> {list(new)}")
    mix_a, mix_b = saved.get("mix") or {}, current.get("mix") or {}
    if bool(mix_a) != bool(mix_b):
        out.append("mixed -> not mixed" if mix_a else "not mixed -> mixed")
    if mix_a and mix_b:
        differ = [k for k in sorted(set(mix_a) | set(mix_b)) if k != "names" and mix_a.get(k) != mix_b.get(k)]
        if differ != ["quotas"]:  # quotas follow from the rest: named only when nothing else says why
            differ = [k for k in differ if k != "quotas"]
        out += [f"mix {k}: {_show(mix_a.get(k))} -> {_show(mix_b.get(k))}" for k in differ]
    for k in sorted((set(saved) | set(current)) - {"sources", "mix"}):
        out += _differences(k, saved.get(k), current.get(k))
    return out


def _differences(name: str, a, b) -> list[str]:
    """``name: a -> b``, or for two settings (dicts) the fields that differ, each by its path.

    >>> _differences("pack", {"tokens": 64, "balance": None}, {"tokens": 64, "balance": "tokens"})
    ["pack.balance: none -> 'tokens'"]
    """
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for k in sorted(set(a) | set(b)) for line in _differences(f"{name}.{k}", a.get(k), b.get(k))]
    return [f"{name}: {_show(a)} -> {_show(b)}"]


def _show(value) -> str:
    return "none" if value is None else repr(value)


def _steps(selection: dict | None) -> list:
    return (selection or {}).get("steps", [])


def _selection(selection: dict | None) -> str:
    """A selection as a person reads it: ``where 'a > 1', then limit 10``."""
    parts = []
    for step in _steps(selection):
        said = []
        if step.get("where"):
            said.append(f"where {step['where']!r}")
        if step.get("keys"):
            said.append(f"{step['keys']['count']} keys")
        if step.get("fraction") is not None:
            said.append(f"fraction {step['fraction']} (seed {step.get('seed', 0)})")
        if step.get("limit") is not None:
            said.append(f"limit {step['limit']}")
        parts.append(" ".join(said) or "all")
    return "(" + ", then ".join(parts) + ")" if parts else "none (all samples)"


def upgraded(state: dict, plan: dict | None) -> dict:
    """``state`` as this version checks it. A version-2 state's source fingerprints digested a
    sample of the keys; today's digest every key, so they cannot match: each source of the same
    name and size takes the current fingerprint (said once in a warning), and every other part of
    the plan identity is still compared.

    >>> old = {"version": 2, "plan": {"sources": [{"name": "a", "size": 3, "fingerprint": "old"}]}}
    >>> import warnings; warnings.simplefilter("ignore")
    >>> upgraded(old, {"sources": [{"name": "a", "size": 3, "fingerprint": "new"}]})["plan"]["sources"][0]["fingerprint"]
    'new'
    """
    if not isinstance(state, dict) or state.get("version") not in SAMPLED_FINGERPRINT_VERSIONS:
        return state
    saved, now = state.get("plan"), {s["name"]: s for s in (plan or {}).get("sources", [])}
    sources = []
    for source in (saved or {}).get("sources", []):
        current = now.get(source["name"])
        if current is not None:  # the same name: taken for the same dataset (said in the warning)
            base = (current.get("subset") or {}).get("base") or current["fingerprint"]
            if source.get("subset"):
                source = {**source, "subset": {**source["subset"], "base": base}}
            same_selection = _steps(source.get("subset")) == _steps(current.get("subset"))
            if same_selection and current["size"] == source["size"]:
                source = {**source, "fingerprint": current["fingerprint"]}
            elif not source.get("subset"):
                source = {**source, "fingerprint": base}  # the whole dataset, another selection now
        sources.append(source)
    if saved:
        warnings.warn(
            "a stream state of version 2 (saved by an older mmloader, whose dataset fingerprints hashed only "
            "some keys): resumed without checking that its sources hold the same samples (their names, sizes, "
            "selections, the mix and every option are checked)",
            stacklevel=3,
        )
    return {**state, "version": STATE_VERSION, **({"plan": {**saved, "sources": sources}} if saved else {})}


def check_state(state: dict, *, seed: int, plan: dict | None = None) -> None:
    """Raise unless ``state`` is a state of this plan: the version, the seed, then the plan
    identity (:class:`mmloader.errors.PlanChangedError` listing what changed).

    Args:
        state: a saved state (:func:`progress_state`).
        seed: the stream's seed.
        plan: the stream's plan identity now.
    """
    if not isinstance(state, dict) or "version" not in state:
        raise ResumeError(f"not a stream state (a dict from state_dict()): {type(state).__name__}")
    version = state["version"]
    if version in OLD_STATE_VERSIONS:
        warnings.warn(
            f"a stream state of version {version} (saved by an older mmloader) records no plan identity: "
            "resumed without checking that its sources, weights and batch size are still the same",
            stacklevel=3,
        )
    elif version != STATE_VERSION:
        raise ResumeError(f"unknown stream state version {version!r}")
    check_fields(state)
    if state["seed"] != seed and not state.get("plan"):  # (with a plan identity: one of its changes)
        raise ResumeError(f"state was saved with seed {state['seed']}, this stream has seed {seed}")
    unknown = [s["name"] for s in (plan or {}).get("sources", []) if s.get("fingerprint") is None]
    if unknown and state.get("plan"):
        warnings.warn(
            f"source(s) {unknown} cannot be identified (a dataset without fingerprint()): resumed without "
            "checking that they hold the same samples as when the state was saved",
            stacklevel=3,
        )
    changes = plan_changes(state.get("plan"), plan)
    if changes:
        raise PlanChangedError(
            "the state was saved for another plan (the experiment changed since): "
            + "; ".join(changes)
            + ". Resume with the same config, or choose Stream(on_change='next_epoch') (start the new "
            "plan at the next epoch)"
            + (
                ""
                if (plan or {}).get("pack")  # (packed rows cannot go on under another plan)
                else " or on_change='continue' (the rest of this epoch without the samples already delivered)"
            ),
            changes,
        )


def check_fields(state: dict) -> None:
    """Refuse a state whose numbers cannot be a loader's (hand-edited, or of another tool),
    naming the field: a resume from it would deliver a wrong share of the epoch."""

    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def whole(name: str, low: int = 0, optional: bool = False) -> int:
        value = state.get(name)
        if optional and value is None:
            return 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ResumeError(f"stream state field {name!r} is {value!r}: expected an integer >= {low}")
        return value

    whole("epoch")
    whole("world", 1)
    plan_len = whole("plan_len")
    per_rank, consumed = whole("samples_per_rank"), whole("consumed")
    for name in ("steps", "step_offset", "ended_after_steps"):
        whole(name, optional=True)
    ranges = state.get("ranges")
    if not isinstance(ranges, list) or any(
        not isinstance(r, (list, tuple)) or len(r) != 2 or not all(map(integer, r)) or not 0 <= r[0] <= r[1] <= plan_len
        for r in ranges
    ):
        raise ResumeError(
            f"stream state field 'ranges' is {ranges!r}: expected [start, stop] integer pairs within the "
            f"plan's {plan_len} positions"
        )
    visit = sum(b - a for a, b in ranges)
    if consumed > per_rank or per_rank > visit:
        raise ResumeError(
            f"stream state fields 'consumed' ({consumed}), 'samples_per_rank' ({per_rank}) and 'ranges' "
            f"({visit} positions) do not fit together: not a state a loader saved"
        )
    carried = state.get("carried", [])
    if not isinstance(carried, list) or not all(isinstance(c, dict) and "name" in c for c in carried):
        raise ResumeError(f"stream state field 'carried' is {carried!r}: expected a list of samples per source")


def resume_ranges(
    state: dict, *, seed: int, plan_len: int, world: int, plan: dict | None = None
) -> list[tuple[int, int]]:
    """The plan ranges still to visit after ``state``, for a world of ``world`` ranks.

    Raises :class:`mmloader.errors.ResumeError` when the state does not fit (see :func:`check_state`).

    >>> s = progress_state(seed=0, epoch=0, world=2, plan_len=10, ranges=[[0, 10]], samples_per_rank=5,
    ...                    consumed=2, batch_size=2, drop_last=False)
    >>> resume_ranges(s, seed=0, plan_len=10, world=2)
    [(2, 5), (7, 10)]
    """
    check_state(state, seed=seed, plan=plan)
    if plan_len != state["plan_len"]:
        raise ResumeError(
            f"the dataset changed since the state was saved: the epoch plan has {plan_len} "
            f"positions, the state {state['plan_len']}"
        )
    if state.get("unrepeated"):
        return unrepeated_remaining(state["ranges"], state["world"], state["consumed"])
    return remaining_ranges(
        state["ranges"],
        state["world"],
        state["samples_per_rank"],
        state["consumed"],
        keep_padding=world == state["world"],
    )
