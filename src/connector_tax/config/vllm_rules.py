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


# vLLM's block size where server.block_size is not set: the CPU attention backend's, and the GPU's.
DEFAULT_BLOCK_SIZE = {"cpu": 128, "cuda": 16}


def connector_types(connector: Mapping[str, Any] | None) -> set[str]:
    """Every connector type a variant's connector holds (a MultiConnector's children included)."""
    if not connector:
        return set()
    return {connector["type"]} | {t for child in connector.get("children") or [] for t in connector_types(child)}


# The `lmcache server` flags the launch sets from the config (launch/lmcache_mp.py):
# vllm.lmcache_mp.extra_args must not set them again.
LMCACHE_SERVER_FLAGS = {
    "--host": "server.host",
    "--port": "the launch's own port for it",
    "--http-host": "server.host",
    "--http-port": "the launch's own port for it, + 1",
    "--chunk-size": "vllm.lmcache_mp.chunk_size",
    "--l1-size-gb": "vllm.lmcache_mp.l1_size_gb",
    "--eviction-policy": "vllm.lmcache_mp.eviction_policy",
    "--supported-transfer-mode": "vllm.lmcache_mp.transfer_mode",
}


def check_lmcache_server(config: Mapping[str, Any]) -> None:
    """vllm.lmcache_mp.extra_args may not repeat a flag the launch sets."""
    for arg in (config.get("vllm") or {}).get("lmcache_mp", {}).get("extra_args") or []:
        flag = arg.split("=", 1)[0]
        if flag in LMCACHE_SERVER_FLAGS:
            raise ConfigError(
                "vllm.lmcache_mp.extra_args", f"{flag} is set by the launch from {LMCACHE_SERVER_FLAGS[flag]}"
            )


def check_lmcache_chunk(config: Mapping[str, Any], server: dict[str, Any], where: str) -> None:
    """LMCache's MP connector refuses a chunk size that is not a multiple of vLLM's block size
    (the worker dies at start: "LMCache chunk size 16 must be a multiple of 32")."""
    chunk = (config.get("vllm") or {}).get("lmcache_mp", {}).get("chunk_size")
    block = server.get("block_size") or DEFAULT_BLOCK_SIZE.get(device(config), 16)
    if chunk is not None and chunk % block:
        raise ConfigError(
            "vllm.lmcache_mp.chunk_size",
            f"{chunk}: LMCache's chunk size must be a multiple of vLLM's block size ({where}.block_size {block})",
        )


def check_extra_args(extra_args: list[str], where: str) -> None:
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise ConfigError(where, f"{flag} is set by the launch from {MANAGED_FLAGS[flag]}; set that instead")


def cpu_list(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0", "0-1,3") as sorted CPU numbers; ValueError on anything else."""
    out: set[int] = set()
    for part in str(text).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list such as 0 or 0-1,3")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def cpu_placement(config: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(service CPUs, compute CPUs) of a CPU study that pins every server thread
    (vllm.cpu.service_cpus; serving/placement.py), else None."""
    cpu = (config.get("vllm") or {}).get("cpu") or {}
    if device(config) != "cpu" or not cpu.get("service_cpus"):
        return None
    return cpu_list(cpu["service_cpus"]), cpu_list(cpu.get("omp_threads_bind", "auto"))


def check_placement(config: Mapping[str, Any]) -> None:
    """vllm.cpu.service_cpus needs explicit compute cores apart from it."""
    cpu = (config.get("vllm") or {}).get("cpu") or {}
    if not cpu.get("service_cpus"):
        return
    try:
        service = cpu_list(cpu["service_cpus"])
    except ValueError as exc:
        raise ConfigError("vllm.cpu.service_cpus", str(exc)) from None
    try:
        compute = cpu_list(cpu.get("omp_threads_bind", "auto"))
    except ValueError:
        raise ConfigError(
            "vllm.cpu.service_cpus", "needs vllm.cpu.omp_threads_bind as a core list (the compute cores), not auto"
        ) from None
    if set(service) & set(compute):
        raise ConfigError("vllm.cpu.service_cpus", f"{cpu['service_cpus']} overlaps omp_threads_bind {compute}")


def check_settings(config: Mapping[str, Any]) -> None:
    """What a launch would refuse, checked when the config loads (ConfigError, one line):
    extra_args that repeat a flag the launch sets, a CPU block size vLLM rejects, service cores
    that are not apart from the compute cores, an LMCache MP chunk size that is not a multiple of
    the block size."""
    check_placement(config)
    check_extra_args(list(config.get("server", {}).get("extra_args") or []), "server.extra_args")
    for i, variant in enumerate(config["variants"]):
        check_extra_args(
            list((variant.get("server") or {}).get("extra_args") or []), f"variants[{i}].server.extra_args"
        )
        where = "server" if "block_size" not in (variant.get("server") or {}) else f"variants[{i}].server"
        if device(config) == "cpu":
            check_server(merged_server(config, variant), where)
        if "lmcache_mp" in connector_types(variant.get("connector")):
            check_lmcache_chunk(config, merged_server(config, variant), where)
            check_lmcache_server(config)
