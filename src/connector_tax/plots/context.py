"""What every figure builder shares: the documents (Ctx), the palette, Skip, the design's names."""

from __future__ import annotations

from typing import Any

from connector_tax.plots.style import Palette

PHASE_A, PHASE_B, PHASE_B_PRIME = "phase_a", "phase_b", "phase_b_prime"
NOOP, MOONCAKE_BOTH, LMCACHE_ONLY, MULTI = "noop_connector", "mooncake_both", "lmcache_only", "multi_mooncake_lmcache"

CRITERION_MARKERS = {  # design: saturation markers by criterion
    "throughput": dict(marker="X", s=70, label="saturated: throughput < 0.95 x offered"),
    "waiting": dict(marker="s", s=140, facecolors="none", linewidths=1.3, label="saturated: waiting p50 > 1"),
    "ttft_growth": dict(marker="^", s=190, facecolors="none", linewidths=1.3, label="saturated: TTFT p90 x1.5 vs r/2"),
}


class Skip(Exception):
    """The figure's data is missing; str(exc) says which and why."""


class Ctx:
    def __init__(self, agg: dict[str, Any], hyp: dict[str, Any] | None) -> None:
        self.agg, self.hyp = agg, hyp or {}
        self.configs: list[str] = list(agg.get("configs") or [])
        self.palette = Palette(self.configs)
        self.simulated = bool(agg.get("simulated"))
        self.served_by = agg.get("served_by")
        if self.served_by and agg.get("connector_packages"):  # named on every figure of a vLLM study
            self.served_by += f"; connectors: {agg['connector_packages']}"
        self.ref = agg.get("reference") or {}
        self.taxes = agg.get("taxes")
        self.baseline = agg.get("baseline")

    def rows(self, phase: str) -> list[dict[str, Any]]:
        return [r for r in self.agg.get("rows") or [] if r["phase"] == phase]

    def by_config(self, phase: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows(phase):
            out.setdefault(r["config"], []).append(r)
        for v in out.values():
            v.sort(key=lambda r: r.get("rate") or 0)
        return {c: out[c] for c in self.configs if c in out} | {c: v for c, v in out.items() if c not in self.configs}

    def title(self, text: str) -> str:
        return text + (" — SIMULATED" if self.simulated else "")

    def need_taxes(self, what: str) -> dict[str, Any]:
        if not self.taxes:
            raise Skip(
                f"{what}: no baseline config {self.agg.get('baseline_requested')!r} in this study "
                "(connector-specific figure not applicable)"
            )
        return self.taxes
