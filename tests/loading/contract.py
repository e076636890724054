"""The stream contract's reference model and driver, shared by every executor's property test.

The model is plain Python over lists: it takes each epoch's plan (the sequence of samples, or
packed rows, that ``stream.plan(epoch)`` lays out: the order is the planner's, tested on its
own) and says, from the documented rules alone, which samples every rank's every batch holds
on any path: batches taken in lock-step, states saved and resumed onto another world, the plan
changed under each ``on_change`` policy, ``set_epoch``, a store edited between runs.

* A rank's share: ``per`` positions of the visit, from ``rank * per``; past the visit's end it
  wraps to its start (padding ``"repeat"``), ``drop_last`` rounds ``per`` down to whole batches,
  ``padding="mask"`` splits without repeats (shares differ by one sample at most, every rank the
  same number of batches, a padding row flagged not valid).
* A resume on the same world: the rest of each rank's share, padding kept (the batches of an
  uninterrupted run). On another world: every plan position of the visit not delivered, in plan
  order (a dropped tail too: it was never delivered); the new world pads or drops afresh.
* ``on_change="continue"``: the new plan's epoch without the samples delivered so far in the
  epoch (under every earlier plan of it), each taken out at its first occurrences.
* ``on_change="next_epoch"``: the new plan from the next epoch (this one if nothing of it was
  delivered); ``"error"``: a :class:`PlanChangedError` exactly when the plan's definition changed.
* The ledger: ``keys_at`` of every delivered step equals the batch's keys; ``steps_of(key)``
  equals the steps that delivered the key in the passes the stream knows (its own, and the
  one its state was taken in when the plan is the same).
* A device stage (``ToDevice``), which reads one batch ahead, changes none of the above.
* Nodes (``loader(nodes=[...])``): a stateful :class:`StepCount` numbers every batch a rank
  delivered since the run began, across passes, epochs and resumes from its checkpointed
  state (a checkpoint saved without nodes starts it afresh; one with nodes is refused by a
  loader without); a :class:`mmloader.Filter` masks exactly the rows its predicate rejects.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import mmloader
from mmloader.errors import PlanChangedError, ResumeError

FILTERS = (None, "meta.s != 0", "meta.s < 2")
WEIGHTS = ([1.0, 1.0], [3.0, 1.0], [1.0, 3.0])


def token_count(index: int) -> int:
    """Tokens of a sample (packing): 1..13."""
    return 1 + (index * 7) % 13


def mixed_token_count(source: int, index: int) -> int:
    return 1 + (index * 7 + source * 5) % 13


def length_of(index: int) -> int:
    return (index * 11) % 17


def mixed_length_of(source: int, index: int) -> int:
    return (index * 11 + source) % 17


@dataclass(frozen=True)
class Config:
    """What defines a plan (and how it runs: world, backend, workers, on_change)."""

    sizes: tuple[int, ...] = (20,)
    versions: tuple[int, ...] = (0,)  # a store edited between runs is another version
    where: str | None = None  # a filter on the first source
    weights: tuple[float, ...] | None = None
    epoch_size: int | None = None
    batch_size: int = 4
    drop_last: bool = False
    padding: str = "repeat"
    shuffle: bool = True
    seed: int = 0
    lengths: str | None = None  # None, "bucket-field", "bucket-callable", "pack", "pack-balanced"
    window: int = 2
    pack_tokens: int = 24
    world: int = 1
    workers: int = 0
    backend: str = "thread"
    on_change: str = "error"
    nodes: bool = False  # a StepCount and a Filter between the loader and the loop
    staged: bool = False  # the loader read one batch ahead by a device stage (ToDevice on the CPU)

    def plan_fields(self) -> tuple:
        """What the plan identity covers: a change here must be a PlanChangedError."""
        return (
            self.sizes,
            self.versions,
            self.where,
            self.weights,
            self.epoch_size,
            self.batch_size,
            self.drop_last,
            self.padding,
            self.shuffle,
            self.seed,
            self.lengths,
            self.window if self.lengths else None,
            self.pack_tokens if self.lengths and self.lengths.startswith("pack") else None,
        )

    @property
    def packed(self) -> bool:
        return bool(self.lengths and self.lengths.startswith("pack"))


class Stores:
    """LMDB stores written once per (name, size, version), reused across examples."""

    def __init__(self, root: Path):
        self.root = root

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one instance per test module)
    def path(self, name: str, size: int, version: int) -> str:
        path = self.root / f"{name}-{size}-v{version}.lmdb"
        with mmloader.LMDBWriter(path) as w:
            for i in range(size):
                text = f"{name}{i}" + "x" * ((i * 5) % 9)
                if version and i == (version * 7) % size:
                    text += f" edited {version}"  # one sample's content differs
                ids = np.arange(1 + (i * 7 + ord(name)) % 13, dtype=np.int32)  # 1..13 tokens
                w.write({"__key__": f"{name}{i:03d}", "txt": text, "json": {"s": i % 4}, "ids.npy": ids})
        return str(path)

    def dataset(self, cfg: Config):
        names = [chr(ord("a") + j) for j in range(len(cfg.sizes))]
        parts = []
        for j, (name, size) in enumerate(zip(names, cfg.sizes)):
            path = self.path(name, size, cfg.versions[j])
            readers = {"t": mmloader.TextReader(path), "meta": mmloader.JSONReader(path)}
            if cfg.packed:
                readers["ids"] = mmloader.ArrayReader(path, "ids.npy")
            ds = mmloader.zip(**readers)
            if j == 0 and cfg.where:
                ds = mmloader.select(ds, cfg.where)
            parts.append(ds)
        if len(parts) == 1:
            return parts[0]
        return mmloader.mix(parts, list(cfg.weights or [1.0] * len(parts)), names=names, epoch_size=cfg.epoch_size)


def make_stream(stores: Stores, cfg: Config, rank: int) -> mmloader.Stream:
    mixed = len(cfg.sizes) > 1
    lengths: Any = None
    if cfg.lengths == "bucket-field":
        lengths = mmloader.Bucketing("t", window=cfg.window)
    elif cfg.lengths == "bucket-callable":
        lengths = mmloader.Bucketing(mixed_length_of if mixed else length_of, window=cfg.window)
    elif cfg.packed:
        lengths = mmloader.Packing(
            cfg.pack_tokens,
            length_by="ids",
            window=max(cfg.window * 4, 8),
            balance="tokens" if cfg.lengths == "pack-balanced" else None,
        )
    stream = mmloader.Stream(
        stores.dataset(cfg),
        batching=mmloader.Batching(cfg.batch_size, drop_last=cfg.drop_last, padding=cfg.padding),
        order=mmloader.Order(shuffle=cfg.shuffle, seed=cfg.seed),
        lengths=lengths,
        on_change=cfg.on_change,
    )
    stream.set_world(rank, cfg.world)
    return stream


class StepCount:
    """A stateful batch function: numbers the batches (``__step__``) across the whole run."""

    def __init__(self):
        self.n = 0

    def __call__(self, batch: dict) -> dict:
        batch["__step__"], self.n = self.n, self.n + 1
        return batch

    def state(self) -> dict:
        return {"n": self.n}

    def reset(self, state: dict | None) -> None:
        self.n = (state or {}).get("n", 0)


def kept(key: Any) -> bool:
    """What the contract's Filter keeps: a row whose key (or packed keys) digests to non-zero mod 3."""
    return sum(map(ord, str(key))) % 3 != 0


def keep_rows(batch: dict) -> list[bool]:
    return [kept(k) for k in batch["__key__"]]


def make_loader(stream: mmloader.Stream, cfg: Config, rank: int) -> Any:
    nodes = [mmloader.Map(StepCount()), mmloader.Filter(keep_rows)] if cfg.nodes else []
    if cfg.backend == "ray":  # builders on the test module's Ray cluster, one pool per rank
        made = mmloader.loader(stream, backend="ray", actors=1, job=f"contract-{os.getpid()}-{rank}", nodes=nodes)
    else:
        made = mmloader.loader(stream, backend=cfg.backend, num_workers=cfg.workers, nodes=nodes)
    return mmloader.ToDevice(made, "cpu") if cfg.staged else made


# -- the model ---------------------------------------------------------------------------------


@dataclass
class Plan:
    """An epoch's plan as the model sees it: ``items[p]`` the sample ids at position ``p``
    (one for a sample, several for a packed row), ``keys[p]`` what ``__key__`` gives."""

    items: list[tuple]
    keys: list[Any]


def epoch_plan(stream: mmloader.Stream, cfg: Config, epoch: int) -> Plan:
    plan = stream.plan(epoch)
    names = list(stream.mix.names) if stream.mix is not None else ["a"]
    positions = np.arange(len(plan), dtype=np.int64)

    def ident(s: int, i: int) -> tuple:
        key = stream.datasets[s].key(int(i))
        return (names[s], cfg.versions[s], key), key

    if cfg.packed:
        src, idx, _members, offsets = plan.samples(positions)
        flat = [ident(s, i) for s, i in zip(src.tolist(), idx.tolist())]
        items = [tuple(x[0] for x in flat[offsets[p] : offsets[p + 1]]) for p in range(len(plan))]
        keys = [[x[1] for x in flat[offsets[p] : offsets[p + 1]]] for p in range(len(plan))]
        return Plan(items, keys)
    src, idx = plan.lookup(positions)
    pairs = [ident(s, i) for s, i in zip(src.tolist(), idx.tolist())]
    return Plan([(x[0],) for x in pairs], [x[1] for x in pairs])


def unrepeated_share(total: int, world: int, rank: int, batch: int) -> tuple[int, int, int]:
    """(start, share, rows) of a rank when nothing repeats (written out again from the docs)."""
    base, extra = divmod(total, world)
    share = base + (1 if rank < extra else 0)
    start = rank * base + min(rank, extra)
    batches = math.ceil((base + (1 if extra else 0)) / batch)
    rows = share if math.ceil(share / batch) == batches else (batches - 1) * batch + 1
    return start, share, rows


@dataclass
class Pass:
    """One pass of every rank over (part of) an epoch."""

    epoch: int
    cfg: Config
    plan: Plan
    visit: list[int]  # plan positions
    step0: int  # steps of the epoch delivered before this pass (the ledger numbers steps from 0)
    before: int = 0  # steps the stream counts before this pass (a framework's count: states, len)
    length: int | None = None  # what len(loader) says for this pass (None: its batches)
    taken: int = 0  # batches each rank delivered in this pass
    carried: Counter = field(default_factory=Counter)  # delivered under earlier plans, not in this one
    delivered: dict = field(default_factory=dict)  # (rank, step) -> keys

    @property
    def world(self) -> int:
        return self.cfg.world

    def per_rank(self, rank: int = 0) -> int:
        n, w, b = len(self.visit), self.world, self.cfg.batch_size
        if self.cfg.padding == "mask":
            return unrepeated_share(n, w, rank, b)[2] if n else 0
        if self.cfg.drop_last:
            return n // w // b * b
        return -(-n // w)

    def batches(self) -> int:
        return -(-self.per_rank() // self.cfg.batch_size)

    def rows(self, rank: int, j: int) -> list[tuple[int, bool]]:
        """(plan position, counts) of rank's j-th batch of this pass."""
        n, b, per = len(self.visit), self.cfg.batch_size, self.per_rank(rank)
        if self.cfg.padding == "mask":
            start, share, _rows = unrepeated_share(n, self.world, rank, b)
            out = []
            for o in range(j * b, min((j + 1) * b, per)):
                valid = o < share
                out.append((self.visit[start + o] if valid else self.visit[start if share else 0], valid))
            return out
        return [
            (self.visit[v % n], True)
            for v in range(rank * per + j * b, min(rank * per + (j + 1) * b, (rank + 1) * per))
        ]

    def consumed(self) -> int:
        return min(self.taken * self.cfg.batch_size, self.per_rank())

    def remaining(self, same_world: bool) -> list[int]:
        """Plan positions the next pass of this epoch visits, after a state saved now."""
        n, w, c = len(self.visit), self.world, self.consumed()
        if self.cfg.padding == "mask":
            out = []
            for r in range(w):
                start, share, _rows = unrepeated_share(n, w, r, self.cfg.batch_size)
                out += self.visit[start + min(c, share) : start + share]
            return out
        per = self.per_rank()
        if same_world:  # (a tail drop_last left out stays at the end: dropped again here, kept for others)
            return [self.visit[v % n] for r in range(w) for v in range(r * per + c, (r + 1) * per)] + self.visit[
                w * per :
            ]
        delivered = {self.visit[v % n] for r in range(w) for v in range(r * per, r * per + c)}
        out: list[int] = []
        for p in self.visit:  # each position once (a visit may hold padding repeats), in plan order
            if p not in delivered and p not in out:
                out.append(p)
        return sorted(out)

    def done_items(self) -> Counter:
        """Samples of the epoch delivered so far (each plan position once, a visit that left
        samples out counts them), with those carried from earlier plans of the epoch."""
        left = set(self.remaining(same_world=False))
        out = Counter(self.carried)
        for p, items in enumerate(self.plan.items):
            if p not in left:
                out.update(items)
        return out


def kept_visit(plan: Plan, done: Counter) -> tuple[list[int], Counter]:
    """The new plan's positions without the samples ``done`` (each at its first occurrences),
    and what ``done`` holds that the new plan cannot take out (carried on)."""
    seen: Counter = Counter()
    visit = []
    for p, items in enumerate(plan.items):
        (item,) = items
        if seen[item] < done[item]:
            seen[item] += 1
        else:
            visit.append(p)
    return visit, done - seen


# -- the driver ----------------------------------------------------------------------------------


class Run:
    """Real loaders, one per rank of ``cfg.world``, and the model beside them."""

    def __init__(self, stores: Stores, cfg: Config, log: list):
        self.stores, self.cfg, self.log = stores, cfg, log
        self.streams = [make_stream(stores, cfg, r) for r in range(cfg.world)]
        self.loaders = [make_loader(s, cfg, r) for r, s in enumerate(self.streams)]
        self.iters: list | None = None
        self.plans: dict[int, Plan] = {}
        self.model = Pass(0, cfg, self.plan(0), list(range(len(self.plan(0).items))), 0)
        self.before: Pass | None = None  # the pass the state this run resumed was taken in
        self.ended = False  # the model's pass ended: the next take starts the next epoch
        self.left = False  # the pass was left mid-way: the next one continues it
        self.steps = 0  # batches each rank delivered since the run began (the StepCount node's)

    def plan(self, epoch: int) -> Plan:
        if epoch not in self.plans:
            self.plans[epoch] = epoch_plan(self.streams[0], self.cfg, epoch)
        return self.plans[epoch]

    def fresh(self, epoch: int) -> Pass:
        plan = self.plan(epoch)
        return Pass(epoch, self.cfg, plan, list(range(len(plan.items))), 0)

    def close(self) -> None:
        for it in self.iters or []:
            it.close()
        self.iters = None

    # -- operations --
    def take(self, k: int | None) -> None:
        """Every rank takes ``k`` batches (None: to the end of the pass), checked batch by batch."""
        if k == 0:
            return  # (no batch asked: no pass begins)
        if self.ended:
            self.close()
            self.before, self.model, self.ended = None, self.fresh(self.model.epoch + 1), False
        if self.iters is None and self.left:
            self._continue_left()
        m = self.model
        if self.iters is None:
            self.iters = [iter(loader) for loader in self.loaders]
        want = m.batches() - m.taken if k is None else k
        for _ in range(want):
            if m.taken == m.batches():
                break
            step = m.step0 + m.taken
            got = [next(it) for it in self.iters]
            if m.taken == 0:  # the pass has begun: len() is its epoch's (read between passes: the last one's)
                expect_len = m.batches() if m.length is None else m.length
                for r, loader in enumerate(self.loaders):
                    assert len(loader) == expect_len, (r, len(loader), expect_len, self.log)
            self._check_step(step, got)
            m.taken += 1
            self.steps += 1
        if m.taken == m.batches():  # the pass is over on every rank at once
            for it in self.iters:
                assert next(it, None) is None, ("a rank has a batch past the plan", self.log)
            self.iters = None
            self.check_ledger()
            self.ended = True

    def _check_step(self, step: int, got: list) -> None:
        m = self.model
        j = m.taken
        expected = [m.rows(r, j) for r in range(self.cfg.world)]
        for r, batch in enumerate(got):
            keys = list(batch["__key__"])
            if self.cfg.nodes:
                assert batch["__step__"] == self.steps, (f"rank {r} step {step}", batch["__step__"], self.log)
                counts = [v for _p, v in expected[r]] if self.cfg.padding == "mask" else [True] * len(keys)
                if self.cfg.lengths == "pack-balanced":
                    counts = [True] * len(keys)
                want_valid = [c and kept(k) for c, k in zip(counts, keys)]
                assert batch["__valid__"].tolist() == want_valid, (f"rank {r} step {step}", self.log)
            want = [m.plan.keys[p] for p, _v in expected[r]]
            if self.cfg.lengths == "pack-balanced":  # rows dealt by cost within the step: compare the step
                continue
            assert keys == want, (f"rank {r} step {step}", keys, want, self.log)
            if self.cfg.padding == "mask" and not self.cfg.nodes:
                assert batch["__valid__"].tolist() == [v for _p, v in expected[r]], (r, step, self.log)
            m.delivered[(r, step)] = keys
        if self.cfg.lengths == "pack-balanced":
            rows = sorted(map(tuple, (k for b in got for k in b["__key__"])))
            want_rows = sorted(tuple(m.plan.keys[p]) for e in expected for p, _v in e)
            assert rows == want_rows, (f"step {step}", rows, want_rows, self.log)
            for r, batch in enumerate(got):
                m.delivered[(r, step)] = list(batch["__key__"])

    def state(self) -> dict:
        state = self.loaders[0].state_dict()
        for loader in self.loaders[1:]:  # every rank says the same (unrepeated shares: but its own rows)
            other = loader.state_dict()
            if state.get("unrepeated"):
                other = {**other, "samples_per_rank": state["samples_per_rank"], "consumed": state["consumed"]}
            assert json.loads(json.dumps(other)) == state, self.log
        return json.loads(json.dumps(state))  # a checkpoint is plain data

    def check_ledger(self) -> None:
        """keys_at of every step this stream knows equals what was delivered; steps_of likewise."""
        passes = [p for p in (self.before, self.model) if p is not None]
        for r, stream in enumerate(self.streams):
            mine: dict = {}
            for p in passes:
                mine.update(p.delivered)
            for (rank, step), keys in mine.items():
                got = stream.keys_at(step, rank=rank, epoch=self.model.epoch)
                assert got == keys, ("keys_at", rank, step, got, keys, self.log)
            if r:
                continue
            where: dict = {}
            for (rank, step), keys in mine.items():
                for key in keys:
                    for k in key if isinstance(key, list) else [key]:
                        where.setdefault(k, set()).add((rank, step))
            for key, steps in sorted(where.items())[:12]:
                got = set(map(tuple, stream.steps_of(key, epoch=self.model.epoch)))
                assert got == steps, ("steps_of", key, sorted(got), sorted(steps), self.log)

    def restart(self, cfg: Config) -> Run | None:
        """Save a state, start a new run of ``cfg`` from it. None: the resume was refused as it must be."""
        state = self.state()
        self.close()
        changed = cfg.plan_fields() != self.cfg.plan_fields()
        new = Run.__new__(Run)
        new.stores, new.cfg, new.log, new.plans = self.stores, cfg, self.log, {}
        new.streams = [make_stream(self.stores, cfg, r) for r in range(cfg.world)]
        new.loaders = [make_loader(s, cfg, r) for r, s in enumerate(new.streams)]
        new.iters, new.ended, new.left = None, False, False
        # the StepCount goes on from the state's count (afresh from a state saved without nodes)
        new.steps = self.steps if self.cfg.nodes else 0
        m = self.model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            refused = changed and cfg.on_change == "error"
            if changed and cfg.on_change == "continue" and cfg.lengths and cfg.lengths.startswith("bucket"):
                # a bucketed order is rebuilt from the saved sources' lengths: refused where they changed
                refused = (cfg.versions, cfg.where) != (self.cfg.versions, self.cfg.where)
            if refused or (self.cfg.nodes and not cfg.nodes):  # (a node's state has nowhere to go)
                for loader in new.loaders:
                    try:
                        loader.load_state_dict(state)
                    except (PlanChangedError, ResumeError):
                        continue
                    raise AssertionError(("a changed plan resumed silently", self.log))
                return None
            for loader in new.loaders:
                loader.load_state_dict(state)
        counted = m.before + m.taken  # the steps the state says were taken of its epoch
        new.before = None
        if changed and cfg.on_change == "next_epoch":
            new.model = new.fresh(m.epoch + (1 if m.consumed() and not self.ended else 0) + self.ended)
            return new
        if self.ended:  # the state names the next epoch's start
            new.model = new.fresh(m.epoch + 1)
            whole = new.model.batches()
            if counted < whole:  # a framework counts on from the epoch that ended (Stream.resume)
                new.model.before = counted
            new.model.length = new.model.before + whole
            return new
        if not changed:
            visit = m.remaining(same_world=cfg.world == self.cfg.world)
            plan, carried = new.plan(m.epoch), Counter(m.carried)
            new.before = m
        else:  # continue: the rest of the epoch without what was delivered (under every plan of it)
            plan = new.plan(m.epoch)
            visit, carried = kept_visit(plan, m.done_items())
        new.model = Pass(m.epoch, cfg, plan, visit, m.step0 + m.taken, before=counted, carried=carried)
        new.model.length = max(counted + new.model.batches(), new.fresh(m.epoch).batches())
        return new

    def left_early(self) -> None:
        """The pass was left mid-way (its iterators closed): the loader's next pass continues
        the epoch at its next unseen batch, as a resume of its own state on the same world."""
        self.left = not self.ended and bool(self.model.taken)  # (applied when the next pass begins)

    def _continue_left(self) -> None:
        m, self.left = self.model, False
        visit = m.remaining(same_world=True)
        counted = m.before + m.taken
        self.model = Pass(m.epoch, self.cfg, m.plan, visit, m.step0 + m.taken, before=counted, carried=m.carried)
        self.model.length = max(counted + self.model.batches(), self.fresh(m.epoch).batches())
        self.before = m

    def set_epoch(self, epoch: int) -> None:
        self.close()
        for loader in self.loaders:
            loader.set_epoch(epoch)
        self.before, self.model, self.ended, self.left = None, self.fresh(epoch), False, False


def replaced(cfg: Config, **changes: Any) -> Config:
    return replace(cfg, **changes)
