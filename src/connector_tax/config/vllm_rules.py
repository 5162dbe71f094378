"""What a `vllm serve` launch would refuse, as rules on the config: checked when the config loads
(one line naming the key) and again by the launch that builds the argv (launch/vllm.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connector_tax.config.errors import ConfigError
from connector_tax.config.merge import merged_server

# The flags the launch sets from the config: server.extra_args must not set them again (vLLM's
# argparse would silently keep the last one).
MANAGED_FLAGS = {
    "--host": "server.host",
    "--port": "the launch's port",
    "--model": "model.name",
    "--served-model-name": "model.served_name",
    "--tensor-parallel-size": "server.tensor_parallel_size",
    "-tp": "server.tensor_parallel_size",
    "--max-model-len": "server.max_model_len",
    "--enable-prefix-caching": "server.enable_prefix_caching",
    "--no-enable-prefix-caching": "server.enable_prefix_caching",
    "--enable-chunked-prefill": "server.enable_chunked_prefill",
    "--no-enable-chunked-prefill": "server.enable_chunked_prefill",
    "--max-num-batched-tokens": "server.max_num_batched_tokens",
    "--max-num-seqs": "server.max_num_seqs",
    "--gpu-memory-utilization": "server.gpu_memory_utilization",
    "--device-memory-utilization": "server.gpu_memory_utilization",
    "--block-size": "server.block_size",
    "--load-format": "model.load_format",
    "--kv-transfer-config": "the config's connector",
    "--disable-hybrid-kv-cache-manager": "vllm.hybrid_kv_cache_manager",
    "--no-disable-hybrid-kv-cache-manager": "vllm.hybrid_kv_cache_manager",
}


CPU_BLOCK_MULTIPLE = 32


def device(config: Mapping[str, Any]) -> str:
    """ "cuda" (a GPU host, the default) or "cpu" for backend vllm; "cuda" for other backends
    (they lease nothing anyway)."""
    if config.get("backend") != "vllm":
        return "cuda"
    return str((config.get("vllm") or {}).get("device", "cuda"))


def check_server(server: dict[str, Any], where: str) -> None:
    """The CPU attention backend's block-size rule, before anything is launched."""
    block = server.get("block_size")
    if block is not None and block % CPU_BLOCK_MULTIPLE:
        raise ConfigError(
            f"{where}.block_size",
            f"{block}: vLLM on CPU needs a multiple of {CPU_BLOCK_MULTIPLE} (16 is refused; default 128)",
        )


def check_extra_args(extra_args: list[str], where: str) -> None:
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise ConfigError(where, f"{flag} is set by the launch from {MANAGED_FLAGS[flag]}; set that instead")


def check_settings(config: Mapping[str, Any]) -> None:
    """What a launch would refuse, checked when the config loads (ConfigError, one line):
    extra_args that repeat a flag the launch sets, a CPU block size vLLM rejects."""
    check_extra_args(list(config.get("server", {}).get("extra_args") or []), "server.extra_args")
    for i, variant in enumerate(config["variants"]):
        check_extra_args(
            list((variant.get("server") or {}).get("extra_args") or []), f"variants[{i}].server.extra_args"
        )
        if device(config) == "cpu":
            check_server(
                merged_server(config, variant),
                "server" if "block_size" not in (variant.get("server") or {}) else f"variants[{i}].server",
            )
