"""LMCache in its multi-process mode moves KV on this host's CPU: vLLM's LMCacheMPConnector stores a
request's KV in the LMCache server beside it and a later request of the same prompt retrieves it,
alone (lmcache_only) and as a MultiConnector's child beside Mooncake (multi_mooncake_lmcache),
with greedy outputs equal to plain vLLM's.

Marked `vllm_cpu` (skipped, with the reason, without vLLM's CPU environment or LMCache). The
launches are configs/vllm-cpu-tiny.yaml's, made the way the pipeline makes them: each LMCache
server a sidecar on ports of its own (serving/sidecar.py), ready before vLLM starts and stopped
after it. vLLM's own prefix caching is off here, so that a repeated prompt is served by LMCache
or recomputed, never from vLLM's cache. Stores and retrievals are read from the LMCache server's
own records: its /metrics (`lmcache_mp_l1_write_chunks_total`, `lmcache_mp_l1_read_chunks_total`)
and its log ("Stored 256 tokens", "Retrieved 256 tokens"). Three servers start side by side (one
wait instead of three); a bad port is also checked against the real server.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from typed import study_of, typed

from connector_tax.config import load_config, validate_config
from connector_tax.launch.command import SIDECAR_PORTS, launch_spec, sidecar_names
from connector_tax.launch.lmcache_mp import server as lmcache_server
from connector_tax.serving.server_process import ServerProcess, ServerStartError, free_port
from connector_tax.serving.sidecar import Sidecars

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
START_S = 600.0
PROMPT = list(range(100, 400))  # 300 tokens: one full LMCache chunk of 256, and a rest it does not store
NAMES = ("plain", "lmcache_only", "multi_mooncake_lmcache")

pytestmark = pytest.mark.vllm_cpu


def _python() -> Path:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        pytest.skip(
            "vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh` (or set "
            "CONNECTOR_TAX_VLLM_PYTHON to its bin/python)"
        )
    for module in ("lmcache.v1.multiprocess.http_server", "opentelemetry.exporter.prometheus", "mooncake.engine"):
        done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            pytest.skip(f"{module} does not import in vLLM's CPU environment ({last}): run tools/vllm_cpu_env.sh")
    return python


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
    config["server"]["enable_prefix_caching"] = False  # a repeat is LMCache's or recomputed
    return validate_config(config)


def _complete(url: str) -> str:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text[:500]
    return answer.json()["choices"][0]["text"]


def _server_log(entry: dict) -> str:
    folder = entry["folder"]
    return "".join(
        (folder / f"sidecar_lmcache_server_{kind}.log").read_text(errors="replace") for kind in ("stdout", "stderr")
    )


def _log_when(entry: dict, done: Callable[[str], bool], timeout_s: float = 15.0) -> str:
    """The LMCache server's log once `done` holds, or as it stands after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not done(text := _server_log(entry)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return text


@pytest.fixture(scope="module")
def servers(cpu_config, tmp_path_factory) -> Iterator[dict]:
    """plain, lmcache_only and multi_mooncake_lmcache, started side by side; each LMCache server a sidecar."""
    with contextlib.ExitStack() as stack:
        out: dict = {}
        for name in NAMES:
            study, variant = typed(cpu_config, name)
            folder = tmp_path_factory.mktemp(name)
            ports = {n: free_port(block=SIDECAR_PORTS) for n in sidecar_names(study, variant)}
            port = free_port(block=3)
            spec = launch_spec(str(CONFIG), study, variant, port, str(folder / "steps.jsonl"), ports)
            sidecars = stack.enter_context(Sidecars(spec.sidecars, folder))
            server = stack.enter_context(ServerProcess(spec, f"http://127.0.0.1:{port}", folder, grace_s=30.0))
            out[name] = {"server": server, "sidecars": sidecars, "folder": folder}
        for entry in out.values():
            entry["server"].wait_ready(START_S, entry["sidecars"].failure)
            entry["sidecars"].check_registered()
        yield out


@pytest.mark.parametrize("name", ["lmcache_only", "multi_mooncake_lmcache"])
def test_lmcache_stores_then_serves_a_repeated_prompt_with_plain_vllms_output(servers, name) -> None:
    expected = _complete(servers["plain"]["server"].url)
    entry = servers[name]
    assert "Stored" not in _server_log(entry)
    first = _complete(entry["server"].url)
    # LMCache's own record: its server logs each store and retrieval (after the request returned).
    log = _log_when(entry, lambda text: "Stored 256 tokens" in text)
    assert "Stored 256 tokens" in log and "Retrieved" not in log  # the first request's KV went to LMCache
    repeats = [_complete(entry["server"].url) for _ in range(2)]
    log = _log_when(entry, lambda text: text.count("Retrieved 256 tokens") >= 2)
    assert log.count("Retrieved 256 tokens") >= 2  # each repeat took its prefix from LMCache
    assert first == expected and repeats == [expected, expected]


def test_the_launch_is_lmcaches_mp_connector_against_its_own_server(servers) -> None:
    for name in ("lmcache_only", "multi_mooncake_lmcache"):
        log = (servers[name]["folder"] / "server_stdout.log").read_text(errors="replace")
        log += (servers[name]["folder"] / "server_stderr.log").read_text(errors="replace")
        assert "LMCacheMPConnector" in log
        assert "mode=engine_driven" in log or "mp_transfer_mode = engine_driven" in log
        (record,) = servers[name]["sidecars"].records()
        assert record["version"] == "lmcache 0.5.6" and record["registered"].endswith("/status")


def test_a_taken_port_fails_the_lmcache_server_at_once_with_its_reason(cpu_config, tmp_path) -> None:
    port = free_port(block=2)
    with socket.create_server(("127.0.0.1", port)):
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match="exited with code .*Address already in use") as err:
            with Sidecars((lmcache_server(study_of(cpu_config), "127.0.0.1", port),), tmp_path):
                pass
    assert time.monotonic() - t0 < 120 and "\n" not in str(err.value)
