"""A stand-in for `vllm serve` on a fake GPU host: the real launch path's argv, served by `ctax sim`.

The study's launch builds `vllm serve MODEL --port P ... --kv-transfer-config ...` as it would
for vLLM 0.33 (backend vllm, `vllm.executable` this stand-in). The stand-in then does what vLLM's
start-up does with the GPU, against the fake host's state (fakegpu):

* refuses to start without CUDA_DEVICE_ORDER=PCI_BUS_ID and one device in CUDA_VISIBLE_DEVICES;
* refuses to start, with vLLM 0.33's own message, when the device's free memory is below
  gpu_memory_utilization x total (vllm/v1/worker/utils.py), e.g. while a crashed server's
  memory has not been given back;
* holds gpu_memory_utilization x total of the device for as long as it runs;

finds which variant of the study ($FAKE_VLLM_CONFIG) has exactly this argv (vllm_argv of each
variant on this port: a launch that drifted from the config serves nothing), and becomes
`ctax sim` for that variant on the same host and port (exec: the server's pid is the holder's).
Everything it serves is the simulator's.
"""

from __future__ import annotations

import os
import sys
import time

import fakegpu

CONFIG_ENV = "FAKE_VLLM_CONFIG"


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _variant(config_path: str, argv: list[str], port: int) -> str:
    from connector_tax.config import load_study
    from connector_tax.launch.vllm import vllm_argv

    study = load_study(config_path)
    for variant in study.variants:
        if vllm_argv(study, variant, port)[1:] == argv:
            return variant.name
    raise SystemExit(f"vllm stand-in: no variant of {config_path} launches with {argv}")


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] != ["serve"]:
        print(f"vllm stand-in: only `vllm serve` is stood in for, not {argv[:1]}", file=sys.stderr)
        return 2
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" or not gpu or "," in gpu:
        print(
            f"vllm stand-in: launched with CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')!r} "
            f"CUDA_VISIBLE_DEVICES={gpu!r}; a launch must name one device in PCI bus order",
            file=sys.stderr,
        )
        return 2
    port = int(_value(argv, "--port"))
    name = _variant(os.environ[CONFIG_ENV], argv, port)
    utilization = float(_value(argv, "--gpu-memory-utilization"))
    with fakegpu.state() as doc:
        device = fakegpu.device(doc, gpu)
        if device is None:
            print(f"RuntimeError: CUDA error: invalid device ordinal ({gpu})", file=sys.stderr)
            return 1
        total = int(device["total_mib"])
        free = total - fakegpu.used_mib(doc, gpu)
        need = int(utilization * total)
        entry = {"gpu": gpu, "variant": name, "pid": os.getpid(), "at": time.time(), "free_mib": free}
        if free < need:
            doc.setdefault("refused", []).append(entry)
            print(
                f"ValueError: Free memory on device cuda:0 ({free / 1024:.2f}/{total / 1024:.2f} GiB) on startup "
                f"is less than desired GPU memory utilization ({utilization}, {need / 1024:.2f} GiB). Decrease "
                "GPU memory utilization or reduce GPU memory used by other processes.",
                file=sys.stderr,
                flush=True,
            )
            return 1
        doc["holders"].append({"gpu": gpu, "mib": need, "pid": os.getpid(), "variant": name})
        doc.setdefault("launches", []).append(entry)
    host = _value(argv, "--host")
    ctax = [sys.executable, "-m", "connector_tax.cli", "sim", "--config", os.environ[CONFIG_ENV]]
    os.execv(sys.executable, [*ctax, "--variant", name, "--host", host, "--port", str(port)])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
