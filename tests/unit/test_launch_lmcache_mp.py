"""LMCache's multi-process mode in the launch (launch/lmcache_mp.py): the connector's
kv-transfer-config, its LMCache server as a sidecar on the ports the caller reserved, CPU against
GPU defaults, and what every output calls the mode. Nothing is launched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typed import typed

from connector_tax.config import StudyConfig, load_config
from connector_tax.launch.command import SIDECAR_PORTS, launch_spec, sidecar_names
from connector_tax.launch.lmcache_mp import PLANNED_PORT, mode
from connector_tax.launch.provenance import lmcache_mode

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"
H20 = REPO / "configs" / "h20-qwen3-coder.yaml"


@pytest.fixture
def cpu(tmp_path) -> dict:
    config = load_config(CPU)
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(tmp_path / "no-vllm-here" / "vllm")  # the argv as configured
    config["vllm"]["lmcache_mp"]["executable"] = "/opt/venv/bin/lmcache"
    return config


def _ktc(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_the_cpu_launch_is_lmcaches_mp_connector_on_its_servers_reserved_port(cpu) -> None:
    study, variant = typed(cpu, "lmcache_only")
    assert sidecar_names(study, variant) == ["lmcache_server"] and SIDECAR_PORTS == 2
    spec = launch_spec(str(CPU), study, variant, 24000, sidecars={"lmcache_server": 25000})
    assert _ktc(spec.argv) == {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": 25000,
            "lmcache.mp.mp_transfer_mode": "engine_driven",
        },
    }
    (side,) = spec.sidecars
    assert side.argv == [
        "/opt/venv/bin/lmcache", "server", "--host", "127.0.0.1", "--port", "25000", "--http-host", "127.0.0.1",
        "--http-port", "25001", "--chunk-size", "256", "--l1-size-gb", "1", "--eviction-policy", "LRU",
        "--supported-transfer-mode", "engine_driven",
    ]  # fmt: skip
    assert side.env == {"NO_GPU_EXT": "1", "LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false"}
    assert (side.ready, side.registered) == ("http://127.0.0.1:25001/healthcheck", "http://127.0.0.1:25001/status")
    assert side.port == 25000 and side.ready_timeout_s == 60
    script = spec.script()  # launch.sh says what must run first, and how
    assert "# needs sidecar lmcache_server (LMCache MP server" in script and "--port 25000" in script


def test_an_lmcache_mp_child_of_a_multiconnector_points_at_the_same_server(cpu) -> None:
    spec = launch_spec(str(CPU), *typed(cpu, "multi_mooncake_lmcache"), 24000, sidecars={"lmcache_server": 25000})
    mooncake, lmcache = _ktc(spec.argv)["kv_connector_extra_config"]["connectors"]
    assert mooncake["kv_connector"] == "MooncakeConnector"
    assert lmcache["kv_connector"] == "LMCacheMPConnector" and lmcache["kv_role"] == "kv_both"
    assert lmcache["kv_connector_extra_config"]["lmcache.mp.port"] == 25000
    assert [s.name for s in spec.sidecars] == ["lmcache_server"]


def test_planned_launches_hold_no_reserved_port(cpu) -> None:
    """Plans and printed commands (no ports reserved) use LMCache's default, so fingerprints are stable."""
    spec = launch_spec(str(CPU), *typed(cpu, "lmcache_only"), 8000)
    assert _ktc(spec.argv)["kv_connector_extra_config"]["lmcache.mp.port"] == PLANNED_PORT
    assert spec.sidecars[0].port == PLANNED_PORT
    assert launch_spec(str(CPU), *typed(cpu, "plain"), 8000).sidecars == ()


def test_on_a_gpu_lmcaches_own_transfer_default_stands() -> None:
    h20 = load_config(H20)
    spec = launch_spec(str(H20), *typed(h20, "lmcache_mp_only"), 8000, sidecars={"lmcache_server": 25000})
    extra = _ktc(spec.argv)["kv_connector_extra_config"]
    assert extra == {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 25000}
    (side,) = spec.sidecars
    assert "--supported-transfer-mode" not in side.argv and "NO_GPU_EXT" not in side.env
    assert side.argv[0] == "lmcache"  # on PATH, as `vllm` is
    # the study's in-process variant is untouched: no sidecar, its class
    inproc = launch_spec(str(H20), *typed(h20, "lmcache_only"), 8000)
    assert _ktc(inproc.argv)["kv_connector"] == "LMCacheConnectorV1" and inproc.sidecars == ()


def test_every_output_names_the_mode(cpu) -> None:
    assert mode(*typed(cpu, "lmcache_only")) == ("multi-process (LMCacheMPConnector + lmcache server, engine_driven)")
    h20 = load_config(H20)
    assert mode(*typed(h20, "lmcache_only")) == "in-process (LMCacheConnectorV1)"
    assert mode(*typed(h20, "multi_mooncake_lmcache_mp")).startswith("multi-process")
    assert mode(*typed(h20, "mooncake_both")) is None
    sim = {**h20, "backend": "sim"}
    study = StudyConfig.from_mapping(sim)
    assert (lmcache_mode(study, study.variant("lmcache_mp_only")) or "").endswith(", simulated")


def test_launch_command_takes_the_sidecars_port() -> None:
    argv = [sys.executable, "-m", "connector_tax.cli", "launch-command", "--config", str(H20)]
    argv += ["--variant", "lmcache_mp_only", "--sidecar-port", "lmcache_server=23456"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _ktc(json.loads(done.stdout))["kv_connector_extra_config"]["lmcache.mp.port"] == 23456
    bad = subprocess.run([*argv[:-1], "23456"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr == "ctax launch-command: --sidecar-port: '23456' is not NAME=PORT\n"
