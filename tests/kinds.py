"""Test kinds as markers, and a check that a ``unit`` test is one.

Every test gets exactly one kind (``pytest -m unit``, ``make test-fast``):

- ``unit``: this process only (threads allowed), no network; the default.
- ``process``: starts processes (DataLoader workers, the CLI, converters' pools).
- ``network``: talks to servers the test starts on 127.0.0.1 (HTTP, S3, the Hub's endpoints).
- ``distributed``: several ranks (``torch.distributed`` on gloo, torchrun, a Ray cluster).
- ``framework``: a training framework or another tool runs (Lightning, HF, Energon, img2dataset).

A kind comes from a mark on the test (``@pytest.mark.process``), else its module's
``pytestmark``, else :data:`MODULE_KINDS`, else ``unit``. A ``unit`` test that starts a process
or connects a TCP socket fails, naming the mark to add, so the fast suite stays what it says.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

KINDS = {
    "unit": "this process only (threads allowed), no network",
    "process": "starts processes: DataLoader workers, the CLI, process pools",
    "network": "talks to servers the test starts on 127.0.0.1",
    "distributed": "several ranks: torch.distributed on gloo, torchrun, a Ray cluster",
    "framework": "a training framework or another tool runs",
}

#: The kind of every test in a module where one kind fits them all.
MODULE_KINDS = {
    "test_lightning": "framework",
    "test_lightning_resume": "framework",
    "test_hf_trainer": "framework",
    "test_accelerate": "framework",
    "test_device_mesh": "framework",
    "test_torchft": "framework",
    "test_energon": "framework",
    "test_img2dataset": "framework",
    "test_ray": "distributed",
    "test_on_ray": "distributed",
    "test_hub": "network",
    "test_proxy": "network",
    "test_remote": "network",
    "test_obstore_client": "network",
    "test_remote_integrity": "network",
    "test_packaging": "process",
    "test_docs": "process",
}

#: Fixtures that make a test of their kind wherever it is.
FIXTURE_KINDS = {"ddp_run": "distributed", "s3": "network"}


def pytest_configure(config: pytest.Config) -> None:
    for name, what in KINDS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", f"slow: {SLOW}")


#: Beside its kind, a unit test of seconds is marked ``slow``: ``make test-fast`` leaves it out.
SLOW = "a unit test that takes seconds (exhaustive or pixel-exact checks): not in make test-fast"


def kind_of(item: pytest.Item) -> str:
    own = [m.name for m in item.iter_markers() if m.name in KINDS]
    if own:
        return own[0]  # the closest mark: the test's own, then its class's, then its module's
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURE_KINDS:
            return FIXTURE_KINDS[fixture]
    module = getattr(item, "module", None)
    return MODULE_KINDS.get(module.__name__.rpartition(".")[2] if module else "", "unit")


#: How long a test of each kind runs, roughly: the order in which modules start (below).
_WEIGHT = {"framework": 4, "distributed": 3, "process": 2, "network": 2, "unit": 1}

#: The modules of a minute or more (``make test XDIST="-n 2 --dist loadfile --durations=40"``),
#: longest first: they start before all others. Only the order depends on it, never a result.
LONGEST_FIRST = (
    "test_docs",
    "test_lightning_resume",
    "test_lightning",
    "test_hf_trainer",
    "test_on_ray",
    "test_live",
    "test_remote",
    "test_text",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = kind_of(item)
        if not any(m.name == kind for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, kind))
        item.stash[_KIND] = kind
    _heavy_modules_first(items)


def _heavy_modules_first(items: list[pytest.Item]) -> None:
    """Modules with the slowest kinds of test first, each module's tests in their own order.

    ``make test`` hands whole modules to two pytest-xdist workers (``--dist loadfile``); a
    module of minutes (the frameworks') started last would run alone at the end, on one core.
    The order is the same in every worker, as xdist requires.
    """
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.partition("::")[0]
        weight[module] = max(weight.get(module, 0), _WEIGHT[item.stash[_KIND]])
    first = {module: i for i, module in reversed(list(enumerate(item.nodeid.partition("::")[0] for item in items)))}

    def rank(item: pytest.Item) -> tuple[int, int, int]:
        module = item.nodeid.partition("::")[0]
        name = module.rpartition("/")[2].removesuffix(".py")
        longest = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return longest, -weight[module], first[module]

    items.sort(key=rank)


_KIND = pytest.StashKey[str]()

#: Programs that libraries run to find a shared library (ctypes.util.find_library): not the test's.
_LIBRARY_PROBES = {"ldconfig", "gcc", "cc", "ld", "objdump", "uname"}


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a ``unit`` test that starts a process or opens a TCP connection
    (with ``MMLOADER_TEST_KINDS_RECORD=FILE``: list it in FILE instead, to survey a suite)."""
    if request.node.stash.get(_KIND, "unit") != "unit":
        yield
        return
    seen: list[str] = []
    starts = multiprocessing.process.BaseProcess.start
    popen = subprocess.Popen.__init__
    connect = socket.socket.connect

    def start(self, *a, **k):
        seen.append(f"started a process ({type(self).__name__})")
        return starts(self, *a, **k)

    def popen_init(self, *a, **k):
        args = a[0] if a else k.get("args")
        program = str(args[0] if isinstance(args, (list, tuple)) else args).rpartition("/")[2]
        if program not in _LIBRARY_PROBES:
            seen.append(f"ran {args!r}")
        return popen(self, *a, **k)

    def tcp_connect(self, address, *a, **k):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            seen.append(f"connected to {address}")
        return connect(self, address, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(multiprocessing.process.BaseProcess, "start", start)
    mp.setattr(subprocess.Popen, "__init__", popen_init)
    mp.setattr(socket.socket, "connect", tcp_connect)
    try:
        yield
    finally:
        mp.undo()
    if seen:
        kind = "network" if all(s.startswith("connected") for s in seen) else "process"
        record = os.environ.get("MMLOADER_TEST_KINDS_RECORD")
        if record:  # survey mode: list the tests to mark instead of failing them
            with open(record, "a") as f:
                f.write(f"{request.node.nodeid}\t{kind}\t{seen[0]}\n")
            return
        pytest.fail(
            f"a 'unit' test {seen[0]}{f' (and {len(seen) - 1} more)' if len(seen) > 1 else ''}: "
            f"mark it @pytest.mark.{kind} (tests/kinds.py)",
            pytrace=False,
        )
