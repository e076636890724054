"""Every Python and shell block of README.md runs, in order, as a new user would run them.

The blocks run in a scratch folder holding the raw data a user would bring (an image+caption
folder ``RAW/``, an ImageFolder tree ``train/``, a manifest ``captions.jsonl``, a text file
``corpus.txt`` and its ``tokenizer.json``, a Parquet table ``pairs.parquet``) and what
``make demo`` leaves in ``demo-out/``. Python blocks share one
namespace, like a notebook. Shell blocks run in bash with ``set -e``; the few commands a test
cannot run for real are checked instead: ``make TARGET`` runs as ``make -n TARGET`` (the target
exists and its recipe expands), ``pip install -e '.[EXTRA]'`` checks that the extra exists, and
``python benchmarks/X.py`` runs as ``--help`` (the script imports and parses its options).
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
BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[int, str, str]]:
    """(line, language, code) of every fenced block, in order."""
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def _user_data(work: Path) -> None:
    """What a new user brings, plus the demo's converted datasets."""
    py = sys.executable
    run = lambda *args: subprocess.run(args, cwd=work, check=True, capture_output=True)  # noqa: E731
    run(py, str(ROOT / "samples" / "make_data.py"), "RAW", "--count", "48", "--size", "32",
        "--corpus", "corpus.txt", "--corpus-lines", "300")
    for jpg in sorted((work / "RAW").glob("*.jpg")):  # an ImageFolder tree and a manifest of it
        label = (jpg.with_suffix(".cls")).read_text().strip()
        (work / "train" / f"class{label}").mkdir(parents=True, exist_ok=True)
        shutil.copy(jpg, work / "train" / f"class{label}" / jpg.name)
    with open(work / "captions.jsonl", "w") as f:
        for jpg in sorted((work / "RAW").glob("*.jpg")):
            f.write(json.dumps({"file": f"RAW/{jpg.name}", "caption": jpg.with_suffix(".txt").read_text(),
                                "label": int(jpg.with_suffix(".cls").read_text())}) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq
    jpgs = sorted((work / "RAW").glob("*.jpg"))
    pq.write_table(pa.table({"jpg": [j.read_bytes() for j in jpgs],
                             "caption": [j.with_suffix(".txt").read_text() for j in jpgs]}), work / "pairs.parquet")
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
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    _user_data(work)
    return work


def test_readme_has_blocks_to_run():
    langs = [lang for _line, lang, _code in blocks()]
    assert langs.count("python") >= 4 and langs.count("bash") >= 3, langs


def test_every_python_and_shell_block_runs(work, monkeypatch):
    monkeypatch.chdir(work)
    env = {**os.environ, "MMLOADER_ROOT": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    namespace: dict = {"__name__": "__readme__"}
    ran = 0
    for line, lang, code in blocks():
        if lang == "python":
            try:
                exec(compile(code, f"README.md:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"the Python block at README.md:{line} failed: {type(e).__name__}: {e}") from e
        elif lang in ("bash", "sh", "shell"):
            done = subprocess.run(["bash", "-c", SHELL_SHIMS + code], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=600)
            assert done.returncode == 0, f"the shell block at README.md:{line} failed ({done.returncode}):\n" \
                                         f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        else:
            continue
        ran += 1
    assert ran == sum(lang in ("python", "bash", "sh", "shell") for _l, lang, _c in blocks())
