"""Analysis of a study's results: per-cell statistics, saturation, reference rates, taxes,
H1-H6 verdicts and the report. Reads files only (see README.md)."""

from connector_tax.analysis.core import analyze, build
from connector_tax.analysis.saturation import reference_rates

__all__ = ["analyze", "build", "reference_rates"]
