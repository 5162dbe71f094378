"""Faults the simulator can be told to inject, for the reliability work of its clients."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class FaultSettings:
    fail_start: str | None = None  # exit before serving, with this reason (preflight SKIP)
    slow_start_s: float = 0.0  # delay before the server starts accepting
    crash_after_s: float | None = None  # the process dies this long after it is ready
    crash_after_requests: int | None = None  # ... or once this many requests were accepted
    hang_after_tokens: int | None = None  # streams stall after this many tokens
    hang_rate: float = 1.0  # fraction of requests that hang when hang_after_tokens is set
    http_500_rate: float = 0.0  # fraction of generation requests answered with HTTP 500
    malformed_sse_rate: float = 0.0  # fraction of streamed chunks sent malformed
    health_503_after_s: float | None = None  # the engine "dies": /health 503, requests 500
    reset_rate: float = 0.0  # fraction of streams whose connection is dropped mid-stream
    metrics_delay_s: float = 0.0  # /metrics answers this late (a slow exporter)
    after_requests: int = 0  # the per-request faults spare this many first requests (a preflight's)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FaultSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known and v is not None})


class FaultDice:
    """Seeded draws, so a fault pattern is reproducible run to run."""

    def __init__(self, settings: FaultSettings, seed: int) -> None:
        self.settings = settings
        self._rng = random.Random(seed)
        self.requests = 0

    def begin_request(self) -> None:
        self.requests += 1

    def _draw(self, rate: float) -> bool:
        return rate > 0 and self.requests > self.settings.after_requests and self._rng.random() < rate

    def http_500(self) -> bool:
        return self._draw(self.settings.http_500_rate)

    def malformed_chunk(self) -> bool:
        return self._draw(self.settings.malformed_sse_rate)

    def reset(self) -> bool:
        return self._draw(self.settings.reset_rate)

    def hang_at(self) -> int | None:
        """The token count after which this request's stream stalls, if it does."""
        n = self.settings.hang_after_tokens
        if n is None or not self._draw(self.settings.hang_rate):
            return None
        return n
