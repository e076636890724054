"""The torchft dealing rule (mmloader.planning.quorum) over random runs: quorums that grow and shrink
from step to step, steps that fail and are dealt again, groups that heal. Whatever happens, the
committed steps hold every position of the epoch exactly once, and every rank of a step gets a batch
of the same size."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmloader.planning.quorum import deal, step_width


@st.composite
def runs(draw):
    total = draw(st.integers(1, 120))
    batch = draw(st.integers(1, 6))
    group_world = draw(st.integers(1, 3))
    steps = draw(
        st.lists(
            st.tuples(st.integers(1, 4), st.booleans(), st.integers(0, 2)),  # participants, committed, healing
            min_size=1,
            max_size=200,
        )
    )
    return total, batch, group_world, steps


@settings(max_examples=300, deadline=None)
@given(runs())
def test_committed_steps_hold_every_position_once_whatever_the_quorums(run):
    total, batch, group_world, steps = run
    base, seen = 0, collections.Counter()
    for participants, commits, healing in steps:
        if base >= total:
            break
        dealt = []
        for p in range(participants):
            for g in range(group_world):
                positions, valid = deal(base, total, participants, p, group_world, g, batch)
                assert len(positions) == len(valid) == batch  # the same size on every rank
                assert ((positions >= 0) & (positions < total)).all()
                assert (valid == (base + (p * group_world + g) * batch + np.arange(batch) < total)).all()
                dealt += positions[valid].tolist()
        for _ in range(healing):  # a group healing in this step is dealt nothing that counts
            positions, valid = deal(base, total, participants, None, group_world, 0, batch)
            assert len(positions) == batch and not valid.any()
        assert len(dealt) == len(set(dealt))  # no position twice in a step
        if commits:
            seen.update(dealt)
            base += step_width(participants, group_world, batch)
    if base >= total:
        assert sorted(seen) == list(range(total)) and set(seen.values()) == {1}
    else:  # the run stopped early: what was committed is a prefix, each position once
        assert sorted(seen) == list(range(base)) and set(seen.values()) <= {1}


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="outside a quorum of 2"):
        deal(0, 10, 2, 2, 1, 0, 4)
    with pytest.raises(ValueError, match="group_rank=1 outside a group of 1"):
        deal(0, 10, 2, 0, 1, 1, 4)
    with pytest.raises(ValueError, match="nothing to deal"):
        deal(0, 0, 1, 0, 1, 0, 4)
