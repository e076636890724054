"""The ``mmloader`` command: exit codes, help, one-line errors, and what inspect/bench/preview show."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import AS_ROOT, ROOT, write_dataset
from PIL import Image

import mmloader
from mmloader.cli import main as cli
from mmloader.cli.convert import CONVERTERS

COMMANDS = ("inspect", "verify", "index", "convert", "merge", "preview", "plan", "bench")


def call(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli([str(a) for a in argv])
    except SystemExit as e:  # argparse: --help (0) and usage errors (2)
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, command: str) -> None:
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"mmloader {command}"), err


# -- item 12: one convention ---------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[c] for c in COMMANDS] + [["convert", layout] for layout in CONVERTERS])
def test_help_of_every_subcommand_exits_0_with_an_example(capsys, argv):
    code, out, err = call(capsys, *argv, "--help")
    assert code == 0 and err == ""
    assert "examples:" in out and "mmloader " in out.split("examples:")[1]
    if argv == ["convert"]:
        assert all(layout in out for layout in CONVERTERS)


def test_top_level_help(capsys):
    code, out, _ = call(capsys, "--help")
    assert code == 0 and "exit status: 0 ok, 1 failure" in out and all(c in out for c in COMMANDS)


def _missing(tmp_path) -> dict[str, list]:
    m = tmp_path / "missing"
    return {
        "inspect": [m],
        "verify": [m, "-q"],
        "index": [m],
        "merge": [m, tmp_path / "out"],
        "preview": [m],
        "plan": [tmp_path / "missing.yaml"],
        "bench": [m],
        **{f"convert {layout}": [m, tmp_path / "out"] for layout in CONVERTERS},
    }


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "convert"] + [f"convert {l}" for l in CONVERTERS])
def test_missing_path_is_a_failure_exit_1(tmp_path, capsys, command):
    code, out, err = call(capsys, *command.split(), *_missing(tmp_path)[command])
    assert code == 1, (out, err)
    one_line_error(err, command)
    assert "missing" in err and ("does not exist" in err or "not a directory" in err)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "convert"] + [f"convert {l}" for l in CONVERTERS])
def test_non_dataset_path_is_a_failure_exit_1(tmp_path, capsys, command):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.md").write_text("# not a dataset\n")
    text = folder / "notes.md"
    argv = {
        "inspect": [folder],
        "verify": [folder, "-q"],
        "index": [folder],
        "merge": [folder, tmp_path / "o"],
        "preview": [folder],
        "plan": [folder],
        "bench": [folder],
        "convert pairs": [text, tmp_path / "o"],
        "convert imagefolder": [text, tmp_path / "o"],
        "convert manifest": [folder, tmp_path / "o"],
        "convert textlines": [folder, tmp_path / "o"],
        "convert parquet": [folder, tmp_path / "o"],
        "convert documents": [folder, tmp_path / "o"],
    }[command]
    code, out, err = call(capsys, *command.split(), *argv)
    assert code == 1, (out, err)
    one_line_error(err, command)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "the following arguments are required: COMMAND"),
        (["inspect"], "the following arguments are required: path"),
        (["inspect", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["convert"], "which layout?"),
        (["convert", "bogus"], "unknown layout 'bogus'"),
        (["convert", "pairs"], "the following arguments are required: src, dst"),
        (["bench", "x", "--batch-size", "0"], "argument --batch-size: 0: must be 1 or more"),
        (["bench", "x", "--epochs", "0"], "argument --epochs: 0: must be 1 or more"),
        (["bench", "x", "--workers", "-1"], "argument --workers: -1: must be 0 or more"),
        (["bench", "x", "--step-ms", "-3"], "argument --step-ms: -3: must be a number more than 0"),
        (["preview", "x", "-n", "0"], "argument -n: 0: must be 1 or more"),
        (["inspect", "x", "-n", "-1"], "argument -n/--preview: -1: must be 0 or more"),
        (["plan", "x.yaml", "--world", "0"], "argument --world: 0: must be 1 or more"),
        (["convert", "pairs", "a", "b", "--shuffle-seed", "-1"], "argument --shuffle-seed: -1: must be 0 or more"),
        (
            ["convert", "textlines", "a", "b", "--format", "tar", "--shard-size", "-1"],
            "argument --shard-size: -1: must be 1 or more",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_message(capsys, argv, message):
    code, out, err = call(capsys, *argv)
    assert code == 2 and message in err and "Traceback" not in err, err


# -- item 10: one line, never a traceback --------------------------------------------------------
@pytest.fixture
def unreadable_lmdb(tmp_path, monkeypatch):
    """An LMDB dataset whose data.mdb cannot be read: chmod 000, or as root (who reads it anyway)
    the error lmdb raises then (EACCES -> lmdb.ReadonlyError) raised by lmdb.open."""
    import lmdb

    path = write_dataset(tmp_path / "locked.lmdb", 5, "lmdb")
    data = path / "data.mdb"
    if AS_ROOT:
        real = lmdb.open

        def refuse(p, *a, **kw):
            if os.path.realpath(p) in (os.path.realpath(path), os.path.realpath(data)):  # (stores open data.mdb)
                raise lmdb.ReadonlyError(f"{data}: Permission denied")
            return real(p, *a, **kw)

        monkeypatch.setattr(lmdb, "open", refuse)
        yield path
    else:
        data.chmod(0)
        yield path
        data.chmod(0o644)


def test_unreadable_lmdb_is_one_line_for_inspect_and_verify(capsys, unreadable_lmdb):
    code, out, err = call(capsys, "inspect", unreadable_lmdb)
    assert code == 1
    one_line_error(err, "inspect")
    assert "cannot open the LMDB environment" in err and "Permission denied" in err
    code, out, err = call(capsys, "verify", unreadable_lmdb, "-q")
    assert code == 1
    one_line_error(err, "verify")
    assert "cannot open the LMDB environment" in err


def test_verify_lists_an_unreadable_shard_and_exits_1(tmp_path, capsys, unreadable):
    path = write_dataset(tmp_path / "shards", 12, "tar", shard_size=4)
    unreadable(path / "data-000001.tar")
    code, out, err = call(capsys, "verify", path, "-q")
    assert code == 1 and "Traceback" not in err
    assert "data-000001.tar: unreadable: Permission denied" in out
    assert "8 samples checked" in out  # the other two shards were still checked


@pytest.mark.process
def test_broken_pipe_is_quiet(tmp_path):
    path = write_dataset(tmp_path / "d.lmdb", 5, "lmdb")
    for argv in (["inspect", str(path)], ["--help"]):
        r, w = os.pipe()
        os.close(r)  # the reader is gone before the first write, as with `| head` that already quit
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "mmloader.cli", *argv],
                stdout=w,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        finally:
            os.close(w)
        assert proc.stderr == "", proc.stderr
        assert proc.returncode in (141, 0) if argv == ["--help"] else proc.returncode == 141


# -- what inspect, bench and preview show ----------------------------------------------------------
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_inspect_shows_format_counts_fields_and_a_preview(capsys, lmdb_ds, tar_ds, fmt):
    path = lmdb_ds if fmt == "lmdb" else tar_ds
    code, out, err = call(capsys, "inspect", path, "-n", "2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert re.fullmatch(rf"format:  {fmt} \(mmloader-(lmdb|tar) v\d+\)", lines[1]), lines[1]
    assert "samples: 23" in lines
    fields = {m.group(1): int(m.group(2)) for m in re.finditer(r"^  (\w+) +(\d+) samples", out, re.M)}
    assert fields == {"cls": 23, "jpg": 23, "json": 23, "npy": 23, "txt": 23}
    if fmt == "tar":
        assert "shards:  5 " in out and "data-000000.tar: 5 samples" in out and "... 2 more" in out
    assert "[0] key='s00000'" in out and "[1] key='s00001'" in out and "[2]" not in out
    assert "jpg: <jpeg 48x32," in out and "txt: 'caption number 0 é'" in out


def test_bench_prints_its_figures(tmp_path, capsys):
    path = write_dataset(tmp_path / "b.lmdb", 12, "lmdb")
    code, out, err = call(
        capsys, "bench", path, "--epochs", "1", "--batch-size", "4", "--workers", "0", "--step-ms", "1000"
    )
    assert code == 0, err
    head, *rest = out.splitlines()
    m = re.fullmatch(
        r".*b\.lmdb: (\d+) samples in ([\d.]+) s over 1 epoch\(s\), thread backend, 0 workers, "
        r"batch 4",
        head,
    )
    assert m and int(m.group(1)) == 12, head
    figures = {l.split()[0]: l for l in rest}
    rate = float(re.search(r"([\d,]+) samples/s", figures["throughput"]).group(1).replace(",", ""))
    seconds = float(m.group(2))  # printed to 0.01 s: the rate agrees within that rounding
    assert 12 / (seconds + 0.005) - 1 <= rate <= (12 / (seconds - 0.005) if seconds > 0.005 else float("inf"))
    assert float(re.search(r"([\d.]+) MB/s", figures["throughput"]).group(1)) > 0
    assert re.search(r"first batch +\d+ ms", figures["first"])
    assert len(re.findall(r"[\d.]+ s", figures["epochs"])) == 1
    pss = re.search(r"peak PSS of the loader's process tree (\d+) MB", figures["memory"])
    assert pss and int(pss.group(1)) > 0
    assert "vs a 1000 ms step" in figures["step"] and "not data-bound" in figures["step"]
    assert re.fullmatch(
        r"  stages +read [\d.]+, decode [\d.]+, collate [\d.]+ ms per batch, per builder", figures["stages"]
    )
    assert figures["advice"].split(None, 1)[1] == "data keeps up: the loop waits for it 0% of its time"


def _solid_png(rgb) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 20), rgb).save(buf, "PNG")
    return buf.getvalue()


def test_preview_draws_each_sample_image(tmp_path, capsys):
    colours = [(255, 0, 0), (0, 200, 0), (0, 0, 255), (250, 200, 0), (0, 0, 0)]
    path = tmp_path / "c.lmdb"
    with mmloader.writer_for(path) as w:
        for i, c in enumerate(colours):
            w.write({"__key__": f"k{i}", "png": _solid_png(c), "txt": f"colour {i}"})
    out = tmp_path / "sheet.png"
    code, text, err = call(capsys, "preview", path, "-o", out, "-n", "5", "--columns", "2")
    assert code == 0, err
    assert "[0] k0 | txt: colour 0" in text
    sheet = np.asarray(Image.open(out).convert("RGB")).astype(int)
    from mmloader.cli.preview import THUMB

    cell_w, cell_h = THUMB + 16, THUMB + 64 + 8
    for n, c in enumerate(colours):  # the middle of each cell's thumbnail is the sample's colour
        x, y = (n % 2) * cell_w + 8 + THUMB // 2, (n // 2) * cell_h + 4 + THUMB // 2
        assert np.abs(sheet[y, x] - np.array(c)).max() <= 2, (n, sheet[y, x], c)
    assert (sheet[(THUMB // 2) - 45 : (THUMB // 2) - 38, 8 + THUMB // 2] == 255).all()  # above a 2:1 thumb: white


@pytest.mark.process
def test_the_command_line_starts_without_importing_storage_or_torch():
    """A Ctrl-C while the CLI started (importing storage took ~0.3 s) printed an import's
    KeyboardInterrupt traceback (issue 60): now the CLI's own handler is in place at once."""
    code = "import sys, mmloader.cli; print(sorted(m for m in ('mmloader.storage', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv, said", [(["convert", "pairs", "a", "b"], "interrupted: nothing written"), (["inspect", "x"], "interrupted")]
)
def test_an_interrupt_is_one_line(monkeypatch, capsys, argv, said):
    import mmloader.cli as cli_module

    def interrupted(_argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "_run", interrupted)
    assert cli_module.main(argv) == 130
    assert capsys.readouterr().err == said + "\n"
