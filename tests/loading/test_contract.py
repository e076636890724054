"""The stream contract, checked by construction: random plans and random operation sequences
against the reference model of :mod:`contract` (every sample exactly once per epoch, or the
documented repeats and drops; equal batches per rank; ``len(loader)``; the ledger equal to
delivery; a ``PlanChangedError`` exactly when the plan changed), on every executor.

Profiles (``MMLOADER_CONTRACT=fast|ci|deep``, default ``ci``): ``make test-fast`` runs the
thread executor's part (``fast``); ``make test`` both executors (``ci``); ``make soak`` thousands
of examples per executor (``deep``). Hypothesis shrinks a failure to a small case: commit it as
an ``@example`` below (its example database stays out of git).
"""

from __future__ import annotations

import os
import warnings

import pytest
from contract import FILTERS, WEIGHTS, Config, Run, Stores
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mmloader.errors import AlignmentError

PROFILE = os.environ.get("MMLOADER_CONTRACT", "ci")
EXAMPLES = {
    "fast": {"thread": 40, "process": 4, "ray": 3},
    "ci": {"thread": 300, "process": 25, "ray": 6},
    "deep": {"thread": 3000, "process": 300, "ray": 60},
}
for _name, _counts in EXAMPLES.items():
    settings.register_profile(
        f"contract-{_name}",
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
        derandomize=_name != "deep",  # the bounded profiles are the same run every time: no flaky CI
        database=None if _name != "deep" else settings.default.database,
        print_blob=True,
        report_multiple_bugs=False,
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Stores:
    return Stores(tmp_path_factory.mktemp("contract"))


@st.composite
def configs(draw, backend: str, max_size: int) -> Config:
    mixed = draw(st.booleans())
    size = st.one_of(st.integers(0 if not mixed else 1, 12), st.integers(13, max_size))
    sizes = tuple(draw(size) for _ in range(2 if mixed else 1))
    lengths = draw(st.sampled_from([None, None, "bucket-field", "bucket-callable", "pack", "pack-balanced"]))
    padding = draw(st.sampled_from(["repeat", "repeat", "mask"]))
    if padding == "mask" and lengths == "pack-balanced":
        lengths = "pack"
    return Config(
        sizes=sizes,
        versions=(0,) * len(sizes),
        where=draw(st.sampled_from(FILTERS)) if sizes[0] >= 8 else None,
        weights=tuple(draw(st.sampled_from(WEIGHTS))) if mixed else None,
        epoch_size=draw(st.sampled_from([None, 17, 40])) if mixed else None,
        batch_size=draw(st.integers(1, 6)),
        drop_last=padding == "repeat" and draw(st.booleans()),
        padding=padding,
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 3)),
        lengths=lengths,
        window=draw(st.integers(1, 3)),
        pack_tokens=draw(st.integers(13, 40)),
        world=draw(st.integers(1, 3)) if backend != "ray" else 1,  # (ray: one rank's pool on 3 CPUs)
        workers=draw(st.integers(0, 2)),
        backend=backend,
        on_change=draw(st.sampled_from(["error", "next_epoch", "continue"])),
        nodes=draw(st.booleans()),
        staged=draw(st.booleans()),
    )


def changed(draw, cfg: Config) -> Config:
    """Another run of ``cfg``: the same plan on another world or worker count, or a changed plan."""
    what = draw(st.sampled_from(["same", "same", "weights", "where", "where", "batch", "edit", "seed"]))
    new = {
        "world": draw(st.integers(1, 3)) if cfg.backend != "ray" else 1,
        "workers": draw(st.integers(0, 2)),
        "on_change": draw(st.sampled_from([cfg.on_change, "error", "next_epoch", "continue", "continue"])),
        "nodes": draw(st.sampled_from([cfg.nodes] * 4 + [not cfg.nodes])),  # nodes put in or taken out
        "staged": draw(st.booleans()),
    }
    if what == "weights" and cfg.weights:
        new["weights"] = tuple(draw(st.sampled_from([w for w in WEIGHTS if tuple(w) != cfg.weights])))
    elif what == "where" and cfg.sizes[0] >= 8:
        new["where"] = draw(st.sampled_from([f for f in FILTERS if f != cfg.where]))
    elif what == "batch":
        new["batch_size"] = draw(st.sampled_from([b for b in range(1, 7) if b != cfg.batch_size]))
    elif what == "edit" and cfg.sizes[0]:
        new["versions"] = (cfg.versions[0] + 1,) + cfg.versions[1:]
    elif what == "seed":
        new["seed"] = cfg.seed + 1
    out = Config(**{**cfg.__dict__, **new})
    if out.packed and out.on_change == "continue":  # packing refuses it (Packing.check)
        out = Config(**{**out.__dict__, "on_change": "error"})
    return out


def run_contract(data, stores: Stores, backend: str, max_size: int) -> None:
    cfg = data.draw(configs(backend, max_size))
    if cfg.packed and cfg.on_change == "continue":
        cfg = Config(**{**cfg.__dict__, "on_change": "error"})
    log: list = [cfg]
    event(f"lengths={cfg.lengths}, padding={cfg.padding}, drop_last={cfg.drop_last}, mixed={len(cfg.sizes) > 1}")
    try:
        run = Run(stores, cfg, log)
    except (ValueError, AlignmentError) as e:  # an empty dataset, or a filter that keeps nothing, is said at once
        assert any(w in str(e) for w in ("empty", "0 samples", "no sample", "fields: []")), e
        return
    try:
        for _ in range(data.draw(st.integers(2, 10))):
            op = data.draw(st.sampled_from(["take", "take", "finish", "restart", "restart", "set_epoch"]))
            if op == "take":
                k = data.draw(st.integers(0, 4))
                log.append(("take", k))
                run.take(k)
            elif op == "finish":
                log.append(("finish",))
                run.take(None)
            elif op == "set_epoch":
                epoch = run.model.epoch + data.draw(st.integers(1, 2))
                log.append(("set_epoch", epoch))
                run.set_epoch(epoch)
            else:
                new = changed(data.draw, run.cfg)
                log.append(("restart", new))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    resumed = run.restart(new)
                event(f"restart: {'same plan' if new.plan_fields() == run.cfg.plan_fields() else new.on_change}")
                if resumed is None:  # refused, as it must be: the run goes on as it was
                    run.left_early()
                else:
                    run = resumed
        log.append(("finish",))
        run.take(None)
    finally:
        run.close()


DEEP = pytest.mark.timeout(0 if PROFILE == "deep" else 300)  # (the deep profile runs as long as it needs)


@DEEP
@settings(settings.get_profile(f"contract-{PROFILE}"), max_examples=EXAMPLES[PROFILE]["thread"])
@given(data=st.data())
def test_contract_on_threads(data, stores):
    run_contract(data, stores, "thread", 300 if PROFILE == "deep" else 80)


@pytest.mark.process
@DEEP
@settings(settings.get_profile(f"contract-{PROFILE}"), max_examples=EXAMPLES[PROFILE]["process"])
@given(data=st.data())
def test_contract_on_worker_processes(data, stores):
    run_contract(data, stores, "process", 300 if PROFILE == "deep" else 60)
