"""Figures 1-8 of the study (docs/study-design.md), each built from the analysis documents
(aggregate + hypotheses).

Every builder returns a matplotlib Figure or raises Skip(reason): a figure whose data is
missing is never drawn empty; the reason goes to figures/skipped.json and the report.
"""

from __future__ import annotations

from collections.abc import Callable

from matplotlib.figure import Figure

from connector_tax.plots.context import Ctx, Skip
from connector_tax.plots.rate_figures import fig1, fig2, fig3
from connector_tax.plots.step_figures import fig6, fig7
from connector_tax.plots.tax_figures import fig4, fig4b, fig5, fig8

__all__ = ["FIGURES", "Ctx", "Skip"]

# name -> builder; the name is the file stem (figures/<name>.png/.pdf) and the skipped.json key.
FIGURES: dict[str, Callable[..., Figure]] = {
    "fig1_ttft_p90_vs_rate": fig1,
    "fig2_tpot_p90_vs_rate": fig2,
    "fig3_throughput_vs_requested": fig3,
    "fig4_tax_bars_ref_safe_ref_load": fig4,
    "fig4b_tax_shapes_phase_b_prime": fig4b,
    "fig5_tax_shape_heatmaps": fig5,
    "fig6_step_latency_cdf": fig6,
    "fig7_tax_decomposition": fig7,
    "fig8_h4_additivity": fig8,
}
