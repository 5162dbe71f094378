"""The `/metrics` exposition: vLLM's V1 metric names, types, labels and buckets.

prometheus_client appends `_total` to counters, exactly as it does for vLLM, so a scraper
sees the same series from both. Gauges read the engine's state when scraped; the engine
thread counts tokens after each step (prometheus_client metrics are thread-safe); the HTTP
side observes latencies.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from connector_tax.sim.engine import EngineCore, StepResult

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
INTER_TOKEN_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def cache_config_labels(core: EngineCore) -> dict[str, str]:
    """`vllm:cache_config_info`'s labels the study reads: the KV block size and the number of blocks."""
    return {"block_size": str(core.pool.block_size), "num_gpu_blocks": str(core.pool.num_blocks)}


class SimMetrics:
    def __init__(self, model_name: str, core: EngineCore) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": "0"}
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(**values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(finished_reason=reason, **values) for reason in FINISH_REASONS}
        # vLLM's cache settings as labels of a constant 1, as vLLM exposes them (calibration reads them).
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks"],
            registry=r,
        ).labels(**cache_config_labels(core)).set(1)
        # Read at scrape time, so an idle engine shows its idle state (len() is atomic in CPython).
        self.running.set_function(lambda: len(core.running))
        self.waiting.set_function(lambda: len(core.waiting))
        self.kv_usage.set_function(lambda: core.pool.usage)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", INTER_TOKEN_BUCKETS
        )

    def on_step(self, result: StepResult) -> None:
        self.generation_tokens.inc(len(result.outputs))
        if result.num_preempted:
            self.preemptions.inc(result.num_preempted)
        for out in result.outputs:
            req = out.request
            if len(req.output_token_ids) == 1:
                self.prompt_tokens.inc(req.prompt_len)
                self.prefix_queries.inc(req.prompt_len)
                self.prefix_hits.inc(req.num_cached_tokens)

    def on_finish(self, reason: str, ttft_s: float | None, e2e_s: float, itl_s: list[float]) -> None:
        self.success[reason if reason in self.success else "abort"].inc()
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        for gap in itl_s:
            self.itl.observe(gap)

    def on_abort(self) -> None:
        self.success["abort"].inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
