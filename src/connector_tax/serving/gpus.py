"""Give each GPU job its own device, and wait for a device's memory to be released.

Snakemake's `resources: gpu=1` bounds how many GPU jobs run at once but does not say which
device each gets; a job takes the first free one under an exclusive file lock in a private
per-user directory (serving.lifecycle.private_dir; released when the job's process ends,
however it ends); a job SLURM placed takes its allocation's GPU instead (serving.slurm). Before a launch, the device's memory must have been
released by the previous server: poll nvidia-smi, bounded, instead of a blind sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

from connector_tax.serving.lifecycle import exclusive_lock, private_dir
from connector_tax.serving.slurm import adopted

FREE_MIB = 1024  # a device using less than this is considered released


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def memory_used_mib(gpu: str) -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        return int(out.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


def wait_released(gpu: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = memory_used_mib(gpu)
        if used is None or used < FREE_MIB:
            return
        time.sleep(2.0)
    raise RuntimeError(f"GPU {gpu} still uses memory after {timeout_s:.0f} s: a previous server did not exit")


@contextlib.contextmanager
def gpu_lease(backend: str, timeout_s: float = 3600.0, device: str = "cuda") -> Iterator[str | None]:
    """A free GPU id for this job (None for backends that use none, and for vLLM on a CPU:
    `vllm.device: cpu`, see connector_tax.config.vllm_rules.device)."""
    if backend != "vllm" or device == "cpu":
        yield None
        return
    placed = adopted()
    if placed is not None:  # SLURM made the GPUs of this job's allocation its own: no lease
        if not placed.gpus:
            raise RuntimeError(f"backend vllm needs a GPU, and SLURM job {placed.job_id} has none (resources: gpu=1)")
        wait_released(placed.gpus[0])
        yield placed.gpus[0]
        return
    gpus = visible_gpus()
    if not gpus:
        raise RuntimeError("backend vllm needs a GPU, and none is visible (nvidia-smi / CUDA_VISIBLE_DEVICES)")
    locks = private_dir("gpus")
    deadline = time.monotonic() + timeout_s
    while True:
        for gpu in gpus:
            fd = exclusive_lock(locks / f"gpu{gpu}.lock")
            if fd is None:
                continue
            try:
                wait_released(gpu)
                yield gpu
            finally:
                os.close(fd)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no free GPU among {gpus} after {timeout_s:.0f} s")
        time.sleep(1.0)
