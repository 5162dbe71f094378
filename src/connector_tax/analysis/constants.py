"""Names and numbers the analysis needs: the study's variant names and thresholds (phases and
labels are the study config's, connector_tax.config)."""

from __future__ import annotations

# The study's configurations that the hypotheses name.
PLAIN = "plain"
NOOP = "noop_connector"
MOONCAKE_BOTH = "mooncake_both"
NIXL_BOTH = "nixl_both"
LMCACHE_ONLY = "lmcache_only"
MULTI = "multi_mooncake_lmcache"

# Criterion names as they appear in every output.
CRIT_THROUGHPUT = "throughput"  # 1: effective / offered rate < throughput_ratio_min
CRIT_WAITING = "waiting"  # 2: vllm:num_requests_waiting p50 > waiting_p50_max
CRIT_TTFT = "ttft_growth"  # 3: TTFT p90(r) / TTFT p90(r') > ttft_p90_ratio_max, r' <= r/2
CRITERIA = (CRIT_THROUGHPUT, CRIT_WAITING, CRIT_TTFT)

# Hypothesis / success-criterion thresholds of the study (docs/study-design.md).
H1_MIN_TAX = 0.10  # Mooncake_both TTFT p90 tax >= 10 %
H2_GAP_PP = (5.0, 10.0)  # NIXL tax below Mooncake tax by 5-10 pp
PRIOR_TAX = 0.45  # elastic_migration_v2 trace-replay Mooncake_both tax
SC1_ACCEPT = (0.25, 0.60)  # accept the prior if the measured tax is in [25 %, 60 %]
H3_FRAMEWORK_SHARE = 0.50  # noop tax >= 50 % of Mooncake_both tax: framework-dominated
H3_IMPLEMENTATION_SHARE = 0.30  # < 30 %: implementation-dominated
H4_MAX_REL_DEV = 0.30  # |multi - (mooncake + lmcache)| / multi <= 0.30: additive
SC7_MAX_HOURS = 6.0

CONFIDENCE = 0.95
# The /metrics samples the analysis reads, by their file names (contract.records.MetricsSample).
METRIC_NAMES = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv_usage": "vllm:kv_cache_usage_perc",
}

# The connector hooks a step's callback time adds up (contract.records.STEP_TIMINGS less the step).
CALLBACK_FIELDS = ("build_meta_us", "get_finished_us", "start_load_kv_us")
