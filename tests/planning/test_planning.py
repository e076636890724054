"""Pure planning functions, tested exhaustively without a file."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from conftest import deliver

from mmloader.planning import (
    RangeList,
    ShuffledOrder,
    rank_positions,
    remaining_ranges,
    samples_per_rank,
)
from mmloader.planning.mixing import MixOrder, apportion, quotas
from mmloader.planning.partition import batches_per_rank

CASES = list(itertools.product(range(0, 26), range(1, 5), range(1, 4), [None, 1, 2, 3, 5], [False, True]))


@pytest.mark.parametrize("total,world,workers,batch,drop_last", CASES)
def test_partition_exactly_once_equal_batches(total, world, workers, batch, drop_last):
    ranks, per = deliver(total, world, workers, batch, drop_last)
    counts = [len(r) for r in ranks]
    assert len(set(counts)) == 1, f"unequal batch counts {counts}"  # no DDP hang
    assert counts[0] == batches_per_rank(per, batch)
    assert all(sum(map(len, r)) == per for r in ranks)  # equal samples too
    seen = Counter(p for r in ranks for b in r for p in b)
    if drop_last:
        assert all(c == 1 for c in seen.values()) and len(seen) == per * world
        assert per * world >= total - world * (batch or 1)  # dropped less than a batch per rank
    else:
        assert set(seen) == set(range(total))  # every sample...
        pads = sum(seen.values()) - total
        assert pads == per * world - total and pads < world  # ...once, plus < world pads
        if batch:
            for r in ranks:  # batches are full except possibly the last
                assert all(len(b) == batch for b in r[:-1])
    for r in ranks:  # a rank's delivered order is its contiguous part, independent of workers
        flat = [p for b in r for p in b]
        assert flat == [p for b in deliver(total, world, 1, batch, drop_last)[0][ranks.index(r)] for p in b]


@pytest.mark.parametrize(
    "total,world,batch,k",
    [(t, w, b, k) for t in (1, 5, 10, 23, 64) for w in (1, 2, 3, 4) for b in (1, 3, 4) for k in range(0, 5)],
)
def test_resume_same_world_replays_nothing_and_matches(total, world, batch, k):
    full, per = deliver(total, world, 2, batch, False)
    k = min(k, len(full[0]))
    ranges = remaining_ranges([(0, total)], world, per, k * batch, keep_padding=True)
    resumed, _ = deliver(total, world, 3, batch, False, ranges)  # another worker count, too
    for r in range(world):
        assert resumed[r] == full[r][k:]


@pytest.mark.parametrize(
    "total,old_world,new_world,batch,k",
    [
        (t, ow, nw, b, k)
        for t in (1, 7, 10, 33)
        for ow in (1, 2, 3, 4)
        for nw in (1, 2, 3, 5)
        for b in (1, 4)
        for k in (0, 1, 2)
    ],
)
def test_elastic_resume_covers_unseen_exactly_once(total, old_world, new_world, batch, k):
    full, per = deliver(total, old_world, 2, batch, False)
    k = min(k, len(full[0]))
    seen = {p for r in full for b in r[:k] for p in b}
    if old_world == new_world:
        return  # covered exactly by the same-world test above
    ranges = remaining_ranges([(0, total)], old_world, per, k * batch, keep_padding=False)
    remaining = RangeList(ranges).take(np.arange(len(RangeList(ranges)))).tolist()
    assert sorted(remaining) == sorted(set(range(total)) - seen)  # unseen, each exactly once
    resumed, new_per = deliver(total, new_world, 2, batch, False, ranges)
    after = Counter(p for r in resumed for b in r for p in b)
    assert set(after) == set(remaining)
    assert len({len(r) for r in resumed}) == 1  # still equal batches
    assert sum(after.values()) - len(remaining) == new_per * new_world - len(remaining) < new_world


def test_range_list():
    rl = RangeList([(5, 8), (0, 0), (20, 22)])
    assert len(rl) == 5 and rl.take(np.arange(5)).tolist() == [5, 6, 7, 20, 21]
    assert rl.sub(1, 4) == [(6, 8), (20, 21)]


@pytest.mark.parametrize("n,block,window", itertools.product([1, 2, 7, 64, 100, 1000], [1, 3, 16, 64], [1, 2, 5]))
def test_shuffled_order_is_a_deterministic_permutation(n, block, window):
    a = ShuffledOrder(n, seed=3, epoch=1, block_size=block, window_blocks=window)
    order = a.take(np.arange(n))
    assert sorted(order.tolist()) == list(range(n))
    b = ShuffledOrder(n, seed=3, epoch=1, block_size=block, window_blocks=window)
    assert b.take(np.arange(n)[::-1]).tolist() == order[::-1].tolist()  # any access order, same plan
    if n >= 64:
        assert (
            order.tolist()
            != ShuffledOrder(n, seed=3, epoch=2, block_size=block, window_blocks=window).take(np.arange(n)).tolist()
        )
        assert (
            order.tolist()
            != ShuffledOrder(n, seed=4, epoch=1, block_size=block, window_blocks=window).take(np.arange(n)).tolist()
        )


def test_shuffle_is_blockwise_local():
    n, block, window = 10_000, 100, 4
    order = ShuffledOrder(n, seed=0, epoch=0, block_size=block, window_blocks=window).take(np.arange(n))
    for w in range(0, n, block * window):
        blocks = set((order[w : w + block * window] // block).tolist())
        assert len(blocks) <= window  # a window reads only `window` blocks: mostly sequential IO
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.2  # yet well mixed overall


def test_unshuffled_order_is_identity():
    assert ShuffledOrder(10, shuffle=False).take(np.arange(10)).tolist() == list(range(10))


def test_apportion_and_quotas():
    assert apportion(7, np.array([1, 1, 1])).sum() == 7
    assert quotas([100, 50], [2.0, 0.5], mode="repeat").tolist() == [200, 25]
    assert quotas([100, 50], [30, 60], mode="count").tolist() == [30, 60]
    assert quotas([100, 50], [0.5, 0.5]).tolist() == [50, 50]
    with pytest.raises(ValueError, match="non-negative"):
        quotas([10], [-1])
    with pytest.raises(ValueError, match="positive"):
        quotas([10, 5], [0, 0])


@pytest.mark.parametrize(
    "sizes,weights",
    [([10_000, 3_000, 500], [0.6, 0.3, 0.1]), ([777, 5000], [0.25, 0.75]), ([50, 50, 50, 50], [1, 2, 3, 4])],
)
def test_mix_proportions_within_one_point(sizes, weights):
    q = quotas(sizes, weights, epoch_size=10_000)
    m = MixOrder(sizes, q, seed=1, epoch=0)
    src, idx = m.lookup(np.arange(len(m)))
    realised = np.bincount(src, minlength=len(sizes)) / len(m)
    target = np.array(weights) / sum(weights)
    assert np.abs(realised - target).max() <= 0.01
    # proportions hold within every 1000-sample stretch as well, not only overall
    for a in range(0, len(m) - 1000, 1000):
        part = np.bincount(src[a : a + 1000], minlength=len(sizes)) / 1000
        assert np.abs(part - target).max() <= 0.02
    for s, size in enumerate(sizes):  # exactly once within the quota (repeats only past the size)
        c = Counter(idx[src == s].tolist())
        assert max(c.values()) == -(-q[s] // size) and len(c) == min(q[s], size)


def test_mix_walks_through_sources_across_epochs():
    sizes, q = [1000], np.array([250])
    seen = np.concatenate([MixOrder(sizes, q, seed=0, epoch=e).lookup(np.arange(250))[1] for e in range(4)])
    assert sorted(seen.tolist()) == list(range(1000))  # four epochs of a quarter each = the whole source


def test_mix_source_composition_keeps_batches_single_source():
    m = MixOrder([300, 200], quotas([300, 200], [0.5, 0.5], epoch_size=400), seed=0, epoch=0, unit=8)
    src, _ = m.lookup(np.arange(len(m)))
    assert len(m) % 8 == 0
    assert all(len(set(src[a : a + 8].tolist())) == 1 for a in range(0, len(m), 8))
    assert set(src.tolist()) == {0, 1}


@pytest.mark.parametrize("visit_len,world", [(0, 1), (7, 1), (10, 4), (13, 3), (5, 8)])
def test_rank_positions_slices_equal_the_whole(visit_len, world):
    per = samples_per_rank(visit_len, world)
    for rank in range(world):
        whole = rank_positions(visit_len, world, rank, per)
        for a in range(per + 1):
            for b in range(a, per + 2):
                assert rank_positions(visit_len, world, rank, per, a, b).tolist() == whole[a:b].tolist()


# -- issue 13, defect 11: a quota never repeats a sample unless it exceeds the source -----------
@pytest.mark.parametrize("size", list(range(1, 14)) + [97, 1000])
def test_quota_counts_even_within_every_epoch_and_cycles_walk_the_source(size):
    from mmloader.planning.mixing import quota_indices

    orders = {}

    def order(kind, cycle):
        return orders.setdefault(
            (kind, cycle), ShuffledOrder(size, 5, cycle, block_size=4, window_blocks=2, stream=(kind,))
        )

    for quota in sorted({*range(1, 3 * size + 2), size * 10 + 3} if size < 20 else {1, 7, 600, size, 2 * size + 1}):
        whole, rest = divmod(quota, size)
        for epoch in range(6):
            got = quota_indices(size, quota, epoch, np.arange(quota), order)
            counts = np.bincount(got, minlength=size)
            assert len(got) == quota and counts.min() >= whole and counts.max() <= whole + (rest > 0), (
                size,
                quota,
                epoch,
            )
        if whole == 0:  # epochs sharing a remainder cycle take disjoint slices of it
            per_cycle = size // quota
            seen = np.concatenate([quota_indices(size, quota, e, np.arange(quota), order) for e in range(per_cycle)])
            assert len(set(seen.tolist())) == per_cycle * quota


def test_mix_quota_crossing_a_cycle_no_longer_repeats():
    """The reported case: a 1,000-sample source with a quota of 600, seed 5."""
    sizes, q = [1000, 400], np.array([600, 400])
    for epoch in range(4):
        src, idx = MixOrder(sizes, q, seed=5, epoch=epoch).lookup(np.arange(1000))
        assert len(set(idx[src == 0].tolist())) == 600


# -- issue 13, defect 6: bucketing keeps single-source batches ---------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_bucketing_with_source_composition_keeps_batches_single_source(seed):
    from mmloader.planning.bucketing import BucketedOrder

    batch = 8
    m = MixOrder(
        [300, 200, 90], quotas([300, 200, 90], [0.5, 0.3, 0.2], epoch_size=480), seed=seed, epoch=1, unit=batch
    )
    plan = BucketedOrder(m, lambda src, idx: (idx * 7919) % 101, batch, window_batches=20, seed=seed, epoch=1)
    src, idx = plan.lookup(np.arange(len(plan)))
    assert all(len(set(src[a : a + batch].tolist())) == 1 for a in range(0, len(plan), batch))
    base_src, base_idx = m.lookup(np.arange(len(m)))
    assert sorted(zip(src.tolist(), idx.tolist())) == sorted(zip(base_src.tolist(), base_idx.tolist()))
    lengths = (idx * 7919) % 101
    spread = [np.ptp(lengths[a : a + batch]) for a in range(0, len(plan), batch)]
    base_spread = [np.ptp(((base_idx * 7919) % 101)[a : a + batch]) for a in range(0, len(m), batch)]
    assert np.mean(spread) < np.mean(base_spread) / 2  # still buckets by length
