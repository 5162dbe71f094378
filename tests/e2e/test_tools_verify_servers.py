"""tools/verify_*.sh and tools/gpu_smoke.sh end to end on this machine: the verify scripts against the
embedded simulator (backend sim launches `ctax sim` through the same `ctax launch-command
--script`), the smoke test against a stand-in `vllm` executable that serves HTTP and steps a fake
vLLM engine under the real instrumentation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from connector_tax.config import load_config

REPO = Path(__file__).resolve().parents[2]


TOOLS = REPO / "tools"


if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


from test_tools_verify import FAKE_VLLM_EXECUTABLE, run_script, script_env, write_config  # noqa: E402

from tools import preflight_client  # noqa: E402


def free_ports() -> int:
    """A port whose next two are free too (a launch takes PORT, PORT+1 and PORT+2: vLLM's HTTP,
    Mooncake's bootstrap and NIXL's side channel), asked of the OS rather than taken from a fixed
    range, so that two processes of this suite, or two checkouts' suites, never collide."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        held: list[socket.socket] = []
        try:
            for port in range(base, min(base + 3, 65536)):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            if len(held) == 3:
                return base
        except OSError:
            pass
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no three consecutive free ports on 127.0.0.1")


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_verify_noop_connector_passes_on_a_healthy_server(tmp_path):
    out = tmp_path / "preflight"
    done = run_script(
        "verify_noop_connector.sh",
        REPO / "configs" / "test-tiny.yaml",
        out,
        "--port",
        free_ports(),
        "--start-timeout",
        60,
        "--run",
        "run-1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "noop_connector: ok: passed: started, /v1/models, requests, /health and process alive"
    )
    status = json.loads((out / "preflight_status.json").read_text())
    # stamped with the run that asked (pipeline/preflight.py takes only its own run's verdict)
    assert status["noop_connector"]["status"] == "ok" and status["noop_connector"]["run"] == "run-1"
    log = (out / "verify_noop_connector.log").read_text()
    assert "request 5/5: 200" in log and "/health 200, server process alive" in log
    assert (out / "launch_noop_connector.sh").read_text().startswith("#!/usr/bin/env bash")


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_verify_records_skip_with_the_reason_when_the_server_dies(tmp_path):
    def mutate(config):
        config["variants"][1]["sim"] = {"faults": {"fail_start": "NoOpConnector import failed"}}

    path = write_config(tmp_path, mutate)
    out = tmp_path / "preflight"
    done = run_script("verify_noop_connector.sh", path, out, "--port", free_ports(), "--run", "run-2")
    assert done.returncode == 0, done.stderr
    entry = json.loads((out / "preflight_status.json").read_text())["noop_connector"]
    assert entry["status"] == "skip" and entry["run"] == "run-2"
    # the cause is the server's own last word (for_tools root-cause), not just "it died"
    assert entry["reason"] == (
        "server process exited during start-up: ctax sim: noop_connector: failed to start: NoOpConnector import failed"
    )
    assert "---- last 40 lines of" in (out / "verify_noop_connector.log").read_text()


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_verify_kv_consumer_runs_the_dummy_bootstrap_and_records(tmp_path):
    out = tmp_path / "preflight"
    done = run_script("verify_kv_consumer.sh", REPO / "configs" / "default.yaml", out, "--port", free_ports())
    assert done.returncode == 0, done.stderr
    status = json.loads((out / "preflight_status.json").read_text())
    assert status["mooncake_consumer"]["status"] == "ok"
    log = (out / "verify_mooncake_consumer.log").read_text()
    assert "dummy Mooncake bootstrap on 127.0.0.1:" in log
    assert "the dummy bootstrap served 0 request(s)" in log
    assert "request 1/1: 200" in log


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_verify_scripts_share_one_status_file(tmp_path):
    out = tmp_path / "preflight"
    config = REPO / "configs" / "default.yaml"
    a = run_script("verify_multi_connector.sh", config, out, "--port", free_ports())
    b = run_script("verify_noop_connector.sh", config, out, "--port", free_ports())
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    status = json.loads((out / "preflight_status.json").read_text())
    assert set(status) == {"multi_mooncake_lmcache", "noop_connector"}


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_gpu_smoke_end_to_end_with_a_stand_in_vllm(tmp_path):
    from test_patches_step_timing import make_fake_vllm

    fake_pkg = make_fake_vllm(tmp_path / "fake_pkg")
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(FAKE_VLLM_EXECUTABLE.format(python=sys.executable, fake_pkg=str(fake_pkg)))
    exe.chmod(0o755)
    env = script_env()
    env["PATH"] = f"{exe.parent}{os.pathsep}{env['PATH']}"
    keep = ["plain", "noop_connector", "mooncake_producer", "mooncake_both", "nixl_both", "multi_mooncake_lmcache"]
    base = yaml.safe_load((REPO / "configs" / "h20-qwen3-coder.yaml").read_text())
    base["variants"] = [c for c in base["variants"] if c["name"] in keep]
    base["workload"]["phase_b_prime"]["variants"] = ["plain"]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    out = tmp_path / "smoke"
    done = run_script(
        "gpu_smoke.sh",
        "--config",
        tmp_path / "base.yaml",
        "--out",
        out,
        "--port",
        free_ports(),
        "--start-timeout",
        60,
        env=env,
        timeout=300,
    )
    summary = json.loads((out / "gpu_smoke.json").read_text())
    results = {name: entry["result"] for name, entry in summary.items()}
    assert results == {
        "plain": "PASS",
        "noop_connector": "PASS",
        "mooncake_both": "PASS",
        "nixl_both": "FAIL",
        "multi_mooncake_lmcache": "SKIP",  # LMCache "not installed"
        "mooncake_producer": "SKIP",  # "Mooncake is not available"
    }, done.stdout + done.stderr
    assert "Mooncake is not available" in summary["mooncake_producer"]["reason"]
    assert done.returncode == 1  # nixl_both failed
    assert "NIXL agent failed" in summary["nixl_both"]["reason"]
    assert summary["plain"]["step_timing"]["step_timing_available"] is True
    records = (out / "noop_connector").glob("engine_step.engine.*.jsonl")
    lines = [json.loads(x) for f in records for x in f.read_text().splitlines()]
    assert len(lines) == 3 * 16  # 3 requests x max_tokens 16, one step per token
    smoke = load_config(out / "smoke.yaml")
    assert smoke["model"]["name"] == "Qwen/Qwen3-0.6B" and smoke["backend"] == "vllm"


@pytest.mark.e2e  # servers to readiness and requests: seconds each
def test_a_server_that_hangs_after_vllms_engine_failure_fails_the_start(tmp_path):
    """vLLM 0.32 on CPU sometimes hangs instead of exiting after "EngineCore failed to start"
    (a Mooncake worker's shutdown raises): the check ends a grace period after that line, with
    a reason the verify scripts complete with vLLM's root cause, instead of its 1200 s timeout."""
    server_log = tmp_path / "server.log"
    server_log.write_text("INFO starting\n")
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        log = preflight_client.Log(str(tmp_path / "check.log"))
        with pytest.raises(preflight_client.CheckFailed) as err:  # not yet: the plain timeout
            preflight_client.wait_ready("http://127.0.0.1:1", hung.pid, 1.5, log, str(server_log), grace=0.5)
        assert "not ready within" in str(err.value)
        server_log.write_text(
            "ERROR [mooncake_connector.py:1179] Mooncake is not available\n"
            "ERROR [core.py:1510] EngineCore failed to start.\n"
        )
        with pytest.raises(preflight_client.CheckFailed) as err:
            preflight_client.wait_ready("http://127.0.0.1:1", hung.pid, 60, log, str(server_log), grace=0.5)
        assert str(err.value) == preflight_client.HUNG_AT_START
        assert hung.poll() is None  # it did hang: the check, not the server, ended the wait
    finally:
        hung.kill()
        hung.wait()
    reason = subprocess.run(
        [
            "bash",
            "-c",
            f'PY={sys.executable}; . {TOOLS}/_verify_lib.sh; verify_reason "$1" "$2"',
            "_",
            preflight_client.HUNG_AT_START,
            str(server_log),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=script_env(),
    )
    assert reason.stdout.strip() == f"{preflight_client.HUNG_AT_START}: Mooncake is not available", reason.stderr


@pytest.mark.e2e  # two stand-in launches on a fake GPU: seconds each
def test_gpu_smoke_waits_for_the_gpu_and_runs_the_studys_graph_mode(tmp_path):
    """Each launch waits until the last server's memory is given back (no fixed sleep: the fake
    driver takes 2 s), on one GPU in PCI order; --graphs launches without --enforce-eager."""
    from fake_gpu_host import FakeGpuHost

    host = FakeGpuHost(tmp_path / "host", gpus=2, release_s=2.0)
    out = tmp_path / "smoke"
    env = {**script_env(), **host.env(out / "smoke.yaml")}
    base = yaml.safe_load((REPO / "configs" / "h20-qwen3-coder.yaml").read_text())
    base["variants"] = [c for c in base["variants"] if c["name"] in ("plain", "mooncake_both")]
    base["workload"]["phase_b_prime"]["variants"] = ["plain"]
    base["vllm"]["executable"] = str(host.bin / "vllm")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    args = ["--config", tmp_path / "base.yaml", "--out", out, "--port", free_ports(), "--gpu", "1", "--graphs"]
    done = run_script("gpu_smoke.sh", *args, "--start-timeout", 60, env=env, timeout=300)
    summary = json.loads((out / "gpu_smoke.json").read_text())
    # Both served (the simulator behind the stand-in writes no instrumentation report, so the step
    # timing check, which the other gpu_smoke test covers, fails here by design).
    assert sorted(summary) == ["mooncake_both", "plain"], done.stdout + done.stderr
    assert all(e["reason"].startswith("served the requests") for e in summary.values()), summary
    launches = host.state()["launches"]
    assert [launch["gpu"] for launch in launches] == ["1", "1"]
    assert launches[1]["free_mib"] == launches[0]["free_mib"]  # the second found the memory back
    waited = float((out / "mooncake_both" / "wait.log").read_text().split("after ")[1].split()[0])
    assert waited >= 1.0
    assert "--enforce-eager" not in (out / "plain" / "launch.sh").read_text()
