"""What a load generator is asked to do: a cell (CellSpec) and the generator's options
(LoadgenOptions), each checked before anything starts (`check()`: ValueError naming the field)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from connector_tax.loadgen.prompts import POOL_TOKENS
from connector_tax.loadgen.shapes import ShapeSampler
from connector_tax.loadgen.sketch import DEFAULT_EXACT_CAP
from connector_tax.loadgen.stats import ValidityThresholds
from connector_tax.loadgen.trace import TraceRequest
from connector_tax.loadgen.urls import parse_url


@dataclass(frozen=True)
class CellSpec:
    phase: str
    label: str
    arrival: str = "poisson"  # poisson | gamma | fixed | max | concurrency | trace
    rate: float | None = None
    gamma_shape: float = 1.0
    shape: dict[str, Any] = field(default_factory=lambda: {"input": 1024, "output": 128})
    concurrency: int | None = None
    rampup_s: float = 0.0
    num_requests: int | None = None  # max-throughput count, or a cap on a trace
    trace: tuple[TraceRequest, ...] | None = None
    time_scale: float = 1.0
    warmup_s: float = 0.0
    duration_s: float = 60.0
    min_completed: int = 0
    max_duration_s: float | None = None  # hard end of the extension (default 10x duration + 60 s)

    def describe(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "cell": self.label,
            "arrival": self.arrival,
            "rate": self.rate,
            "gamma_shape": self.gamma_shape if self.arrival == "gamma" else None,
            "shape": self.shape if self.trace is None else "trace",
            "concurrency": self.concurrency,
            "rampup_s": self.rampup_s,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "min_completed": self.min_completed,
            "max_duration_s": self._max_duration(),
        }

    def _max_duration(self) -> float:
        return self.max_duration_s if self.max_duration_s is not None else 10 * self.duration_s + 60

    def check(self) -> None:
        """ValueError naming the field, before any request is sent."""
        if self.trace is not None:
            longest = max((r.input_length for r in self.trace), default=0)
            if longest >= POOL_TOKENS:
                raise ValueError(
                    f"trace: input_length {longest} is over the load generator's limit of {POOL_TOKENS - 1}"
                )
        else:
            longest = max(p.input for p in ShapeSampler(self.shape, 0).pairs)
            if longest >= POOL_TOKENS:
                raise ValueError(f"shape: input {longest} is over the load generator's limit of {POOL_TOKENS - 1}")


@dataclass(frozen=True)
class LoadgenOptions:
    url: str
    model: str
    endpoint: str = "completions"
    prompt: str = "token_ids"
    temperature: float = 0.0
    ignore_eos: bool = True
    workers: int = 1
    inflight_cap: int = 256
    timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    # ...plus this much per output token of the longest request issued, up to timeout_s: a request
    # sent at the end of a cell needs its whole stream, and 1,024 tokens at a loaded TPOT take
    # longer than 30 s (0.1 s/token is past any TPOT a valid cell has). It only bounds the wait:
    # the drain ends as soon as nothing is in flight.
    drain_s_per_token: float = 0.1
    # Requests leave for their worker this early; the worker fires them at their time. Must
    # exceed the hand-over's worst case: IPC p99 is ~0.5 ms here, but the session thread and
    # the ZMQ I/O threads share a core with the server, and 2 ms left ~1 % of requests late at
    # 100 req/s. It costs a request held a little longer in the worker's timer heap.
    send_ahead_us: float = 10_000.0
    # The worker wakes up to spin_us before a request's time and spins the rest, which absorbs
    # the wake-up latency (up to ~1 ms at the tail on a virtual CPU); spin_share caps that spin
    # at this share of the mean time between the worker's requests (floor 200 µs), so it costs
    # ~10 % of a core at 100 req/s instead of all of it at 1,000 req/s.
    spin_us: float = 1000.0
    spin_share: float = 0.1
    seed: int = 0
    affinity: bool = True
    # PM QoS limit on CPU wake-up latency held while the generator runs (cpu_latency.py): 0 keeps
    # idle CPUs polling, so neither a send nor the worker's timer waits for a halted CPU; None
    # leaves the machine's setting alone.
    cpu_latency_us: int | None = 0
    chunk_log: bool = False
    events_log: bool = False
    validity: ValidityThresholds = field(default_factory=ValidityThresholds)
    # Sent as "Authorization: Bearer <value of this environment variable>" when set.
    api_key_env: str | None = None
    tls_verify: bool = True  # https: check the server's certificate (curl's --insecure turns it off)
    tls_ca_file: str | None = None
    # Latency values a cell's summary keeps exactly; past this, percentiles are within 0.5 %
    # (sketch.py). The JSONL records are always complete.
    summary_exact_cap: int = DEFAULT_EXACT_CAP

    def check(self) -> None:
        """ValueError naming the option, before any worker starts."""
        try:
            parse_url(self.url, self.endpoint)
        except ValueError as exc:
            raise ValueError(f"url: {exc}") from None
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: must be an integer in 0..2^63-1, got {self.seed!r}")
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"api_key_env: environment variable {self.api_key_env!r} is not set")
        if self.tls_ca_file is not None and not os.path.isfile(self.tls_ca_file):
            raise ValueError(f"tls_ca_file: {self.tls_ca_file!r} is not a file")
