"""The Snakemake study: DAGs build for every shipped config, lint is clean, a bad config is one
line (colliding cell labels included), before anything runs. Whole studies run in the end-to-end
tier: tests/e2e/test_results_integrity.py and tests/e2e/test_faults.py."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from study_runner import TINY, write_config
from study_runner import snakemake as study_snakemake

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile")]


def snakemake(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("config", ["default.yaml", "h20-qwen3-coder.yaml", "test-tiny.yaml"])
def test_dry_run_builds_the_dag_without_a_gpu(config, tmp_path):
    result = snakemake(
        "-n", "--cores", "1", "--configfile", str(REPO / "configs" / config), "--directory", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "preflight_config" in result.stdout


def test_the_top_level_snakefile_is_the_study_with_its_default_profile(tmp_path):
    """`snakemake --cores 1 all` in a checkout finds ./Snakefile (which includes workflow/Snakefile)
    and the default profile (its rerun-incomplete is what lets a killed study resume)."""
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "1",
            "all",
            "--configfile",
            str(REPO / "configs" / "default.yaml"),
        ]
        + ["--directory", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "workflow specific profile profiles/default" in dry.stdout + dry.stderr
    assert "preflight_config" in dry.stdout and "phase_a_plain" in dry.stdout


def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Congratulations" in result.stdout + result.stderr


def test_a_bad_config_fails_before_anything_runs_with_one_line(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    config["workload"]["phase_a"]["rates"] = []
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake("-n", "--cores", "1", "--configfile", str(path), "--directory", str(tmp_path))
    assert result.returncode != 0
    assert "config error: workload.phase_a.rates:" in result.stderr + result.stdout
    assert not (tmp_path / "results").exists()


def test_duplicate_labels_are_one_line_before_any_launch(tmp_path):
    config = copy.deepcopy(TINY)
    config["workload"]["phase_a"]["rates"] = [100, 100.000001]
    result = study_snakemake(tmp_path, write_config(tmp_path, config), "all", "-n")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("config error:")]
    assert lines == [
        "config error: workload.phase_a.rates[1]: 100.000001 gives the same cell label r100 as rates[0] "
        "(100); rates must differ in their first 6 significant digits"
    ]
    assert not (tmp_path / "results").exists()


def test_ctax_plan_prints_cells_stages_and_gpu_hours(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "connector_tax.cli",
            "plan",
            "--config",
            str(REPO / "configs" / "h20-qwen3-coder.yaml"),
            "--gpus",
            "8",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "phase_a    mooncake_both                  7" in out and "phase_b    mooncake_both                 12" in out
    hours = float(out.split("one job at a time; ")[1].split(" GPU-hours")[0])
    # Every cell runs at least its floor (duration_s + warmup_s; the shipped config departs from the
    # fixed plan's 60 s floor, so not its 4-5.5 h); launches add start-up on top, not hours.
    workload = yaml.safe_load((REPO / "configs" / "h20-qwen3-coder.yaml").read_text())["workload"]
    cells = sum(int(line.split()[2]) for line in out.splitlines() if line.startswith(("phase_a ", "phase_b ")))
    floor_h = cells * (workload["duration_s"] + workload["warmup_s"]) / 3600
    assert floor_h <= hours <= 1.25 * floor_h, (cells, floor_h, hours)
    one = float(out.split("total ")[1].split(" h")[0])
    eight = float(out.split("wall clock with that command: ")[1].split(" h")[0])
    assert eight < one / 4
    assert f"snakemake all --cores 48 --resources gpu=8 --configfile {REPO / 'configs' / 'h20-qwen3-coder.yaml'}" in out
    assert "no reference_rates.json yet" in out
    # One job at a time is the README's `--cores 1`, not a phase job's threads (3 on a 2-CPU host
    # for the default study): the same run, and the command a reader already knows.
    from connector_tax.config import load_study
    from connector_tax.planning.time_estimate import run_command

    for name in ("default", "vllm-cpu-tiny", "h20-qwen3-coder"):
        command = run_command(load_study(REPO / "configs" / f"{name}.yaml"), "C", 1)
        assert command.startswith("snakemake all --cores 1 ") and command.endswith(" --configfile C"), command
    bad = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "plan", "--gpus", "0"], cwd=REPO, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "ctax plan: argument --gpus: 0 must be >= 1"


def _with_rates(tmp_path: Path, rates: str) -> str:
    """configs/default.yaml with Phase A's rates as written in YAML (`.nan`, `.inf`)."""
    text = (REPO / "configs" / "default.yaml").read_text()
    assert "rates: [8, 16, 32]" in text
    path = tmp_path / f"rates-{rates.strip('[].')}.yaml"
    path.write_text(text.replace("rates: [8, 16, 32]", f"rates: {rates}"))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # numbers that are none: refused by the one number parser, before anything is planned
        (["plan", "--launch-s", "inf"], "ctax plan: argument --launch-s: inf is not a finite number"),
        (["plan", "--launch-s", "nan"], "ctax plan: argument --launch-s: nan is not a finite number"),
        (["plan", "--launch-s", "-1"], "ctax plan: argument --launch-s: -1 must be >= 0"),
        (["plan", "--gpus", "nan"], "ctax plan: argument --gpus: 'nan' is not a valid int"),
        # and in a config: it passed `config check`, then ended in a traceback or planned at inf req/s
        (["plan", "--config", "{nan}"], "ctax plan: {nan}: workload.phase_a.rates[0]: nan is not a finite number"),
        (["plan", "--config", "{inf}"], "ctax plan: {inf}: workload.phase_a.rates[0]: inf is not a finite number"),
        (["config", "check", "{nan}"], "{nan}: workload.phase_a.rates[0]: nan is not a finite number"),
        (["config", "check", "--static", "{inf}"], "{inf}: workload.phase_a.rates[0]: inf is not a finite number"),
        # --workdir keeps --predict's scratch study: alone it was silently ignored
        (
            ["plan", "--workdir", "{tmp}/w"],
            "ctax plan: --workdir: only with --predict (it keeps the prediction's scratch study)",
        ),
        # an output that cannot be written: one line before the work, not a traceback after it
        (["plan", "--json", "{file}/plan.json"], "ctax plan: --json {file}/plan.json: {file} is not a folder"),
        (["plan", "--json", "{tmp}"], "ctax plan: --json {tmp}: is a folder, not a file"),
        (["plan", "--predict", "--workdir", "{file}/w"], "ctax plan: --workdir {file}/w: {file} is not a folder"),
    ],
)
def test_ctax_plan_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, argv, says):
    from connector_tax.cli import main

    monkeypatch.chdir(REPO)  # the default --config
    (tmp_path / "file").write_text("")
    names = {
        "nan": _with_rates(tmp_path, "[.nan]"),
        "inf": _with_rates(tmp_path, "[.inf]"),
        "tmp": str(tmp_path),
        "file": str(tmp_path / "file"),
    }
    try:
        code = main([a.format(**names) for a in argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    assert (code, captured.err) == (2, says.format(**names) + "\n"), captured
    assert not (tmp_path / "w").exists() and not list(tmp_path.glob("**/plan.json"))
