"""Replicated, interleaved, common-random-number studies through `snakemake`, as a user runs them:
on the simulator in real time (each launch its own server, its own speed factor) and in virtual
time with cells that stop on their taxes."""

from __future__ import annotations

import copy
import json

import pytest
from study_runner import TINY, consistent, sealed_cells, snakemake, write_config

from connector_tax.contract import StudyLayout

pytestmark = pytest.mark.e2e


def _config(study: str, **workload) -> dict:
    config = copy.deepcopy(TINY)
    config["study"] = study
    config["workload"].update(replicates=2, aa_control=True, **workload)
    config["sim"]["launch_bias_sd"] = 0.05
    return config


def test_a_replicated_study_with_an_aa_control_runs_in_real_time(tmp_path):
    config = _config("replicated")
    path = write_config(tmp_path, config)
    result = snakemake(tmp_path, path, "all", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    cells = sealed_cells(tmp_path, config)
    assert len(cells) == 3 * 2 * 3 and all(cells.values()), cells  # 3 variants x 2 launches x 3 cells
    assert consistent(tmp_path, "replicated") == []
    layout = StudyLayout(tmp_path / "results" / "replicated")
    for name in ("plain", "noop_connector", "plain_aa"):
        for phase in ("phase_a", "phase_b"):
            one, two = (json.loads(layout.index(name, phase, r).read_text()) for r in (1, 2))
            assert (one["replicate"], two["replicate"]) == (1, 2)
            assert one["run_order"] == two["run_order"] and len(one["run_order"]) == 6
            seeds = [{c["label"]: c["settings"]["traffic_seed"] for c in i["cells"]} for i in (one, two)]
            assert all(seeds[0][label] != seeds[1][label] for label in seeds[0])  # each launch its own traffic
    a = json.loads(layout.index("plain", "phase_a").read_text())["cells"]
    b = json.loads(layout.index("noop_connector", "phase_a").read_text())["cells"]
    assert [c["settings"]["traffic_seed"] for c in a] == [c["settings"]["traffic_seed"] for c in b]  # CRN
    summary = json.loads(layout.phase("noop_connector", "phase_a", 2).cell("r4").summary.read_text())
    replicate_2 = json.loads(layout.index("noop_connector", "phase_a", 2).read_text())["cells"][0]
    assert summary["replicate"] == 2 and summary["traffic_seed"] == replicate_2["settings"]["traffic_seed"]
    report = (layout.analysis_dir / "report.md").read_text()
    assert "Launches: 2 per variant and phase" in report
    assert "Noise floor: the A/A control `plain_aa`" in report and "Which taxes survive" in report
    manifest = (layout.root / "MANIFEST.md").read_text()
    assert "plain.r2" in manifest and "noop_connector.r2" in manifest
    again = snakemake(tmp_path, path, "all")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_cells_that_stop_on_their_taxes_in_virtual_time(tmp_path):
    config = _config("paired", min_completed=200, duration_s=5, precision={"of": "tax", "target": 0.05})
    config["sim"]["clock"] = "virtual"
    path = write_config(tmp_path, config)
    result = snakemake(tmp_path, path, "all", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    layout = StudyLayout(tmp_path / "results" / "paired")
    for r in (1, 2):
        order = json.loads(layout.index("plain", "phase_a", r).read_text())["run_order"]
        assert order[0] == "plain" and order[3] == "plain.r2"  # the baseline opens every round
    stops = []
    for name in ("noop_connector", "plain_aa"):
        for r in (1, 2):
            for summary in layout.phase(name, "phase_a", r).folder.glob("summary_*.json"):
                doc = json.loads(summary.read_text())
                assert doc["precision_of"] == "tax" and doc["paired_with"].endswith(
                    summary.name.replace("summary_", "requests_").replace(".json", ".jsonl")
                )
                assert doc["min_completed"] == 64
                stops.append(doc["stop_reason"])
    assert stops and all("tax precision reached" in s or "baseline's cell paired" in s for s in stops), stops
    base = json.loads(layout.phase("plain", "phase_a").cell("r8").summary.read_text())
    assert base["stop_reason"] == "duration floor and min-completed" and base["counts"]["ok"] >= 200
    taxes = json.loads((layout.analysis_dir / "aggregate.json").read_text())["taxes"]
    tax = taxes["phase_a"]["ref_safe"]["variants"]["noop_connector"]["tpot_p90"]
    assert tax["replicates"] == 2 and tax["paired"] and tax["launch_share"] is not None
