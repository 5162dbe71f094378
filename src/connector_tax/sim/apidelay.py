"""What the API server and streaming add beyond the engine step, in virtual time.

A real request reaches the engine's scheduler some time after the client sent it (HTTP,
parsing, the hop to the engine process: ingress), and a token reaches the client some time
after the step that made it ended (the hop back, detokenizing, the SSE chunk: egress). A
calibrated profile holds both as distributions measured on the real server (config/profile.py,
quantiles at its QUANTILES, or LEGACY_QUANTILES in an older file); a hand-set profile has none,
and both delays are 0.

Draws are a function of (seed, request index) alone, so every variant of a study sees the same
uniforms for the same request (common random numbers, as the arrival schedule), and a request's
delays do not depend on how many draws came before it. Only the virtual clocks use them (the
oracle's cells and virtual-time study cells): a `ctax sim` server in real time has a real HTTP
server that adds its own.
"""

from __future__ import annotations

import bisect
import random

from connector_tax.config.profile import ApiProfile, grid_for


def quantile(grid: tuple[float, ...], u: float) -> float:
    """The value at probability `u` of a distribution stored as quantiles (`grid`, at the
    probabilities config.profile.grid_for names; linear between them); 0 for an empty grid."""
    if not grid:
        return 0.0
    at = grid_for(grid)
    i = min(max(bisect.bisect_right(at, u) - 1, 0), len(at) - 2)
    lo, hi = at[i], at[i + 1]
    w = (u - lo) / (hi - lo)
    return grid[i] + (grid[i + 1] - grid[i]) * min(max(w, 0.0), 1.0)


class ApiDelays:
    """Per-request ingress and egress draws (µs) of one cell."""

    def __init__(self, profile: ApiProfile | None, seed: int) -> None:
        self.profile = profile or ApiProfile()
        self.seed = seed

    @property
    def active(self) -> bool:
        return bool(self.profile.ingress_us or self.profile.egress_us)

    def draw(self, index: int) -> tuple[float, float, float]:
        """(ingress, first-token egress, last-token egress) of request `index`, µs."""
        if not self.active:
            return 0.0, 0.0, 0.0
        rng = random.Random(self.seed * 1_000_003 + index)
        p = self.profile
        return (
            quantile(p.ingress_us, rng.random()),
            quantile(p.egress_us, rng.random()),
            quantile(p.egress_us, rng.random()),
        )
