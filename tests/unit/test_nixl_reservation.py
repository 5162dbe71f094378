"""The two declared interventions that move vLLM's CPU reservation for NIXL off the worker's compute
cores (patches/interventions/nixl_reservation.py), on fakes of vLLM's CPU platform and of NIXL's
API module; with the real vLLM 0.32 and NIXL 1.5.1 they are measured by
configs/overlays/nixl-reservation.yaml (docs/nixl-progress.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from connector_tax.config.interventions import INTERVENTIONS_ENV, REGISTRY

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from patches.interventions import nixl_reservation as nr  # noqa: E402

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "bind, cores",
    [("1", {1}), ("0-3|4-7", set(range(8))), ("1,3", {1, 3}), ("auto", None), ("nobind", None), ("", None)],
)
def test_the_compute_cores_are_vllms_omp_binding_or_none(bind, cores):
    assert nr.compute_cores({nr.OMP_BIND_ENV: bind}) == cores
    assert nr.compute_cores({}) is None  # vLLM's default is auto: its own choice


def test_each_node_keeps_its_cores_off_the_compute_ones_or_all_when_none_is_left():
    assert nr.off_compute([[0, 1], [2, 3]], {1, 3}) == [[0], [2]]
    assert nr.off_compute([[1], [2, 3]], {1, 2}) == [[1], [3]]


def _platform() -> type:
    class CpuPlatform:  # vLLM's: each node's physical cores, read from /sys
        @classmethod
        def discover_numa_topology(cls) -> list[list[int]]:
            return [[0, 1], [2, 3]]

    return CpuPlatform


def test_the_reservation_leaves_out_the_compute_cores(monkeypatch, capsys):
    cls, fired = _platform(), []
    monkeypatch.setenv(nr.OMP_BIND_ENV, "1,3")
    assert nr.reserve_off_compute(cls, fired.append) and not nr.reserve_off_compute(cls)  # idempotent
    nodes = cls.discover_numa_topology()
    assert nodes == [[0], [2]] and [max(n) for n in nodes] == [0, 2]  # what vLLM then reserves
    assert fired == [{"nodes": [[0, 1], [2, 3]], "compute": [1, 3], "reserved": [0, 2]}]
    monkeypatch.setenv(nr.OMP_BIND_ENV, "auto")  # no cores named: vLLM's choice, said on stderr
    assert cls.discover_numa_topology() == [[0, 1], [2, 3]] and len(fired) == 1
    assert "names no cores; not applied" in capsys.readouterr().err


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to tell the agent's from the caller's")
def test_the_agent_is_built_on_the_reserved_cores_and_its_caller_put_back():
    seen: dict[str, object] = {}

    class nixl_agent:  # noqa: N801 (nixl's name)
        def __init__(self, name: str, conf: object = None) -> None:
            seen["during"] = sorted(os.sched_getaffinity(0))  # what the agent's threads inherit

    api, fired = types.SimpleNamespace(nixl_agent=nixl_agent), []
    assert nr.agent_off_compute(api, lambda: [ALLOWED[0]], fired.append)
    assert not nr.agent_off_compute(api)  # idempotent

    def build() -> None:
        os.sched_setaffinity(0, [ALLOWED[-1]])  # the worker's main thread, bound to its compute core
        api.nixl_agent("w")
        seen["after"] = sorted(os.sched_getaffinity(0))

    thread = threading.Thread(target=build)
    thread.start()
    thread.join(10)
    assert seen == {"during": [ALLOWED[0]], "after": [ALLOWED[-1]]}
    assert fired[0]["agent_cores"] == [ALLOWED[0]] and fired[0]["thread_cores"] == [ALLOWED[-1]]


FAKES = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": "from vllm.platforms.cpu import CpuPlatform\ncurrent_platform = CpuPlatform()\n",
    "vllm/platforms/cpu.py": """
        class CpuPlatform:
            @classmethod
            def discover_numa_topology(cls):
                return [[0, 1]]
    """,
    "nixl_cu12/__init__.py": "",
    "nixl_cu12/_api.py": """
        import os

        class nixl_agent:
            def __init__(self, name, nixl_conf=None):
                self.cpus = sorted(os.sched_getaffinity(0))
    """,
}


@pytest.mark.skipif(ALLOWED[:2] != [0, 1], reason="the fakes' node is cores 0 and 1")
@pytest.mark.parametrize(
    "declared, topology, agent",
    [
        (None, [[0, 1]], [1]),  # as shipped: vLLM reserves core 1, the agent is built where its caller is
        ("nixl_kv_core_off_compute", [[0]], [1]),
        ("nixl_agent_off_compute", [[0, 1]], [0]),
        ("nixl_progress_off", [[0, 1]], [1]),  # another intervention: not these
    ],
)
def test_through_the_site_hook_in_a_fresh_process(tmp_path, declared, topology, agent):
    for rel, text in FAKES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    folder = tmp_path / "evidence"
    env = {k: v for k, v in os.environ.items() if k not in (INTERVENTIONS_ENV, "CONNECTOR_TAX_EVIDENCE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "patches" / "site"), str(tmp_path)])
    env[nr.OMP_BIND_ENV] = "1"  # the study's compute core
    if declared is not None:
        env.update({INTERVENTIONS_ENV: declared, "CONNECTOR_TAX_EVIDENCE": str(folder)})
    code = (
        "import importlib, json, os\n"
        "os.sched_setaffinity(0, [1])\n"  # the worker's main thread, bound by OpenMP
        "from vllm.platforms import current_platform\n"
        "api = importlib.import_module('nixl_cu12._api')\n"
        "a = api.nixl_agent('w')\n"
        "print(json.dumps([current_platform.discover_numa_topology(), a.cpus, sorted(os.sched_getaffinity(0))]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [topology, agent, [1]]
    acted = declared in nr.DISCLOSURES
    records = [json.loads(r.read_text()) for r in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    assert [r["intervention"] for r in records if r["calls"]] == ([declared] if acted else [])
    assert (nr.DISCLOSURES.get(declared or "", "never") in done.stderr) == acted


def test_both_are_declared_nixl_interventions_with_their_overlay():
    for name in (nr.KV_CORE, nr.AGENT):
        assert REGISTRY[name].connector == "nixl" and REGISTRY[name].overlay == "configs/overlays/nixl-reservation.yaml"
    with pytest.raises(ValueError):
        nr.install("nixl_progress_off")


def test_the_overlay_measures_nixl_beside_both_and_plain_replicated():
    import yaml

    from connector_tax.config import load_config, validate_config
    from connector_tax.config.merge import deep_merge

    overlay = yaml.safe_load((REPO / "configs" / "overlays" / "nixl-reservation.yaml").read_text())
    config = validate_config(deep_merge(load_config(REPO / "configs" / "vllm-cpu-tiny.yaml"), overlay))
    declared = {v["name"]: v.get("interventions", []) for v in config["variants"]}
    assert declared == {
        "plain": [],
        "nixl_both": [],
        "nixl_kv_core_off": [nr.KV_CORE],
        "nixl_agent_off": [nr.AGENT],
    }
    assert config["workload"]["replicates"] == 2 and config["study"] == "vllm-cpu-nixl-reservation"
    assert config["vllm"]["cpu"]["omp_threads_bind"] == "1"  # the compute core the reservation moves off


def test_an_intervention_that_addresses_no_thread_shows_the_servers_cpu_not_a_missing_thread():
    """nixl_kv_core_off_compute moves the model's thread, not NIXL's: the report's row for it gives
    the server's CPU, never "none among the busiest" for a variant whose NIXL thread spins."""
    from connector_tax.analysis.intervention_effects import _thread

    spinner = {"started_by": "NixlPullConnector worker", "cpu_pct": 97.0}
    agg = {"threads": {"variants": {"nixl_both": {"idle": {"threads": [spinner], "total_pct": 98.0}}}}}
    assert REGISTRY[nr.KV_CORE].thread is None and REGISTRY[nr.AGENT].thread == "Nixl"
    assert _thread(agg, "nixl_both", "idle", None) == "server 98 %"
    assert _thread(agg, "nixl_both", "idle", "Nixl") == "97 % (server 98 %)"
