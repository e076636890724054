"""Every Python and shell block of README.md and of the documentation site (docs/) runs, in
order, as a new user would run them.

Two readers: one reads README.md from top to bottom, the other reads the site page after page
in the order of the ``nav`` of mkdocs.yml (Home, Convert, Read, ...). Each runs in its own
scratch folder, and its Python blocks share one namespace, like a notebook: a page may use what
an earlier page made (the Quickstart's ``ds``, ``jpeg``, ``colours``, ``pairs.lmdb``,
``captions/``). Each folder holds the raw data a user would bring (an image+caption folder
``RAW/``, an ImageFolder tree ``train/``, a manifest ``captions.jsonl``, a text file
``corpus.txt`` and its ``tokenizer.json``, a Parquet table ``pairs.parquet``) and what
``make demo`` leaves in ``demo-out/``. Shell blocks run in bash with ``set -e``; the few
commands a test cannot run for real are checked instead: ``make TARGET`` runs as
``make -n TARGET`` (the target exists and its recipe expands), ``pip install -e '.[EXTRA]'``
checks that the extra exists, and ``python benchmarks/X.py`` runs as ``--help`` (the script
imports and parses its options). Blocks in other languages (``text``, ``yaml``) are not run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
RUN = ("python", "bash", "sh", "shell")


def nav_pages(nav=None) -> list[Path]:
    """The site's pages in the order of mkdocs.yml's ``nav``."""
    if nav is None:
        import yaml

        nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages: list[Path] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [DOCS / value]
    return pages


def blocks(page: Path = README) -> list[tuple[str, int, str, str]]:
    """(where, line, language, code) of every fenced block of a page, in order."""
    text = page.read_text()
    where = str(page.relative_to(ROOT))
    return [(where, text[: m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


READERS = {"readme": [README], "site": nav_pages()}


def _user_data(work: Path) -> None:
    """What a new user brings, plus the demo's converted datasets."""
    py = sys.executable
    run = lambda *args: subprocess.run(args, cwd=work, check=True, capture_output=True)  # noqa: E731
    run(
        py,
        str(ROOT / "samples" / "make_data.py"),
        "RAW",
        "--count",
        "48",
        "--size",
        "32",
        "--corpus",
        "corpus.txt",
        "--corpus-lines",
        "300",
    )
    for jpg in sorted((work / "RAW").glob("*.jpg")):  # an ImageFolder tree and a manifest of it
        label = (jpg.with_suffix(".cls")).read_text().strip()
        (work / "train" / f"class{label}").mkdir(parents=True, exist_ok=True)
        shutil.copy(jpg, work / "train" / f"class{label}" / jpg.name)
    with open(work / "captions.jsonl", "w") as f:
        for jpg in sorted((work / "RAW").glob("*.jpg")):
            f.write(
                json.dumps(
                    {
                        "file": f"RAW/{jpg.name}",
                        "caption": jpg.with_suffix(".txt").read_text(),
                        "label": int(jpg.with_suffix(".cls").read_text()),
                    }
                )
                + "\n"
            )
    import pyarrow as pa
    import pyarrow.parquet as pq

    jpgs = sorted((work / "RAW").glob("*.jpg"))
    pq.write_table(
        pa.table({"jpg": [j.read_bytes() for j in jpgs], "caption": [j.with_suffix(".txt").read_text() for j in jpgs]}),
        work / "pairs.parquet",
    )
    (work / "demo-out").mkdir()
    mm = str(Path(py).parent / "mmloader")
    run(mm, "convert", "pairs", "RAW", "demo-out/shapes.lmdb", "-q")
    run(mm, "convert", "pairs", "RAW", "demo-out/shapes", "--shard-size", "16", "-q")
    shutil.copy(work / "corpus.txt", work / "demo-out" / "corpus.txt")
    from conftest import train_tokenizer  # the tokenizer.json a text model ships with

    train_tokenizer((work / "corpus.txt").read_text().splitlines(), work / "tokenizer.json")
    shutil.copytree(ROOT / "samples", work / "samples")


SHELL_SHIMS = r"""
set -euo pipefail
make() { command make -n -C "$MMLOADER_ROOT" "$@" > /dev/null; }
pip() {
  local spec; spec=$(printf '%s\n' "$@" | grep -o "\[.*\]" | tr -d '[]' || true)
  for extra in ${spec//,/ }; do
    grep -q "^$extra = \[" "$MMLOADER_ROOT/pyproject.toml" || { echo "no extra [$extra] in pyproject.toml" >&2; return 1; }
  done
}
python() {
  if [[ "${1:-}" == benchmarks/* ]]; then command python "$MMLOADER_ROOT/$1" --help > /dev/null; else command python "$@"; fi
}
"""


@pytest.fixture(scope="module")
def user_data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("user-data")
    _user_data(data)
    return data


def test_readme_fits_a_few_screens():
    assert len(README.read_text().splitlines()) < 300


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    pages = nav_pages()
    assert len(pages) == len(set(pages)), pages
    assert all(p.is_file() for p in pages), [str(p) for p in pages if not p.is_file()]
    assert sorted(DOCS.rglob("*.md")) == sorted(pages)


def test_readme_and_site_have_blocks_to_run():
    for reader, pages in READERS.items():
        langs = [lang for page in pages for _w, _l, lang, _c in blocks(page)]
        assert langs.count("python") >= 2 and langs.count("bash") >= 1, (reader, langs)
    langs = [lang for page in READERS["site"] for _w, _l, lang, _c in blocks(page)]
    assert langs.count("python") >= 8 and langs.count("bash") >= 5, langs


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_python_and_shell_block_runs(reader, user_data, tmp_path, monkeypatch):
    work = tmp_path / reader
    shutil.copytree(user_data, work, symlinks=True)
    monkeypatch.chdir(work)
    env = {
        **os.environ,
        "MMLOADER_ROOT": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    namespace: dict = {"__name__": "__readme__"}
    todo = [block for page in READERS[reader] for block in blocks(page) if block[2] in RUN]
    for where, line, lang, code in todo:
        if lang == "python":
            try:
                exec(compile(code, f"{where}:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"the Python block at {where}:{line} failed: {type(e).__name__}: {e}") from e
        else:
            done = subprocess.run(
                ["bash", "-c", SHELL_SHIMS + code], cwd=work, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, (
                f"the shell block at {where}:{line} failed ({done.returncode}):\n"
                f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
