"""What vLLM's CPU reservation for NIXL (`rsv_cores_for_kv`) rests on, read in the installed vLLM
(vLLM's CPU environment; marked `vllm_cpu`). The interventions nixl_kv_core_off_compute and
nixl_agent_off_compute (patches/interventions/nixl_reservation.py) and docs/nixl-progress.md depend
on these facts; the A/B itself is configs/overlays/nixl-reservation.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_cpu


def _vllm() -> Path:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        pytest.skip("vLLM's CPU environment is absent: run `bash tools/vllm_cpu_env.sh`")
    done = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_the_worker_pins_its_building_thread_after_its_agent_exists_and_nothing_sets_the_cores():
    vllm = _vllm()
    worker = (vllm / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl" / "base_worker.py").read_text()
    agent = worker.index("self.nixl_wrapper = nixl_wrapper_cls(")
    reserve = worker.index("os.sched_setaffinity(0, rsv_cores_for_kv)")
    # The agent (and the UCX threads it starts) is made first: its threads keep the building
    # thread's CPUs from before the call; the call moves only the building thread (pid 0).
    assert agent < reserve
    block = worker[worker.rindex('if self.device_type == "cpu":', 0, reserve) : reserve]
    assert "current_platform.discover_numa_topology()" in block
    assert "max(each_numa_core_list) for each_numa_core_list in numa_core_list" in block
    platform = (vllm / "platforms" / "cpu.py").read_text()
    topology = platform[platform.index("def discover_numa_topology") :]
    topology = topology[: topology.index("\n    @classmethod")]
    # Read from /sys only: no environment variable or config of vLLM's chooses the reserved core.
    assert '"/sys/devices/system/node"' in topology and "environ" not in topology and "envs." not in topology
