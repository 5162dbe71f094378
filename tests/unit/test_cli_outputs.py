"""Every `ctax` command that writes an output the user names (`-o`, `--out`, `--json`, `--workdir`,
`--write-scripts`) says in one line, exit 2, when it cannot be written, before its work starts; and
every number a command reads goes through one parser that refuses NaN and infinity
(connector_tax/arguments.py). `ctax plan`'s and `ctax compare`'s own cases: test_pipeline.py,
test_compare.py; `ctax bench`'s: test_loadgen_cli.py; `ctax truth`'s: test_oracle_truth.py."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_study import SyntheticSpec, write_study

from connector_tax.arguments import number, unwritable
from connector_tax.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A small study of two variants (one Phase A rate, one Phase B shape) to analyse."""
    spec = SyntheticSpec(
        study="s",
        variants=["plain", "nixl_both"],
        rates=[4.0],
        shapes=[(512, 64)],
        phase_b_prime=False,
        knee={},
        n_requests=100,
        n_steps=50,
    )
    return write_study(tmp_path_factory.mktemp("outputs") / "s", spec)


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["calibrate", "{tmp}", "-o", "{file}/p.yaml"], "ctax calibrate: -o {file}/p.yaml: {file} is not a folder"),
        (
            ["calibrate", "{tmp}", "-o", "{tmp}/p.yaml", "--json", "{file}/q.json"],
            "ctax calibrate: --json {file}/q.json: {file} is not a folder",
        ),
        (
            ["calibrate", "--check", "{tmp}", "--profile", "p.yaml", "--workdir", "{file}/w"],
            "ctax calibrate: --workdir {file}/w: {file} is not a folder",
        ),
        (
            ["calibrate", "{tmp}", "-o", "{tmp}/p.yaml", "--workdir", "{tmp}/w"],
            "ctax calibrate: --workdir: only with --check (it keeps the check's virtual cells)",
        ),
        (["analyze", "{study}", "--out", "{file}/a"], "ctax analyze: --out {file}/a: {file} is not a folder"),
        (["analyze", "{blocked}"], "ctax analyze: analysis folder {blocked}/analysis: not a folder"),
        (
            ["launch-command", "--config", "configs/default.yaml", "--write-scripts", "{file}/s"],
            "ctax launch-command: --write-scripts {file}/s: {file} is not a folder",
        ),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_before_the_work(study, tmp_path, capsys, monkeypatch, argv, says):
    # (`ctax analyze` of a study read it all, then ended in a traceback at its first write.)
    monkeypatch.chdir(REPO)
    (tmp_path / "file").write_text("")
    (study / "analysis").unlink(missing_ok=True)
    names = {"tmp": str(tmp_path), "file": str(tmp_path / "file"), "study": str(study), "blocked": str(study)}
    if "{blocked}" in argv:
        (study / "analysis").write_text("")  # a results folder whose analysis/ is a file
    assert _run([a.format(**names) for a in argv]) == 2
    assert capsys.readouterr().err == says.format(**names) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sim", "--variant", "plain", "--slow-start-s", "nan"], "argument --slow-start-s: nan is not a finite number"),
        (
            ["sim", "--variant", "plain", "--crash-after-s", "inf"],
            "argument --crash-after-s: inf is not a finite number",
        ),
        (
            ["sim", "--variant", "plain", "--http-500-rate", "nan"],
            "argument --http-500-rate: nan is not a finite number",
        ),
        (["launch-command", "--variant", "plain", "--port", "nan"], "argument --port: 'nan' is not a valid int"),
    ],
)
def test_every_command_refuses_a_number_that_is_none(argv, says):
    # In a process of its own: a simulated server that took the number would serve until killed.
    argv = [*argv, "--port", "0"] if argv[0] == "sim" else argv
    config = ["--config", "configs/default.yaml"]
    proc = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", argv[0], *config, *argv[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith(says), proc.stderr


def test_the_number_parser():
    rate = number(float, 0, low_open=True)
    assert rate("2.5") == 2.5 and isinstance(number(int)("3"), int)
    for text, says in [
        ("nan", "nan is not a finite number"),
        ("-inf", "-inf is not a finite number"),
        ("Infinity", "Infinity is not a finite number"),
        ("0", "0 must be > 0"),
        ("x", "'x' is not a valid float"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{says}$"):
            rate(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^2 must be in \[0, 1\]$"):
        number(float, 0, 1)("2")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'1.5' is not a whole number$"):
        number(int, noun="a whole number")("1.5")


def test_a_writable_output_leaves_nothing_behind(tmp_path):
    assert unwritable(tmp_path / "new" / "deeper" / "out.json", "--json") is None
    assert unwritable(tmp_path / "new" / "dir", "-o", folder=True) is None
    assert list(tmp_path.iterdir()) == []  # no folder made, no probe file left
    assert unwritable(tmp_path, "-o", folder=True) is None
    assert unwritable(tmp_path, "--json") == f"--json {tmp_path}: is a folder, not a file"
