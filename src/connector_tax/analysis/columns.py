"""The columns of aggregate.csv / aggregate.json, one row per cell (cellstats.cell_row fills them).

The one list of them, in their order; tables.py writes them, core.py builds the rows.
"""

from __future__ import annotations

from connector_tax.analysis.streams import COLUMNS as STREAM_COLUMNS

# step_duration_us is the study's step (Scheduler.schedule() entry to exit): the step tax and
# figures 6-7 use it; step_other_us is the same step less its build_meta (the one hook inside it),
# step by step: the unattributed tax's own sample; engine_step_us is the whole engine step
# (schedule, model, update), for scale.
STEP_STATS = (
    "step_duration_us",
    "step_other_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "connector_total_us",
    "engine_step_us",
)
LATENCIES = ("ttft_ms", "ttft_sched_ms", "tpot_ms", "e2e_ms")

ID = [
    "variant",
    "phase",
    "cell",
    "replicate",
    "rate",
    "input_len",
    "output_len",
    "backend",
    "simulated",
    "run_status",
    "valid",
    "validity_reasons",
    "complete",
    "fingerprint",
]
COUNTS = ["n_records", "n_warmup", "n_post_warmup", "n_ok", "n_error", "n_dropped", "n_timeout"]
RATES = [
    "requested_rps",
    "offered_rps",
    "achieved_dispatch_rps",
    "effective_rps",
    "throughput_ratio",
    "throughput_ratio_requested",
    "rates_source",
]
LAT = [f"{m}_{s}" for m in LATENCIES for s in ("n", "p50", "p90", "p99", "p90_ci_lo", "p90_ci_hi")]
ITL = ["itl_ms_n", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99"]
METRICS = ["metrics_n", "waiting_p50", "running_p50", "kv_cache_usage_p50"]
STEPS = ["step_timing_available", "steps_n"] + [
    f"{f}_{s}" for f in STEP_STATS for s in ("p50", "p90", "p50_ci_lo", "p50_ci_hi")
]
SAT = [
    "saturated",
    "saturation_criteria",
    "crit_throughput",
    "crit_waiting",
    "crit_ttft_growth",
    "ttft_growth_ratio",
    "ttft_growth_vs_rate",
]
# The host around the cell (metrics/host.py via the summary): measured at all (not in virtual
# time), busy by the validity bounds, outside processes' CPU share (mean over the cell) and the
# busiest second in cores, steal, run queue; and how many attempts the gate took.
HOST = [
    "host_measured",
    "host_busy",
    "host_others_cpu_frac",
    "host_others_cores_max",
    "host_steal_frac",
    "host_run_queue_mean",
    "attempts",
]
COLUMNS: list[str] = ID + COUNTS + RATES + LAT + ITL + METRICS + STEPS + SAT + HOST + ["window_note"] + STREAM_COLUMNS
