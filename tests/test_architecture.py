"""The package's layers: no module imports a layer above its own (storage <- readers <- align <- stream
<- loader <- CLI), and the pure planning layer opens no file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import mmloader

PACKAGE = Path(mmloader.__file__).parent

# Lower numbers are lower layers. A module may import its own layer and the ones below. The
# packages of mmloader/ are the layers (storage <- readers <- align <- planning/streaming <-
# loading <- frameworks <- CLI); inside loading/, its modules are layered again (SUBLAYERS).
LAYERS = {
    0: ["_version", "errors", "media", "planning", "cluster"],
    1: ["storage"],
    2: ["readers"],
    3: ["align"],
    4: ["loading"],
    5: ["live_sources"],  # a kind of stream the loaders take through loading.protocol, unnamed
    6: ["frameworks"],
    7: ["cli", "__init__"],
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}
SUBLAYERS = {
    "loading": {
        0: ["__init__", "distributed", "control", "diagnosis", "stalled", "nodes"],
        1: ["building", "replan", "packing", "protocol", "resumable", "stages", "ledger", "identity"],
        2: ["stream"],
        3: ["ring"],
        4: ["threaded", "dataloader", "on_ray"],
        5: ["device_stage", "gpu", "to_device", "config", "config_sources"],
    }
}


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
                base = list(package_parts[: len(package_parts) - (node.level - 1)])
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


def test_the_top_of_the_package_is_its_layers():
    """mmloader/ reads like the architecture: the layer packages and three small files."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 14, entries
    assert {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.suffix == ".py"} <= {
        "__init__",
        "_version",
        "errors",
    }


def test_dir_of_the_package_shows_its_api_and_layers_only():
    """What a user's ``dir(mmloader)`` or tab completion lists: the API and the layer packages,
    never a name the package imported for its own use (``sys``, ``Path``, ``Any``...)."""
    import types

    import mmloader

    def is_layer(name: str) -> bool:
        value = getattr(mmloader, name)
        return isinstance(value, types.ModuleType) and value.__name__ == f"mmloader.{name}"

    public = [n for n in dir(mmloader) if not n.startswith("_")]
    leaked = [
        n for n in public if n not in mmloader.__all__ and n not in ("open", "zip", "readers") and not is_layer(n)
    ]
    assert not leaked, leaked
    assert {"Stream", "loader", "open", "zip", "MMLoaderError"} <= set(public)


def test_no_module_imports_a_layer_above_its_own():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = LAYER_OF[_top(path)]
        for target in _imports(path):
            if target in LAYER_OF and LAYER_OF[target] > own:
                problems.append(
                    f"{path.relative_to(PACKAGE)} (layer {own}) imports {target} (layer {LAYER_OF[target]})"
                )
    assert not problems, "\n".join(problems)


def test_inside_a_package_no_module_imports_a_sublayer_above_its_own():
    problems = []
    for package, layers in SUBLAYERS.items():
        layer_of = {name: layer for layer, names in layers.items() for name in names}
        root = PACKAGE / package
        # a module, or a subpackage (stages/) whose modules count as one unit of its layer
        units = [(p.stem, p, 1) for p in root.glob("*.py")] + [(p.parent.name, p, 2) for p in root.glob("*/*.py")]
        for name, path, depth in sorted(units, key=lambda u: str(u[1])):
            own = layer_of[name]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == depth and node.module:
                    target = node.module.split(".")[0]
                    if layer_of.get(target, -1) > own:
                        where = path.relative_to(PACKAGE).as_posix()
                        problems.append(f"{where} imports {package}/{target} (a sublayer above)")
    assert not problems, "\n".join(problems)


def test_the_library_never_imports_the_converters_and_they_use_its_public_writer_api():
    """converters/ sit on top of mmloader: mmloader never imports them (only the CLI's convert
    dispatches to them, by name), and they import no layer above storage/readers-free code."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "converters" or n.startswith("mmloader.converters") for n in names), (
                f"{path} imports the converters"
            )
    allowed = {"errors", "media", "storage", "cluster", "cli", "__init__"}  # cli: its torch-free option types
    for path in sorted((PACKAGE.parent / "converters").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mmloader."):
                part = node.module.split(".")[1]
                assert part in allowed, f"converters/{path.name} imports mmloader.{part} (torch-facing layers)"


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

    names = [  # every planning module, and the pure parts of the other layers
        f"mmloader.planning.{p.stem}" for p in sorted((PACKAGE / "planning").glob("*.py")) if p.stem != "__init__"
    ] + [
        "mmloader.storage.keys",
        "mmloader.storage",
        "mmloader.media.imageinfo",
        "mmloader.align.collate",
        "mmloader.readers.seeding",
        "mmloader.loading.control",
        "mmloader.readers.cache",
        "mmloader.loading.config",
        "mmloader.readers.registry",
        "mmloader.storage.tar.layout",
        "mmloader.storage.sizes",
        "mmloader.loading.on_ray.builders",
        "mmloader.loading.on_ray.wire",
        "mmloader.loading.nodes.base",
    ]
    attempted = 0
    for name in names:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
        attempted += result.attempted
    assert attempted >= 20


@pytest.mark.process
def test_every_converter_imports_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, mmloader.converters.pairs, mmloader.converters.imagefolder, mmloader.converters.manifest, mmloader.converters.textlines, "
        "mmloader.converters.parquet, mmloader.converters.ray_engine; print(sorted(m for m in ('torch', 'torchvision') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


def test_one_registry_of_reader_kinds_feeds_reader_for_configs_and_the_api():
    from mmloader.loading import config_sources as config
    from mmloader.readers.registry import BUILTIN_READERS, KINDS, kind_for_field

    assert set(KINDS) | {"timestamps"} == config.READERS
    for kind in KINDS.values():
        assert getattr(mmloader, kind.cls.__name__) is kind.cls and kind.cls.__name__ in mmloader.__all__
        for ext in kind.extensions:
            assert kind_for_field(f"x.{ext}") is kind
    assert set(BUILTIN_READERS) >= {k.cls for k in KINDS.values()}
    text = (PACKAGE / "loading" / "config.py").read_text() + (PACKAGE / "loading" / "config_sources.py").read_text()
    assert "__name__ ==" not in text and '"VideoReader"' not in text  # classes, not their names as strings


def test_modules_have_one_path_each():
    """No release has shipped the paths modules had before the layer packages: one name each."""
    import importlib

    for old in ("stream", "config", "batching", "mediainfo", "verify", "dataloader"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"mmloader.{old}")
    assert importlib.import_module("mmloader.converters").__name__ == "mmloader.converters"


@pytest.mark.parametrize("root", [PACKAGE, PACKAGE.parent / "converters"], ids=["mmloader", "converters"])
def test_no_modules_import_each_other_round_a_circle(root):
    """Module import cycles of any length (lazy imports included), in the library and in the
    converters; a package's __init__ re-exporting its modules does not count."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(root).with_suffix("")
        me = ".".join(rel.parts)
        pkg = list(rel.parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                base = pkg[: len(pkg) - (node.level - 1)]
                graph.setdefault(me, set()).add(".".join(base + node.module.split(".")))

    def circle_from(start: str) -> list[str] | None:
        path, on_path, done = [start], {start}, set()

        def walk(node: str) -> list[str] | None:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return [*path, start]
                if nxt not in on_path and nxt not in done:
                    path.append(nxt)
                    on_path.add(nxt)
                    found = walk(nxt)
                    if found:
                        return found
                    on_path.discard(path.pop())
                    done.add(nxt)
            return None

        return walk(start)

    circles = sorted({" -> ".join(c) for m in graph if (c := circle_from(m)) and min(c) == m})
    assert not circles, circles


@pytest.mark.process
def test_torchvision_is_imported_by_what_decodes_images_to_tensors_alone():
    """torchvision takes 1.5 s of CPU to import (its models pull in torch._dynamo): a text or
    array pipeline, a loader and the CLI never import it; an ImageReader decoding to tensors
    imports it where it is made (forked DataLoader workers inherit it rather than each import it)."""
    import subprocess
    import sys

    code = (
        "import sys, mmloader\n"
        "from mmloader.loading import stream, dataloader, config\n"
        "from mmloader import readers, align\n"
        "mmloader.TextReader(None, 'txt'), mmloader.ImageReader(None, output='raw')\n"
        "print('torchvision' in sys.modules)\n"
        "mmloader.ImageReader(None)\n"
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


@pytest.mark.process
def test_the_cli_is_one_module_per_subcommand_and_its_parser_loads_no_torch():
    import subprocess
    import sys

    from mmloader import cli

    for name in cli.COMMANDS:
        module = getattr(cli, name)
        assert module.HELP and module.EXAMPLES and callable(module.add_arguments), name
    code = "import sys, mmloader.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def _map_of_the_tree() -> dict[str, str]:
    """docs/design.md's "Where things live": package path under mmloader/ -> what it says."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    block = text.split("## Where things live", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = line[:18].strip()
        if line.startswith("  ") and head.endswith("/") and not line.startswith("   "):
            current = head.rstrip("/")
            entries[current] = line[18:]
        elif not line.startswith(" "):
            current = None  # a top-level entry (converters/, docs/...): not the package's
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_the_map_of_the_tree_names_every_package_and_module():
    entries = _map_of_the_tree()
    packages = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert set(entries) == packages, (
        f"docs/design.md's map lacks {sorted(packages - set(entries))}, names {sorted(set(entries) - packages)} "
        "that do not exist"
    )
    unnamed = []
    for package, words in entries.items():
        said = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", words))
        for module in sorted((PACKAGE / package).glob("*.py")):
            if module.stem not in ("__init__", "__main__") and module.stem not in said:
                unnamed.append(f"{package}/{module.name}")
    assert not unnamed, f"docs/design.md's map does not name {unnamed}"


def test_no_module_is_over_500_lines():
    """One job per module: a module that outgrows 500 lines is doing two (split it by job)."""
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for root in (PACKAGE, PACKAGE.parent / "converters")
        for p in root.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"modules over 500 lines: {long}"


def test_no_two_test_modules_share_a_name():
    """pytest imports a test module by its file name (tests/ has no packages), so two rooms' files
    of one name collide: the second is not collected and spawned children import the wrong one."""
    tests = PACKAGE.parent / "tests"
    by_name: dict[str, list[str]] = {}
    for p in tests.rglob("*.py"):
        by_name.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert not {n: ps for n, ps in by_name.items() if len(ps) > 1}
