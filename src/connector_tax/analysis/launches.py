"""The server settings every configuration ran with, side by side, from the launch indexes.

A tax is only a tax if everything but the connector is the same: these are the settings that
decide vLLM's batching and caching (and, for LMCache, its offload), as each launch recorded
them in its run.json — not as the config says they should have been.
"""

from __future__ import annotations

from typing import Any

from connector_tax.config import PHASE_A

_SERVER_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "max_model_len",
    "tensor_parallel_size",
)


def _async_scheduling(argv: list[str]) -> str:
    if "--async-scheduling" in argv:
        return "on (--async-scheduling)"
    if "--no-async-scheduling" in argv:
        return "off (--no-async-scheduling)"
    return "vLLM's default"


def like_for_like(study: Any) -> dict[str, dict[str, Any]]:
    """{config: the settings its Phase A launch recorded} (configurations that launched)."""
    out: dict[str, dict[str, Any]] = {}
    for name in study.variants:
        run = study.run_of(name, PHASE_A)
        launch = ((run.run or {}).get("launch") if run else None) or {}
        if not launch:
            continue
        server = launch.get("server") or {}
        row: dict[str, Any] = {key: server.get(key) for key in _SERVER_KEYS}
        if launch.get("backend") == "vllm":
            argv = launch.get("argv") or []
            vllm = launch.get("vllm") or {}
            row["async_scheduling"] = _async_scheduling(argv)
            row["hybrid_kv_cache_manager"] = (
                "disabled" if "--disable-hybrid-kv-cache-manager" in argv else "vLLM decides"
            )
            connector = (launch.get("variant") or {}).get("connector") or {}
            kinds = {connector.get("type")} | {c.get("type") for c in connector.get("children") or []}
            if "lmcache" in kinds:
                row["lmcache_env"] = (vllm.get("lmcache") or {}).get("env")
            if "lmcache_mp" in kinds:  # its LMCache server's settings (launched beside vLLM)
                row["lmcache_mp"] = vllm.get("lmcache_mp")
            env = (run.run or {}).get("server_env") or {}
            if env.get("VLLM_TARGET_DEVICE") == "cpu":  # the CPU build's binding and cache, as launched
                row["cpu_omp_threads_bind"] = env.get("VLLM_CPU_OMP_THREADS_BIND")
                row["cpu_kvcache_gib"] = env.get("VLLM_CPU_KVCACHE_SPACE")
            if (run.run or {}).get("workarounds"):
                row["workarounds"] = "; ".join(run.run["workarounds"])
        else:
            row["async_scheduling"] = "n/a (simulated engine)" if launch.get("backend") == "sim" else "unknown"
        out[name] = row
    return out
