"""A whole study in the simulator's virtual time (`sim.clock: virtual`), through `snakemake`."""

from __future__ import annotations

import copy
import json

import pytest
from study_runner import consistent, sealed_cells, snakemake, write_config
from test_oracle_virtual_config import _ctax, virtual

from connector_tax.contract import StudyLayout


@pytest.mark.e2e
def test_a_virtual_study_runs_end_to_end_and_says_so(tmp_path):
    config = virtual("virtual")
    path = write_config(tmp_path, config)
    result = snakemake(tmp_path, path, "all")
    assert result.returncode == 0, result.stderr[-3000:]
    cells = sealed_cells(tmp_path, config)
    assert cells and all(cells.values()), cells
    assert consistent(tmp_path, "virtual") == []
    layout = StudyLayout(tmp_path / "results" / "virtual")
    summaries = [json.loads(p.read_text()) for p in layout.root.glob("*/*/summary_*.json")]
    assert summaries and all(s["clock"] == "virtual" and s["counts"]["ok"] >= 20 for s in summaries)
    index = json.loads((layout.root / "plain" / "phase_a" / "run.json").read_text())
    assert index["served_by"] == "simulated vLLM (ctax sim, virtual time)" and index["step_timing_available"]
    assert "virtual time" in (layout.root / "MANIFEST.md").read_text()
    report = (layout.root / "analysis" / "report.md").read_text()
    assert "virtual time" in report
    again = snakemake(tmp_path, path, "all")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.e2e
def test_switching_the_clock_measures_again(tmp_path):
    """A virtual cell is not a real one: the clock is a setting of every cell's fingerprint, so
    the real clock's plan measures every cell again (the dry run says what a run would do)."""
    config = virtual("switch")
    path = write_config(tmp_path, config)
    assert snakemake(tmp_path, path, "phase_a").returncode == 0
    assert all(v for k, v in sealed_cells(tmp_path, config).items() if "/phase_a/" in k)
    same = snakemake(tmp_path, path, "phase_a", "-n")
    assert same.returncode == 0 and "Nothing to be done" in same.stdout + same.stderr
    # A launch added (a second replicate) is named too: every cell of it is new.
    twice = copy.deepcopy(config)
    twice["workload"]["replicates"] = 2
    dry = snakemake(tmp_path, write_config(tmp_path, twice, "twice.yaml"), "phase_a", "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "connector-tax: plain.r2/phase_a: 2 of 2 cells to measure — a new launch" in dry.stderr, dry.stderr
    assert "connector-tax: plain/phase_a" not in dry.stderr  # measured, unchanged
    config["sim"]["clock"] = "real"
    dry = snakemake(tmp_path, write_config(tmp_path, config), "phase_a", "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    for name in ("plain", "noop_connector"):
        assert f"connector-tax: {name}/phase_a: 2 of 2 cells to measure" in dry.stderr, dry.stderr[-2000:]


@pytest.mark.e2e
def test_ctax_plan_predict_estimates_a_virtual_run_within_a_quarter(tmp_path):
    """`ctax plan --predict` computes Phase A and Phase B in virtual time before
    anything runs; its estimate of the whole study is held against the study's own cells."""
    config = virtual("predicted")
    config["variants"].append({"name": "mooncake_both", "connector": {"type": "mooncake", "role": "kv_both"}})
    config["workload"]["phase_b"] = {"inputs": [128, 1024], "outputs": [8, 64]}
    path = write_config(tmp_path, config)
    out = tmp_path / "plan.json"
    plan = _ctax("plan", "--config", str(path), "--predict", "--json", str(out), cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "note: predicted: Phase A and Phase B computed" in plan.stdout
    assert "2 variants, paired with the baseline" in plan.stdout  # every variant's Phase B, paired
    assert not (tmp_path / "results").exists()  # the prediction ran in a scratch folder
    estimate_h = json.loads(out.read_text())["total_s"] / 3600
    assert snakemake(tmp_path, path, "all").returncode == 0
    layout = StudyLayout(tmp_path / "results" / "predicted")
    cells = [json.loads(p.read_text()) for p in layout.root.glob("*/*/summary_*.json")]
    actual_h = (sum(s["wall_s"] + 1.5 for s in cells) + 2.0 * len(config["variants"])) / 3600
    assert abs(estimate_h / actual_h - 1) < 0.25, (estimate_h, actual_h)
