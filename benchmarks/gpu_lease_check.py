"""The GPU leases against a real `nvidia-smi` and real GPU memory: five checks (pass / fail) and the
seconds the driver takes to give a process's memory back after a SIGKILL and after a clean exit; on
a machine with a GPU, torch and nvidia-smi (NOT RUN ON A REAL GPU YET).

Backs: ../docs/gpu-host.md#on-a-real-gpu-prepared-not-run-yet

    PYTHONPATH=src python benchmarks/gpu_lease_check.py [--gib 8] [--json OUT]
    (or `ctax benchmark gpu_lease_check` where the package is installed)

Needs psutil besides torch (serving.lifecycle imports it); no vLLM, no package registry. Each step prints one line and the
whole is written as JSON; exit 1 if a check fails. What it checks, on GPU 0:

1. nvidia-smi's answer to the query the leases make parses (index, PCI bus id, memory), and the
   GPU's NUMA node is read from sysfs;
2. PCI order: under CUDA_DEVICE_ORDER=PCI_BUS_ID, torch's device 0 has nvidia-smi index 0's bus id;
3. a torch process holding --gib GiB ("foreign" to the lease): the lease probes GPU 0 and skips it
   (one GPU: it then finds none, and says so in one line), within the probe and a retry;
4. that process SIGKILLed: how long the driver takes to give its memory back, measured by
   wait_released with vLLM's rule (free >= 0.9 x total), and the lease then takes GPU 0;
5. the same after a clean exit (the process frees and ends).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from _common import parser, write_json

from connector_tax.serving import topology
from connector_tax.serving.gpus import gpu_env, gpu_lease, read_gpus, wait_released

HOLD = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(gib: float, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(gib), str(seconds)],
        env={**os.environ, **gpu_env("0")},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "holding":
        raise SystemExit("gpu_lease_check: the torch process could not allocate its memory")
    return proc


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--gib", type=float, default=8.0, help="memory the foreign process holds (default 8)")
    args = p.parse_args(argv)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    out: dict = {"checks": {}}
    checks = out["checks"]

    readings = read_gpus()
    first = readings.get("0")
    checks["query"] = first is not None
    out["gpus"] = {i: vars(r) for i, r in readings.items()}
    out["numa_node"] = topology.numa_node(first.bus_id if first else None)
    print(f"1. nvidia-smi: {len(readings)} GPUs; GPU 0 {first}; NUMA node {out['numa_node']}")

    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).pci_bus_id)"],
        env={**os.environ, **gpu_env("0")},
        capture_output=True,
        text=True,
    )
    torch_bus = probe.stdout.strip().lower()
    checks["pci_order"] = bool(first) and torch_bus.endswith(first.bus_id.lower().partition(":")[2])
    print(f"2. torch device 0 under PCI_BUS_ID: {torch_bus} (nvidia-smi: {first.bus_id if first else None})")

    holder = _holder(args.gib, 600)
    start = time.monotonic()
    try:
        with gpu_lease("vllm", timeout_s=1.0, probe_s=5.0):
            checks["busy_skipped"] = False
    except RuntimeError as exc:
        checks["busy_skipped"] = "GPU 0:" in str(exc) and "\n" not in str(exc)
        out["busy_message"] = str(exc)
    out["busy_probe_s"] = round(time.monotonic() - start, 2)
    print(f"3. lease beside a {args.gib:g} GiB foreign process: {out.get('busy_message')} ({out['busy_probe_s']} s)")

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    out["released_after_kill_s"] = round(wait_released("0", need=0.9, timeout_s=120), 2)
    with gpu_lease("vllm", timeout_s=10) as gpu:
        checks["lease_after_release"] = gpu is not None and gpu.index == "0"
    print(f"4. SIGKILLed: memory back after {out['released_after_kill_s']} s; the lease took GPU 0")

    holder = _holder(args.gib, 0.5)
    holder.wait()
    out["released_after_exit_s"] = round(wait_released("0", need=0.9, timeout_s=120), 2)
    print(f"5. clean exit: memory back after {out['released_after_exit_s']} s")

    print(json.dumps(out, indent=1, default=str))
    write_json(args.json, out)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
