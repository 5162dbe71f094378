"""NIXL's interventions with the installed nixl 1.5.1 and vLLM 0.32's own NIXL loader (vLLM's CPU
environment; marked `vllm_cpu`): the facts they rest on, read in the installed sources, and what
each does to the agent vLLM builds, seen in the process's threads and in the evidence it keeps. No
server: one agent, as vLLM's NIXL worker makes it (`nixl_agent_config(num_threads=4,
capture_telemetry=True)`), in the environment the launch of nixl_both gives vLLM (serving.spec:
what the launch sets, less the instrumentation's variables of the caller, which exports another)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
from typed import typed

from connector_tax.config import find_variant, load_config
from connector_tax.config.interventions import INTERVENTIONS_ENV
from connector_tax.launch.command import launch_spec
from connector_tax.launch.evidence import seen

pytestmark = pytest.mark.vllm_cpu

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"

PROBE = """
import json, os, time
import vllm.distributed.nixl_utils as nixl_utils  # vLLM's own lazy loader of nixl._api

def ticks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out

config = nixl_utils.nixl_agent_config(num_threads=4, capture_telemetry=True)  # vLLM 0.32's call
agent = nixl_utils.NixlWrapper("probe", config)
time.sleep(0.5)
before, t0 = ticks(), time.monotonic()
time.sleep(2.0)
after, seconds = ticks(), time.monotonic() - t0
busiest = max((after[t] - before.get(t, 0)) / os.sysconf("SC_CLK_TCK") / seconds * 100 for t in after)
print(json.dumps({"enable_pthread": config.enable_pthread, "threads": len(after), "busiest_pct": busiest,
                  "module": type(config).__module__}), flush=True)
os._exit(0)  # the agent's teardown at interpreter exit crashed (SIGSEGV) on this host: not what is tested
"""


def _python() -> Path:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        pytest.skip("vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh`")
    return python


def _site_packages(python: Path) -> Path:
    done = subprocess.run(
        [str(python), "-c", "import nixl_cu12, os; print(os.path.dirname(os.path.dirname(nixl_cu12.__file__)))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.skip(f"nixl_cu12 does not import in vLLM's CPU environment: {done.stderr.strip()[-200:]}")
    return Path(done.stdout.strip())


def test_the_facts_the_interventions_rest_on_in_the_installed_sources():
    site = _site_packages(_python())
    api = (site / "nixl_cu12" / "_api.py").read_text()
    assert "agent_config.pthrDelay = 0" in api  # hard-coded: no setting of the Python agent reaches it
    assert "agent_config.useProgThread = nixl_conf.enable_pthread" in api
    init = api[api.index("class nixl_agent_config") : api.index("class nixl_agent:")]
    params = re.findall(r"^\s+(\w+):", init[init.index("def __init__") :], re.M)
    assert "enable_prog_thread" in params and not any("delay" in p for p in params)
    worker = (
        site / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl" / "base_worker.py"
    ).read_text()
    calls = re.findall(r"nixl_agent_config\(([^)]*)\)", worker)
    assert calls and all("enable_prog_thread" not in c and "delay" not in c for c in calls), calls
    assert "capture_telemetry=True" in calls[0]


def _probe(declared: str | None, evidence: Path) -> dict:
    """The probe in the environment the launch of nixl_both gives vLLM (declaring `declared`, or
    nothing), with another intervention exported in this process's own environment: only the
    launch's reaches it (serving.spec.LaunchSpec.environ, what ServerProcess starts vLLM with)."""
    python = _python()
    config = copy.deepcopy(load_config(CONFIG))
    config["model"]["local"] = False  # the probe loads no model: the launch need not find one
    config["vllm"]["executable"] = str(python.parent / "vllm")
    variant = find_variant(config, "nixl_both")
    variant["interventions"] = [declared] if declared else []
    spec = launch_spec(str(CONFIG), *typed(config, "nixl_both"), 8000, None, evidence=str(evidence))
    exported = "nixl_progress_off" if declared == "nixl_progress_delay_1ms" else "nixl_progress_delay_1ms"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INTERVENTIONS_ENV, exported)
        env = spec.environ()
    assert env.get(INTERVENTIONS_ENV) == declared and env["VLLM_TARGET_DEVICE"] == "cpu"
    done = subprocess.run([str(python), "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = seen(evidence, [declared])[declared] if declared else None
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr, "seen": found}


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str | None, dict]:
    names = (None, "nixl_progress_off", "nixl_progress_delay_1ms")
    return {name: _probe(name, tmp_path_factory.mktemp("evidence")) for name in names}


def test_as_shipped_the_progress_thread_spins(probes):
    shipped = probes[None]
    assert shipped["enable_pthread"] is True and shipped["module"] == "nixl_cu12._api"
    assert shipped["busiest_pct"] >= 20, shipped  # a 0 ms poll: busy with nothing to do
    assert "connector-tax: intervention" not in shipped["stderr"]  # nothing declared (one exported), nothing acted


def test_off_the_thread_is_gone_and_with_a_1ms_delay_it_sleeps(probes):
    shipped, off, delay = probes[None], probes["nixl_progress_off"], probes["nixl_progress_delay_1ms"]
    assert off["enable_pthread"] is False and off["threads"] == shipped["threads"] - 1, (off, shipped)
    assert off["busiest_pct"] < 10, off
    assert delay["enable_pthread"] is True and delay["threads"] == shipped["threads"]
    assert delay["busiest_pct"] < 10, delay
    assert "intervention nixl_progress_off" in off["stderr"] and "nixl_progress_delay_1ms" in delay["stderr"]
    for probe in (off, delay):  # its evidence where the launch put it: one agent config, one call
        assert probe["seen"]["seen"] and probe["seen"]["calls"] == 1, probe["seen"]
