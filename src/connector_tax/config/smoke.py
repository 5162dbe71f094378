"""The GPU smoke test's config (tools/gpu_smoke.sh, `for_tools smoke-config`): a study config
made smaller, derived from another as `StudyConfig.virtual` derives the simulated one."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from connector_tax.config.load import validate_config

SMOKE_MODEL = "Qwen/Qwen3-0.6B"


def smoke_config(
    base: Mapping[str, Any],
    model: str = SMOKE_MODEL,
    max_model_len: int = 4096,
    gpu_memory_utilization: float = 0.6,
    mooncake_protocol: str = "tcp",
    enforce_eager: bool = True,
) -> dict[str, Any]:
    """A copy of a study config for the GPU smoke test: a small model, short context, a
    workload that fits it, and every configuration of the base."""
    config: dict[str, Any] = copy.deepcopy(dict(base))
    config["study"] = f"{base['study']}-gpu-smoke"
    config["backend"] = "vllm"
    config["model"] = {"name": model}
    server = config.setdefault("server", {})
    server.update(
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=min(int(server.get("max_num_seqs", 256)), 32),
    )
    if enforce_eager:
        server["enforce_eager"] = True
    for variant in config["variants"]:
        variant.pop("sim", None)
        if "max_model_len" in (variant.get("server") or {}):
            variant["server"]["max_model_len"] = max_model_len
    config.setdefault("vllm", {}).setdefault("mooncake", {})["protocol"] = mooncake_protocol
    config.pop("sim", None)
    config["workload"] = {
        "warmup_s": 1,
        "duration_s": 5,
        "min_completed": 3,
        "request_timeout_s": 120,
        "phase_a": {"rates": [1], "shape": {"input": 128, "output": 16}},
        "phase_b": {"inputs": [128], "outputs": [16]},
    }
    return validate_config(config)
