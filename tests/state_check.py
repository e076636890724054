"""One save/load check every resumable stage runs (torchdata's ``run_test_save_load_state``):

a pass taken whole is the reference; a pass stopped after ``at`` batches gives a state (made
plain data, as a checkpoint holds it); a new object made the same way and loaded with that
state delivers exactly the reference's batches after ``at``, and so does the stopped object
itself on its next pass. A state taken after a resume says where the run is in the resumed
part of the epoch (not in the same words as the uninterrupted run's): it is checked by what it
does, a third object resumed from it one batch later delivering the rest again, and by the
fields that mean the same on both paths (epoch, steps, the nodes' states).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import torch


def same(a: Any, b: Any) -> bool:
    """Batches equal in every field (tensors by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def plain(state: dict) -> dict:
    return json.loads(json.dumps(state))


def check_save_load(make: Callable[[], Any], at: int) -> None:
    """``make()`` gives a fresh loader (or stage) of the same definition; see the module docstring."""
    reference, states = [], []
    whole = make()
    for _pass in range(2):  # the epoch, and the next (where a state taken after the last batch points)
        for batch in whole:
            reference.append(batch)
            states.append(plain(whole.state_dict()))
        if not _pass:
            epoch = len(reference)
    assert 0 <= at <= epoch, (at, epoch)
    end = epoch if at < epoch else len(reference)  # what the pass after the resume delivers
    stopped = make()
    it = iter(stopped)
    for j in range(at):
        assert same(next(it), reference[j]), f"batch {j} of a second pass differs from the first"
    state = plain(stopped.state_dict())
    if at:
        assert state == states[at - 1], ("the state after batch", at, state, states[at - 1])
    it.close()
    again = None
    for who, loader in (("a new loader", make()), ("the stopped loader", stopped)):
        loader.load_state_dict(state)
        rest = []
        for batch in loader:
            rest.append(batch)
            now, then = plain(loader.state_dict()), states[at + len(rest) - 1]
            assert {k: now.get(k) for k in MEANING} == {k: then.get(k) for k in MEANING}, (who, at + len(rest), now)
            if again is None and len(rest) == 1:
                again = now
        assert len(rest) == end - at, (who, len(rest), end - at)
        for j, (got, want) in enumerate(zip(rest, reference[at:end])):
            assert same(got, want), f"{who}: batch {at + j} after the resume differs"
    if again is not None:  # a state taken after a resume resumes as well
        third = make()
        third.load_state_dict(again)
        rest = list(third)
        want = reference[at + 1 : end] if at + 1 < epoch or at == epoch else reference[epoch:]
        assert len(rest) == len(want) and all(map(same, rest, want)), "resumed twice"


#: The fields of a state that read the same whether or not the run resumed on the way.
MEANING = ("epoch", "steps", "nodes", "plan", "world", "seed")
