"""The real connectors move KV on this host's CPU: a producer and a consumer `vllm serve` (NIXL, and
Mooncake over TCP) hand one request's KV cache over as vLLM's disaggregated-prefill proxies do
(tools/pd_transfer.py), and the consumer's greedy output equals a single server's.

Marked `vllm_cpu` (skipped, with the reason, without vLLM's CPU environment or a connector
library). Each pair is two launches of configs/vllm-cpu-tiny.yaml's configurations side by side
(NIXL: nixl_both twice; Mooncake: mooncake_producer and mooncake_consumer), each with its own
side-channel / bootstrap port. Also checked on the same servers: the connector's instrumentation
records (every worker hook wrapped, worker records written), the Mooncake CPU guard's record, the
threads a connector's constructor started, and that two launches got the same dummy weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from connector_tax.config import find_variant, load_config
from connector_tax.launch import steptiming
from connector_tax.launch.command import launch_spec
from connector_tax.launch.vllm import side_ports
from connector_tax.serving.process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
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


def _start(config: dict, name: str, out: Path) -> tuple[ServerProcess, int]:
    port = free_port("127.0.0.1", block=3)
    spec = launch_spec(str(CONFIG), config, find_variant(config, name), port, str(out / "steps" / "engine_step.jsonl"))
    server = ServerProcess(spec, f"http://127.0.0.1:{port}", out, grace_s=30.0)
    server.start()
    return server, port


@contextlib.contextmanager
def _pair(config: dict, tmp: Path, producer: str, consumer: str) -> Iterator[dict]:
    """Two servers started side by side, stopped however the block ends."""
    p, p_port = _start(config, producer, tmp / "prefill")
    try:
        d, d_port = _start(config, consumer, tmp / "decode")
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
# servers on two cores each run a spinning progress thread; on this host under other load
# (1-minute load 12-21) the answer came late: "handshake_failed ... zmq.error.Again", or after the
# producer's lease. Those, and only those, are this host's limit, not a broken transfer: skipped
# with the evidence (docs/connectors-cpu.md has the runs). Anything else fails.
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


def _check_transfer(servers: dict, which: str) -> None:
    result = servers["result"]
    if "error" in result and which == "nixl":
        limit = _host_limit(servers)
        if limit is not None:
            pytest.skip(f"NIXL's handshake did not finish in time on this loaded 2-core host ({limit}): {result}")
    assert "error" not in result, result
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
    """Two nixl_both servers; stopped when this class's tests are done (before Mooncake's start)."""

    @pytest.fixture(scope="class")
    def servers(self, cpu_config, tmp_path_factory) -> Iterator[dict]:
        _needs(Path(cpu_config["python"]), "nixl._api")
        config = copy.deepcopy(cpu_config)
        find_variant(config, "nixl_both")["connector"]["extra_config"] = {"kv_lease_duration": NIXL_LEASE_S}
        yield from _servers(config, tmp_path_factory.mktemp("nixl"), "nixl", "nixl_both", "nixl_both")

    def test_the_consumer_decodes_from_the_producers_kv_and_matches_a_single_server(self, servers):
        _check_transfer(servers, "nixl")

    def test_each_server_instrumented_its_connector(self, servers):
        _check_instrumented(servers, "nixl")


class TestMooncake:
    """mooncake_producer and mooncake_consumer over TCP, with the CPU guard."""

    @pytest.fixture(scope="class")
    def servers(self, cpu_config, tmp_path_factory) -> Iterator[dict]:
        _needs(Path(cpu_config["python"]), "mooncake.engine")
        tmp = tmp_path_factory.mktemp("mooncake")
        yield from _servers(cpu_config, tmp, "mooncake", "mooncake_producer", "mooncake_consumer")

    def test_the_consumer_decodes_from_the_producers_kv_and_matches_a_single_server(self, servers):
        _check_transfer(servers, "mooncake")

    def test_each_server_instrumented_its_connector(self, servers):
        _check_instrumented(servers, "mooncake")

    def test_the_mooncake_guard_acted_and_left_its_record(self, servers):
        for side in ("prefill", "decode"):
            records = list((servers["tmp"] / side / "steps").glob("engine_step.guards.*.json"))
            assert len(records) == 1, records
            record = json.loads(records[0].read_text())
            assert (
                record["disclosure"] == "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0"
            )
            assert record["disclosure"] in (servers["tmp"] / side / "server_stderr.log").read_text()
