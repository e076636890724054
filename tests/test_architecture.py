"""The package's layers: no module imports a layer above its own (storage <- readers <- align <- stream
<- loader <- CLI), and the pure planning layer opens no file."""
from __future__ import annotations

import ast
from pathlib import Path

import mmloader

PACKAGE = Path(mmloader.__file__).parent

# Lower numbers are lower layers. A module may import its own layer and the ones below.
LAYERS = {
    0: ["_version", "errors", "distributed", "imageinfo", "mediainfo", "planning"],
    1: ["storage"],
    2: ["readers", "cache", "seeding"],  # seeding imports no mmloader module: readers draw from it
    3: ["align", "batching"],
    4: ["mixture", "control", "building", "stream"],
    5: ["resumable", "threaded", "ring", "dataloader", "gpu"],
    6: ["config", "planview", "preview", "describe", "verify", "bench", "frameworks"],
    7: ["cli", "__init__"],
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}


def _top(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    """Top-level package parts this module imports (relative or absolute), anywhere in it."""
    tree = ast.parse(path.read_text())
    package_parts = path.relative_to(PACKAGE).parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package_parts[:len(package_parts) - (node.level - 1)])
                target = base + (node.module.split(".") if node.module else [])
                if not target:  # "from . import x" at the top: x are modules
                    out += [a.name for a in node.names]
                else:
                    out.append(target[0])
            elif node.module and node.module.split(".")[0] == "mmloader" and "." in node.module:
                out.append(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out += [a.name.split(".")[1] for a in node.names if a.name.startswith("mmloader.")]
    return out


def test_every_module_has_a_layer():
    tops = {_top(p) for p in PACKAGE.rglob("*.py")}
    assert tops <= set(LAYER_OF), f"modules without a layer: {sorted(tops - set(LAYER_OF))}"


def test_no_module_imports_a_layer_above_its_own():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = LAYER_OF[_top(path)]
        for target in _imports(path):
            if target in LAYER_OF and LAYER_OF[target] > own:
                problems.append(f"{path.relative_to(PACKAGE)} (layer {own}) imports {target} "
                                f"(layer {LAYER_OF[target]})")
    assert not problems, "\n".join(problems)


def test_planning_is_pure():
    """Planning is numpy only: no file, process or torch I/O, so it can be tested exhaustively."""
    for path in (PACKAGE / "planning").rglob("*.py"):
        text = path.read_text()
        for forbidden in ("import torch", "open(", "import os", "import lmdb", "from ..storage"):
            assert forbidden not in text, f"{path.name} uses {forbidden!r}"


def test_docstring_examples_of_the_pure_modules_run():
    """The examples in docstrings that need no dataset are executed, so they cannot drift."""
    import doctest
    import importlib
    names = ["mmloader.planning.order", "mmloader.planning.partition", "mmloader.planning.mixing",
             "mmloader.planning.bucketing", "mmloader.planning.epoch", "mmloader.planning.resume",
             "mmloader.storage.keys", "mmloader.storage", "mmloader.imageinfo", "mmloader.batching",
             "mmloader.seeding", "mmloader.control", "mmloader.cache", "mmloader.config"]
    attempted = 0
    for name in names:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
        attempted += result.attempted
    assert attempted >= 20
