"""Declared interventions through the real entry point (`snakemake`), on a vLLM-backend study whose
`vllm serve` is a stand-in (tests/fake_vllm.py) that records what its launch gave it, builds a NIXL
agent with a stand-in NIXL API as vLLM's NIXL worker does, and serves with `ctax sim`.

Issue 65: with CONNECTOR_TAX_INTERVENTIONS (and the step log's and the evidence's variables)
exported in the shell that runs snakemake, a variant that declares nothing runs without them and
its NIXL agent is as shipped; a declaring variant gets its own; its intervention's evidence is
kept in its launch's folder and run.json and the manifest say it was seen; a declaring variant
whose intervention had nothing to act on is a failed launch with the reason.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nixl import fake_nixl
from fake_vllm import NO_AGENT_ENV, VARIANT_ENV, write_fake_vllm
from study_runner import LENIENT_VALIDITY, SNAKEMAKE, TINY, write_config

from connector_tax.config import load_config
from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV
from connector_tax.contract import StudyLayout
from connector_tax.contract.records import STEP_LOG_ENV

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NIXL = {"type": "nixl", "role": "kv_both"}
OFF = "nixl_progress_off"


def _config(folder: Path, executable: Path) -> dict:
    config = copy.deepcopy(load_config(REPO / "configs" / "vllm-cpu-tiny.yaml"))
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config.update(study="interventions", sim=TINY["sim"], saturation=TINY["saturation"], validity=LENIENT_VALIDITY)
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(executable)
    config["server"]["ready_timeout_s"] = 120
    config["loadgen"] = {"workers": 1, "affinity": False, "cpu_latency_us": None}
    config["workload"].update(
        warmup_s=0.2,
        duration_s=0.6,
        min_completed=3,
        request_timeout_s=10,
        phase_a={"rates": [4], "shape": {"input": 64, "output": 8}},
    )
    variants = [
        {"name": "plain"},
        {"name": "nixl_both", "connector": NIXL},
        {"name": "nixl_off", "connector": NIXL, "interventions": [OFF]},
        {"name": "nixl_off_idle", "connector": NIXL, "interventions": [OFF], "env": {NO_AGENT_ENV: "1"}},
    ]
    for v in variants:
        v["env"] = {**v.get("env", {}), VARIANT_ENV: v["name"]}
    config["variants"] = variants
    return config


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("interventions")
    records, leaked = folder / "records", folder / "leaked"
    executable = write_fake_vllm(folder / "bin", records, fake_nixl(folder / "nixl"))
    path = write_config(folder, _config(folder, executable))
    env = {
        **os.environ,
        "FAKE_VLLM_CONFIG": str(path),
        "CONNECTOR_TAX_LOCKS": str(folder / "locks"),
        INTERVENTIONS_ENV: "nixl_progress_delay_1ms",  # what a user's shell might still export
        EVIDENCE_ENV: str(leaked / "evidence"),
        STEP_LOG_ENV: str(leaked / "steps.jsonl"),
    }
    argv = [*SNAKEMAKE, "--cores", "1", "phase_a", "--configfile", str(path), "--directory", str(folder)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    layout = StudyLayout(folder / "results" / "interventions")
    config = layout.study_config
    manifest = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "pipeline", "manifest", "--config", str(config)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert manifest.returncode == 0, manifest.stderr
    seen = {}
    for record in sorted(records.glob("*.json")):
        doc = json.loads(record.read_text())
        seen.setdefault(doc["variant"], []).append(doc)
    runs = {
        n: json.loads(layout.index(n, "phase_a").read_text())
        for n in ("plain", "nixl_both", "nixl_off", "nixl_off_idle")
    }
    return {"folder": folder, "layout": layout, "launched": seen, "runs": runs, "leaked": leaked}


def test_an_exported_variable_reaches_no_variant_that_does_not_declare_it(study):
    launched = study["launched"]
    assert set(launched) == {"plain", "nixl_both", "nixl_off", "nixl_off_idle"}, launched
    for name in ("plain", "nixl_both"):
        for one in launched[name]:
            assert INTERVENTIONS_ENV not in one["env"] and EVIDENCE_ENV not in one["env"], (name, one["env"])
            assert one["env"][STEP_LOG_ENV].startswith(str(study["layout"].root)), one["env"]  # the launch's own
    # as shipped: NIXL's progress thread on, polling with a 0 ms timeout, whatever the shell exported
    assert [one["agent"] for one in launched["nixl_both"]] == [
        {"name": "worker", "pthrDelay": 0, "useProgThread": True}
    ]
    assert not study["leaked"].exists()  # nothing wrote where the shell's variables pointed


def test_a_declaring_variant_gets_its_own_and_is_seen_acting(study):
    (one,) = study["launched"]["nixl_off"]
    assert one["env"][INTERVENTIONS_ENV] == OFF and one["agent"]["useProgThread"] is False
    run = study["runs"]["nixl_off"]
    assert run["status"] == "ok" and run["interventions"] == [OFF], run.get("reason")
    verdict = run["interventions_seen"][OFF]
    assert verdict["seen"] and verdict["calls"] == 1 and verdict["says"].startswith("declared and seen: 1 call(s)")
    evidence = Path(one["env"][EVIDENCE_ENV])  # in the launch's folder, beside run.json
    assert evidence.parent.parent == study["layout"].phase("nixl_off", "phase_a").folder
    (kept,) = [json.loads(p.read_text()) for p in evidence.glob(f"{OFF}.*.json")]
    assert kept["pid"] == one["pid"] and kept["calls"] == 1 and kept["installed"]


def test_a_declared_intervention_that_did_not_act_makes_the_launch_fail_with_the_reason(study):
    run = study["runs"]["nixl_off_idle"]
    assert run["status"] == "failed", run
    assert (
        run["reason"].startswith(f"{OFF} declared, not seen: ")
        and "none of which imported nixl_cu12._api" in run["reason"]
    )
    assert run["interventions_seen"][OFF]["seen"] is False
    assert all(c["status"] == "pending" and "not seen" in c["reason"] for c in run["cells"])


def test_the_manifest_says_declared_and_seen_per_launch(study):
    layout = study["layout"]
    rows = {
        r["variant"]: r for r in csv.DictReader(layout.manifest_tsv.open(), delimiter="\t") if r["phase"] == "phase_a"
    }
    assert rows["nixl_off"]["interventions_seen"].startswith(f"{OFF} declared and seen: 1 call(s)")
    assert rows["nixl_off_idle"]["interventions_seen"].startswith(f"{OFF} declared, not seen: ")
    assert rows["plain"]["interventions_seen"] == ""
    md = layout.manifest_md.read_text()
    assert f"- intervention of nixl_off / phase_a: {OFF} declared and seen" in md
