"""The record files' fields (DESIGN.md "Records"), and the step-log variable.

Writers add fields freely; these are the ones every reader may rely on.
"""

from __future__ import annotations

# requests_<phase>_<label>.jsonl: one line per request issued (warm-up included, flagged).
REQUEST_FIELDS = (
    "request_id",
    "t_scheduled_ns",
    "t_send_ns",
    "t_first_token_ns",
    "t_last_token_ns",
    "prompt_tokens",
    "completion_tokens",
    "inflight_at_send",
    "warmup",
    "status",
    "error",
)
REQUEST_STATUSES = ("ok", "error", "dropped", "timeout")

# metrics_<phase>_<label>.jsonl: one line per /metrics scrape; t_ns plus the vllm:* samples.
METRIC_FIELDS = ("t_ns", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")

# engine_step_<phase>_<label>.jsonl: one line per engine step (null where a process cannot know).
# step_duration_us is Scheduler.schedule() entry to exit (the design's definition), build_meta_us
# the connector's build_connector_meta inside it; engine_step_us is the whole engine step (which
# overlaps the model under async scheduling). Worker-side connector hooks come in their own
# records (patches/README.md), sliced into the same file.
STEP_FIELDS = (
    "t_ns",
    "step_id",
    "step_duration_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "num_running",
    "num_waiting",
    "prefill_tokens",
    "decode_tokens",
    "engine_step_us",
)

# Where a server writes its step log. patches/step_timing.py runs inside vLLM and cannot import
# this package: it spells the name itself, and a test checks the two agree.
STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"
# The seed of one launch's own draws (config.cells.launch_seed): the simulator's per-launch speed
# factor (sim.launch_bias_sd) comes from it, so a launch's bias is reproducible and two differ.
LAUNCH_SEED_ENV = "CONNECTOR_TAX_LAUNCH_SEED"


# run.json's server_versions: the connector libraries among the server's packages, under every
# distribution name each is published as (one per CUDA major, or none: tools/vllm_cpu_env.sh
# installs the -non-cuda and -cu12 builds, tools/vllm_gpu_env.sh the CUDA 13 ones), named in
# every output.
CONNECTOR_DISTRIBUTIONS = {
    "mooncake": ("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13", "mooncake-transfer-engine-non-cuda"),
    "nixl": ("nixl", "nixl-cu13", "nixl-cu12"),
    "lmcache": ("lmcache",),
}
CONNECTOR_PACKAGES = tuple(d for names in CONNECTOR_DISTRIBUTIONS.values() for d in names)


def connector_version(versions: dict[str, object], library: str) -> str:
    """The version of `library` (mooncake, nixl, lmcache) the server had, whichever distribution
    it came as; "" when it had none."""
    return next((str(versions[d]) for d in CONNECTOR_DISTRIBUTIONS[library] if versions.get(d)), "")


def connector_packages(versions: dict[str, object]) -> str:
    """ "nixl 1.5.1, nixl-cu12 1.5.1, mooncake-transfer-engine-non-cuda 0.3.13.post1, lmcache 0.5.6"
    (those the server's Python has), or "" when it has none."""
    return ", ".join(f"{d} {versions[d]}" for d in CONNECTOR_PACKAGES if versions.get(d))
