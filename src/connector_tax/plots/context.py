"""What every figure builder shares: the documents (Ctx), the palette, Skip, the study's names."""

from __future__ import annotations

from typing import Any

from connector_tax.config import Saturation, default_saturation
from connector_tax.plots.style import Palette

# Saturation markers by criterion (the study's three); their labels state the study's thresholds.
CRITERION_MARKERS: dict[str, dict[str, Any]] = {
    "throughput": dict(marker="X", s=70),
    "waiting": dict(marker="s", s=140, facecolors="none", linewidths=1.3),
    "ttft_growth": dict(marker="^", s=190, facecolors="none", linewidths=1.3),
}


def criterion_labels(t: Saturation) -> dict[str, str]:
    """What each marker means, with the thresholds the study's saturation criteria used."""
    return {
        "throughput": f"saturated: throughput < {t.throughput_ratio_min:g} x offered",
        "waiting": f"saturated: waiting p50 > {t.waiting_p50_max:g}",
        "ttft_growth": f"saturated: TTFT p90 x{t.ttft_p90_ratio_max:g} vs r/2",
    }


class Skip(Exception):
    """The figure's data is missing; str(exc) says which and why."""


class Ctx:
    def __init__(self, agg: dict[str, Any], hyp: dict[str, Any] | None) -> None:
        self.agg, self.hyp = agg, hyp or {}
        self.variants: list[str] = list(agg.get("variants") or [])
        self.palette = Palette(self.variants)
        self.simulated = bool(agg.get("simulated"))
        self.served_by = agg.get("served_by")
        if self.served_by and agg.get("connector_packages"):  # named on every figure of a vLLM study
            self.served_by += f"; connectors: {agg['connector_packages']}"
        self.ref = agg.get("reference") or {}
        self.taxes = agg.get("taxes")
        self.baseline = agg.get("baseline")
        # The thresholds the analysis applied (aggregate.json records the study's, typed again here).
        thresholds = (agg.get("saturation") or {}).get("thresholds")
        self.saturation = Saturation(**thresholds) if thresholds else default_saturation()

    def rows(self, phase: str) -> list[dict[str, Any]]:
        """A phase's cells as measured by each variant's first launch: with replicates, a curve per
        variant stays one line (the taxes, and the figures drawn from them, pool every launch)."""
        return [r for r in self.agg.get("rows") or [] if r["phase"] == phase and (r.get("replicate") or 1) == 1]

    def by_variant(self, phase: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows(phase):
            out.setdefault(r["variant"], []).append(r)
        for v in out.values():
            v.sort(key=lambda r: r.get("rate") or 0)
        return {c: out[c] for c in self.variants if c in out} | {c: v for c, v in out.items() if c not in self.variants}

    def title(self, text: str) -> str:
        return text + (" — SIMULATED" if self.simulated else "")

    def need_taxes(self, what: str) -> dict[str, Any]:
        if not self.taxes:
            raise Skip(
                f"{what}: no baseline config {self.agg.get('baseline_requested')!r} in this study "
                "(connector-specific figure not applicable)"
            )
        taxes: dict[str, Any] = self.taxes
        return taxes
