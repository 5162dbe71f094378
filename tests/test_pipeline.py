"""The Snakemake study: DAGs build for every shipped config, lint is clean, a tiny study runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from connector_tax.loadgen.affinity import plan_affinity

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile")]


def snakemake(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("config", ["default.yaml", "h20-qwen3-coder.yaml", "test-tiny.yaml"])
def test_dry_run_builds_the_dag_without_a_gpu(config, tmp_path):
    result = snakemake("-n", "--cores", "1", "--configfile", str(REPO / "configs" / config),
                       "--directory", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "preflight_config" in result.stdout


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


def test_tiny_study_preflight_skips_a_failing_config_and_goes_on(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    broken = next(c for c in config["configs"] if c["name"] == "mooncake_both")
    broken["sim"] = {"faults": {"fail_start": "bootstrap server unreachable"}}
    config["loadgen"] = {"cpu_latency_us": 25}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake("--cores", "1", "all", "--configfile", str(path), "--directory", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    results = tmp_path / "results" / config["study"]
    status = json.loads((results / "preflight" / "preflight_status.json").read_text())
    assert status["plain"]["status"] == "ok" and status["noop_connector"]["status"] == "ok"
    assert status["mooncake_both"]["status"] == "skip"
    assert "bootstrap server unreachable" in status["mooncake_both"]["reason"]
    launch = (results / "preflight" / "plain" / "launch.sh").read_text()
    assert "--connector plain" in launch and "--host 127.0.0.1" in launch
    # The server runs off the load generator's worker cores (its plan's server CPUs).
    run = json.loads((results / "plain" / "phase_a" / "run.json").read_text())
    assert run["served_by"] == "simulated vLLM (ctax sim)" and run["mooncake_transport"] is None
    assert run["server_cpus"] == list(plan_affinity(1).server_cpus)
    assert not set(run["server_cpus"]) & set(plan_affinity(1).worker_cpus[0]) or os.cpu_count() == 1
    # The config's load generator settings reach every cell, which says what they came to.
    summaries = list((results / "plain" / "phase_a").glob("summary_*.json"))
    assert summaries
    for summary in summaries:
        assert json.loads(summary.read_text())["cpu_latency"]["requested_us"] == 25
    manifest = (results / "MANIFEST.md").read_text()
    assert "**SIMULATED**" in manifest and "- served by: simulated vLLM (ctax sim)" in manifest
    report = (results / "analysis" / "report.md").read_text()
    assert "> **SIMULATED DATA.**" in report and "- Served by: simulated vLLM (ctax sim)" in report
    up_to_date = snakemake("--cores", "1", "all", "--configfile", str(path), "--directory", str(tmp_path))
    assert up_to_date.returncode == 0 and "Nothing to be done" in up_to_date.stdout + up_to_date.stderr


def _study_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return [p for p in found if p.pid != os.getpid()]


def test_ctrl_c_leaves_no_orphans_and_a_rerun_resumes_at_cell_level(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    config["configs"] = [c for c in config["configs"] if c["name"] == "plain"]
    config["workload"].pop("phase_b_prime")
    config["workload"]["phase_a"]["rates"] = [4, 8, 16]
    config["workload"].update(duration_s=2.0, min_completed=1)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    phase_dir = tmp_path / "results" / config["study"] / "plain" / "phase_a"
    proc = subprocess.Popen([*SNAKEMAKE, "--cores", "1", "phase_a", "--configfile", str(path), "--directory",
                             str(tmp_path)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (phase_dir / "summary_phase_a_r4.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "first cell never completed"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does to the foreground group
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while _study_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _study_processes(str(tmp_path)) == []
    first = (phase_dir / "requests_phase_a_r4.jsonl").stat().st_mtime_ns

    result = snakemake("--cores", "1", "phase_a", "--configfile", str(path), "--directory", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((phase_dir / "run.json").read_text())
    assert run["status"] == "ok"
    assert "phase_a/r4" in run["cells_resumed"] and "phase_a/r16" in run["cells_run"]
    assert (phase_dir / "requests_phase_a_r4.jsonl").stat().st_mtime_ns == first
