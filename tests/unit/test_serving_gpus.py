"""GPU and CPU leases on a shared host, against a fake `nvidia-smi` (tests/fake_gpu_host.py):
a busy device is skipped after a short probe, a launch waits for its device's memory, every
launch numbers devices in PCI order, and CPUs come from the GPU's NUMA node."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_host import TOTAL_MIB, FakeGpuHost

from connector_tax.serving import gpus as gpus_module
from connector_tax.serving import topology
from connector_tax.serving.cpus import cpu_lease
from connector_tax.serving.gpus import gpu_env, gpu_lease, read_gpus, visible_gpus, wait_released


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpuHost:
    fake = FakeGpuHost(tmp_path / "host", gpus=4, nodes=2, cpus_per_node=8, release_s=1.5)
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CONNECTOR_TAX_LOCKS", str(tmp_path / "locks"))
    return fake


def test_the_fake_nvidia_smi_answers_the_queries_the_code_makes(host: FakeGpuHost) -> None:
    host.hold("1", 5000)
    readings = read_gpus()
    assert sorted(readings) == ["0", "1", "2", "3"]
    assert readings["1"].used_mib == 5000 and readings["1"].total_mib == TOTAL_MIB
    assert readings["2"].bus_id == "00000000:38:00.0"
    assert visible_gpus() == ["0", "1", "2", "3"]
    out = subprocess.run(["nvidia-smi", "-i", "2", "-L"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("GPU 2: NVIDIA H20")
    bad = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv"], capture_output=True, text=True)
    assert bad.returncode == 2  # a query the fake does not know fails loudly


def test_a_lease_takes_a_free_gpu_and_knows_its_numa_node(host: FakeGpuHost) -> None:
    with gpu_lease("vllm") as first, gpu_lease("vllm") as second:
        assert (first.index, second.index) == ("0", "1")
        assert (first.numa_node, second.numa_node) == (0, 0)
        assert first.bus_id == "00000000:18:00.0" and not first.skipped
    with gpu_lease("sim") as none:
        assert none is None
    assert gpu_env("3") == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_gpu_another_process_uses_is_skipped_after_a_short_probe(
    host: FakeGpuHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPUs 0, 1 and 3 are held by jobs of ours; GPU 2 is a stranger's. The fourth job probes 2
    # (its lock is free), gives up on it after the probe instead of waiting it out, and takes 3
    # once its job ends.
    host.hold("2", 30000)
    # GPU 3's job ends once the fourth has begun probing GPU 2 (not on a timer: on a loaded host
    # the fourth's first look could come after the timer, find 3 free and never probe 2).
    probing = threading.Event()
    real_wait = gpus_module.wait_released

    def wait_released(gpu: str, *args: Any, **kwargs: Any) -> float:
        if gpu == "2":
            probing.set()
        return real_wait(gpu, *args, **kwargs)

    monkeypatch.setattr(gpus_module, "wait_released", wait_released)
    with gpu_lease("vllm"), gpu_lease("vllm"):
        third = gpu_lease("vllm")
        assert third.__enter__().index == "3"

        def end_third() -> None:
            probing.wait(30)
            third.__exit__(None, None, None)

        threading.Thread(target=end_third, daemon=True).start()
        start = time.monotonic()
        with gpu_lease("vllm", probe_s=0.5) as fourth:
            took = time.monotonic() - start
    assert fourth.index == "3" and fourth.numa_node == 1
    assert "30000 MiB in use by a process outside this study (still after a 0.5 s probe)" in fourth.skipped["2"]
    assert took < 5.0


def test_a_busy_gpu_is_tried_last_and_all_busy_is_one_line(host: FakeGpuHost) -> None:
    host.hold("0", 30000)
    with gpu_lease("vllm", probe_s=0.2) as gpu:
        assert gpu.index == "1" and not gpu.skipped  # free devices first: no probe at all
    for g in ("1", "2", "3"):
        host.hold(g, 30000)
    with pytest.raises(RuntimeError) as err, gpu_lease("vllm", timeout_s=0.1, probe_s=0.2):
        pass
    assert str(err.value).startswith("no free GPU among 0,1,2,3 after 0 s (GPU 0: 30000 MiB in use")
    assert "\n" not in str(err.value)


def test_a_launch_waits_until_a_dead_servers_memory_is_released(host: FakeGpuHost) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host.hold("0", int(0.9 * TOTAL_MIB), pid=server.pid)
    assert read_gpus()["0"].used_mib > 80000
    server.kill()
    server.wait()
    waited = wait_released("0", need=0.9)
    assert 1.0 <= waited < 10.0  # the fake driver gives memory back 1.5 s after the process is gone
    assert read_gpus()["0"].used_mib == 0


def test_a_launch_that_cannot_get_its_memory_says_so_in_one_line(host: FakeGpuHost) -> None:
    host.hold("1", 20000)
    with pytest.raises(RuntimeError, match=r"^GPU 1 still has 20000 of 97871 MiB in use after 1 s"):
        wait_released("1", need=0.9, timeout_s=1.0)


def test_cpus_are_leased_from_the_gpus_numa_node(host: FakeGpuHost) -> None:
    # The fake host's CPUs 0-15 are not this machine's: leased and recorded, not pinned.
    assert topology.node_cpus(1) == list(range(8, 16))
    allowed = os.sched_getaffinity(0)
    with cpu_lease(3, near=1) as a, cpu_lease(3, near=1) as b, cpu_lease(3, near=1) as c:
        assert a.cpus == [8, 9, 10] and b.cpus == [11, 12, 13] and a.numa_node == 1
        assert c.numa_node is None and len(c.cpus) == 3  # node 1 is full: from anywhere
        assert os.sched_getaffinity(0) == allowed
    with cpu_lease(3, near=None) as d:
        assert d.cpus == [0, 1, 2] and d.numa_node is None


def test_a_gpu_without_numa_information_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNECTOR_TAX_SYSFS", str(tmp_path / "nothing"))
    assert topology.numa_node("00000000:18:00.0") is None
    assert topology.node_cpus(None) == [] and topology.rdma_devices() == []
    assert topology.pci_address("00000000:1B:00.0") == "0000:1b:00.0"
    assert topology.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
