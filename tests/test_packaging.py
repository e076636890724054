"""The wheel as users install it: built from this tree, installed into a fresh venv, used there.

converters/ sits at the top of the repository but installs as ``mmloader.converters`` (a
top-level ``converters`` package would clash with any other project's); ``mmloader convert``
and ``python -m mmloader.converters.X`` work from the wheel; the package list in
pyproject.toml covers every package folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _packages_in_pyproject() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_the_package_list_covers_every_package_folder():
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mmloader").rglob("__init__.py")}
    assert set(_packages_in_pyproject()) == on_disk | {"mmloader.converters"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("mmloader-*.whl"))


def test_the_wheel_installs_the_converters_under_mmloaders_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith("converters/") for n in names), [n for n in names if n.startswith("converters/")]
    assert {
        "mmloader/converters/__init__.py",
        "mmloader/converters/pairs.py",
        "mmloader/py.typed",
        "mmloader/storage/remote/__init__.py",
    } <= set(names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mmloader = mmloader.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_wheel_works_in_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies come from this interpreter's site-packages, as a plain path: its .pth files
    # (the editable install of this checkout among them) are not run there.
    Path(target, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", target, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    raw = tmp_path / "raw"
    raw.mkdir()
    from conftest import jpeg_bytes

    for i in range(3):
        (raw / f"{i}.jpg").write_bytes(jpeg_bytes(i))
        (raw / f"{i}.txt").write_text(f"caption {i}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    run = lambda *args: subprocess.run(
        [str(python), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,  # noqa: E731
        text=True,
        timeout=120,
    )
    where = run("-c", "import mmloader, mmloader.converters.pairs as p; print(mmloader.__file__, p.__file__)")
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(path.startswith(target) for path in where.stdout.split()), where.stdout
    assert run("-c", "import converters").returncode != 0  # no top-level package of that name
    assert run("-m", "mmloader.converters.pairs", "--help").returncode == 0
    done = run("-m", "mmloader.cli", "convert", "pairs", "raw", "out.lmdb", "-q")
    assert done.returncode == 0, done.stderr[-2000:]
    check = run("-c", "import mmloader; ds = mmloader.open('out.lmdb'); print(len(ds), sorted(ds.fields))")
    assert check.stdout.split("\n")[0] == "3 ['jpg', 'txt']", check.stderr[-2000:]
