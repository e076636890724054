"""The epoch plan: which order, from what — one source, a mix, optionally length-bucketed.

A plan has ``len(plan)`` positions, ``plan.lookup(positions) -> (source, index)``
and ``plan.unit`` (positions kept together from one source). It is a pure
function of its arguments; ``lengths`` (for bucketing) is the only callback.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .bucketing import BucketedOrder
from .mixing import MixOrder, SingleOrder
from .schedule import PhasedMixOrder, WeightSchedule, phase_quotas


def epoch_plan(
    size: int | None = None,
    mix=None,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    block_size: int = 1024,
    window_blocks: int = 16,
    batch_size: int | None = None,
    lengths: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    bucket_window: int = 64,
):
    """The plan of ``epoch`` over one source of ``size`` samples, or over ``mix`` (a :class:`mmloader.Mix`).

    >>> plan = epoch_plan(10, seed=0, epoch=1, block_size=4)
    >>> sorted(plan.lookup(np.arange(len(plan)))[1].tolist()) == list(range(10))
    True
    """
    opts = dict(seed=seed, epoch=epoch, shuffle=shuffle, block_size=block_size, window_blocks=window_blocks)
    if mix is not None:
        plan = mix.order(unit=mix.unit(batch_size), **opts)
    elif size is None:
        raise TypeError("epoch_plan needs size or mix")
    else:
        plan = SingleOrder(size, **opts)
    if lengths is not None:
        if batch_size is None:
            raise TypeError("epoch_plan with lengths (bucketing) needs batch_size")
        plan = BucketedOrder(plan, lengths, batch_size, bucket_window, seed, epoch)
    return plan


def plan_from_identity(
    identity: dict,
    *,
    seed: int,
    epoch: int,
    lengths: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
):
    """The plan that a resume state's identity describes (``Stream.identity()``): what an
    ``on_change="continue"`` resume rebuilds to find the samples the old plan delivered.

    Args:
        identity: the state's ``plan`` entry.
        seed: the stream's seed.
        epoch: the epoch.
        lengths: sample lengths, when the identity buckets by length.
    """
    sizes = [int(s["size"]) for s in identity["sources"]]
    opts = dict(
        seed=seed,
        epoch=epoch,
        shuffle=identity["shuffle"],
        block_size=identity["block_size"],
        window_blocks=identity["window_blocks"],
    )
    mix, batch_size = identity.get("mix"), identity.get("batch_size")
    plan: MixOrder | PhasedMixOrder | SingleOrder | BucketedOrder
    if mix:
        unit = batch_size if mix["composition"] == "source" and batch_size else 1
        schedule = WeightSchedule.from_dict(mix["schedule"]) if mix.get("schedule") else None
        plan = mix_order(sizes, mix["quotas"], schedule, mix["epoch_size"], unit=unit, **opts)
    else:
        plan = SingleOrder(sizes[0], **opts)
    if identity.get("bucket_by") is not None:
        if lengths is None or not batch_size:
            raise TypeError("plan_from_identity: this plan buckets by length; give lengths (and a batch size)")
        plan = BucketedOrder(plan, lengths, batch_size, identity["bucket_window"], seed, epoch)
    return plan


def mix_order(
    sizes: list[int],
    quotas,
    schedule: WeightSchedule | None,
    epoch_size: int | None,
    *,
    unit: int = 1,
    epoch: int,
    **opts,
) -> MixOrder | PhasedMixOrder:
    """The mix's order of ``epoch``: fixed ``quotas``, or the phases of ``schedule``.

    Args:
        sizes: samples per source.
        quotas: samples per source per epoch (fixed weights).
        schedule: weights that change over the run (then ``epoch_size`` is the epoch's length).
        epoch_size: the epoch's length in samples (with a schedule).
        unit: plan positions kept together from one source.
        epoch: the epoch.
        opts: the order's seed, shuffle, block_size, window_blocks.
    """
    if schedule is not None:
        if epoch_size is None:
            raise ValueError("a mix schedule needs the epoch's length (mix epoch_size)")
        return PhasedMixOrder(sizes, phase_quotas(schedule, epoch, epoch_size, unit), unit=unit, epoch=epoch, **opts)
    return MixOrder(sizes, np.asarray(quotas, dtype=np.int64), unit=unit, epoch=epoch, **opts)
