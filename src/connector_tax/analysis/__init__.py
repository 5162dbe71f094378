"""Analysis of a study's results: per-cell statistics, saturation, reference rates, taxes,
H1-H6 verdicts and the report. Reads files only (see README.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["analyze", "build", "reference_rates"]


def __getattr__(name: str) -> Any:
    # Lazy: the pipeline's phase job uses analysis.batchmeans and analysis.saturation while cells
    # run, and should not pay for pandas and the whole analysis at every start.
    if name in ("analyze", "build"):
        from connector_tax.analysis import core

        return getattr(core, name)
    if name == "reference_rates":
        from connector_tax.analysis.reference_rates import reference_rates

        return reference_rates
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
