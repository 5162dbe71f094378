"""`ctax bench` against a server it cannot measure, through the real entry point: a model the server
does not serve, a path with no API behind it (one line naming the flag, exit 2, nothing
measured), and a cell whose every request fell in the warm-up (invalid, exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from sim_server import MODEL, REPO, running_sim  # noqa: E402


def bench(url: str, model: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", url, "--model", model, "--no-affinity"]
    cmd += ["--cpu-latency-us", "off", "--input-len", "32", "--output-len", "4", "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)  # a bail-out


@pytest.mark.e2e  # a simulated server and three short runs of ctax bench: seconds
def test_a_server_the_run_cannot_measure_is_said_not_measured(tmp_path: Path) -> None:
    with running_sim(tmp_path / "sim", connector="plain") as sim:
        wrong_model = bench(sim.url, "x", tmp_path / "a", "--rate", "1", "--duration", "1")
        wrong_path = bench(sim.url + "/api", MODEL, tmp_path / "b", "--rate", "1", "--duration", "1")
        warm_only = bench(
            sim.url, MODEL, tmp_path / "c", "--rate", "0.3", "--arrival", "fixed", "--duration", "0.5", "--warmup", "2"
        )
    assert (wrong_model.returncode, wrong_model.stdout) == (2, "")
    assert wrong_model.stderr == (f"ctax bench: --model: 'x' is not served at {sim.url} (it serves '{MODEL}')\n")
    assert (wrong_path.returncode, wrong_path.stdout) == (2, "")
    assert wrong_path.stderr == (
        f"ctax bench: --url: {sim.url}/api/v1/completions answered 404 to a one-token request: Not Found\n"
    )
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").iterdir())
    # Every request was a warm-up request: nothing measured, so not valid, and the exit code says so.
    assert warm_only.returncode == 1, warm_only.stderr
    assert warm_only.stdout.strip().endswith("[INVALID: no request measured: none ended ok after the warm-up]")
    summary = json.loads(next((tmp_path / "c").glob("summary_*.json")).read_text())
    assert summary["counts"]["ok"] == 0 and summary["validity"]["valid"] is False
