"""Give each GPU job its own device, skip devices other processes use, and wait for a device's
memory to be released before every launch.

Snakemake's `resources: gpu=1` bounds how many GPU jobs run at once but does not say which
device each gets; a job takes a device under an exclusive file lock in a private per-user
directory (serving.lifecycle.private_dir; released when the job's process ends, however it ends);
a job SLURM placed takes its allocation's GPU instead (serving.slurm).

Which device: one nvidia-smi reading orders them, free ones first (index order among equals). A
device whose lock is free but whose memory is in use is probed for PROBE_S: memory our own
previous server is still giving back falls within that; memory that stays is another process's
(someone else's job on a shared host), and the device is skipped, not waited on. When no device
is free the job tries again every RETRY_S, up to its timeout.

Before every launch, a relaunch after a crash included, the device's memory must be released
(`wait_released`): vLLM 0.33 refuses to start when the free memory is below
gpu_memory_utilization x total (its init_device), and a driver gives a dead server's memory back
a few seconds after the process is gone. Every launch runs with CUDA_DEVICE_ORDER=PCI_BUS_ID, so
CUDA numbers devices as nvidia-smi does (CUDA's default is fastest first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from connector_tax.serving import topology
from connector_tax.serving.lifecycle import exclusive_lock, private_dir
from connector_tax.serving.slurm import adopted

FREE_MIB = 1024  # a device using less than this is released (a display server's few MiB pass)
PROBE_S = 10.0  # how long a device in use may take to give memory back before it is skipped
RETRY_S = 2.0  # between passes over the devices when none is free
RELEASE_TIMEOUT_S = 300.0  # how long a launch waits for its own device's memory
_QUERY = "index,pci.bus_id,memory.used,memory.total"


@dataclass(frozen=True)
class Reading:
    index: str  # nvidia-smi's index: PCI bus order, what CUDA_VISIBLE_DEVICES names under PCI_BUS_ID
    bus_id: str
    used_mib: int
    total_mib: int


@dataclass
class Gpu:
    """The device a job holds, where it sits, and what the lease passed over on the way."""

    index: str
    bus_id: str | None = None
    numa_node: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, object]:
        return {"gpu": self.index, "gpu_bus_id": self.bus_id, "numa_node": self.numa_node, "gpus_skipped": self.skipped}


def gpu_env(gpu: str) -> dict[str, str]:
    """What a launch on device `gpu` sets: the device, numbered in nvidia-smi's (PCI) order."""
    return {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def read_gpus() -> dict[str, Reading]:
    """{index: reading} of every device nvidia-smi lists; {} without nvidia-smi or on its failure."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    readings = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            readings[parts[0]] = Reading(parts[0], parts[1], int(parts[2]), int(parts[3]))
        except (IndexError, ValueError):
            continue
    return readings


def visible_gpus() -> list[str]:
    """The devices this job may use: CUDA_VISIBLE_DEVICES if set, else every one nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    return sorted(read_gpus(), key=int)


def _released(reading: Reading | None, need: float) -> bool:
    """No process holds memory there, and vLLM's start-up check (free >= need x total) would pass.
    A device nvidia-smi cannot read counts as released: there is nothing to wait for."""
    if reading is None:
        return True
    return reading.used_mib < FREE_MIB and reading.total_mib - reading.used_mib >= need * reading.total_mib


def wait_released(gpu: str, need: float = 0.0, timeout_s: float = RELEASE_TIMEOUT_S) -> float:
    """Wait until device `gpu`'s memory is released (see _released); the seconds waited.
    RuntimeError (one line) after timeout_s."""
    start = time.monotonic()
    while True:
        reading = read_gpus().get(gpu)
        if _released(reading, need):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            assert reading is not None
            raise RuntimeError(
                f"GPU {gpu} still has {reading.used_mib} of {reading.total_mib} MiB in use after {timeout_s:.0f} s "
                f"(a launch needs it below {FREE_MIB} MiB and {need:g} x total free): a previous server did not exit"
            )
        time.sleep(1.0)


def _placed(index: str, skipped: dict[str, str] | None = None) -> Gpu:
    reading = read_gpus().get(index)
    bus = reading.bus_id if reading else None
    return Gpu(index, bus, topology.numa_node(bus), skipped or {})


@contextlib.contextmanager
def gpu_lease(
    backend: str, timeout_s: float = 3600.0, device: str = "cuda", probe_s: float = PROBE_S
) -> Iterator[Gpu | None]:
    """A device of this job's own (None for backends that use none, and for vLLM on a CPU:
    `vllm.device: cpu`, see connector_tax.config.vllm_rules.device)."""
    if backend != "vllm" or device == "cpu":
        yield None
        return
    placed = adopted()
    if placed is not None:  # SLURM made the GPUs of this job's allocation its own: no lease
        if not placed.gpus:
            raise RuntimeError(f"backend vllm needs a GPU, and SLURM job {placed.job_id} has none (resources: gpu=1)")
        yield _placed(placed.gpus[0])
        return
    gpus = visible_gpus()
    if not gpus:
        raise RuntimeError("backend vllm needs a GPU, and none is visible (nvidia-smi / CUDA_VISIBLE_DEVICES)")
    locks = private_dir("gpus")
    deadline = time.monotonic() + timeout_s
    skipped: dict[str, str] = {}
    while True:
        readings = read_gpus()
        for gpu in sorted(gpus, key=lambda g: (not _released(readings.get(g), 0.0), gpus.index(g))):
            fd = exclusive_lock(locks / f"gpu{gpu}.lock")
            if fd is None:
                continue  # another job of this user holds it
            try:
                wait_released(gpu, timeout_s=probe_s)
            except RuntimeError:
                os.close(fd)
                used = read_gpus().get(gpu)
                skipped[gpu] = (
                    f"{used.used_mib if used else '?'} MiB in use by a process outside this study "
                    f"(still after a {probe_s:g} s probe)"
                )
                continue
            skipped.pop(gpu, None)  # busy in an earlier pass, released since
            try:
                yield _placed(gpu, dict(skipped))
            finally:
                os.close(fd)
            return
        if time.monotonic() > deadline:
            busy = "; ".join(f"GPU {g}: {why}" for g, why in sorted(skipped.items()))
            raise RuntimeError(
                f"no free GPU among {','.join(gpus)} after {timeout_s:.0f} s" + (f" ({busy})" if busy else "")
            )
        time.sleep(RETRY_S)
