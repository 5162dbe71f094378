"""An estimate with its 95% interval and its unit: what the analysis's taxes and the numbers the
hypotheses rest on are, and what a reader of taxes.csv/.parquet or hypotheses.json gets.

The analysis computes them as JSON-ready documents ({"value", "ci", "note", "unresolved", ...}
and the detail of how: the two p90s, the method); `Estimate.of` reads one such document into this
type in one place, so no reader spells `est.get("ci")` or a `_ci_lo` key of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

# Units of what the analysis estimates: a relative tax (x / baseline - 1: 0.12 is +12 %), a
# difference in microseconds, percentage points (a difference of relative taxes, times 100).
RELATIVE, MICROSECONDS, POINTS, RATIO = "relative", "us", "pp", "ratio"

# Each tax metric of the taxes document (analysis.taxes) with its unit.
TAX_UNITS = {
    "ttft_p90": RELATIVE,
    "tpot_p90": RELATIVE,
    "engine_step_p50": RELATIVE,
    "step_p50_us": MICROSECONDS,
    "callback_p50_us": MICROSECONDS,
    "build_meta_p50_us": MICROSECONDS,
    "unattributed_p50_us": MICROSECONDS,
}


def unit_of(metric: str) -> str:
    """The unit of a tax metric (ValueError for a metric this table does not know: a new metric
    states its unit here before it reaches a table)."""
    try:
        return TAX_UNITS[metric]
    except KeyError:
        raise ValueError(f"tax metric {metric!r} has no unit (contract.estimate.TAX_UNITS)") from None


class Unresolved(msgspec.Struct):
    """Why a ratio over a tax has no estimate: that tax's interval covers 0 (`half_width`: the
    smallest tax these cells tell from 0)."""

    denominator: str
    value: float | None
    ci: tuple[float, float]
    half_width: float
    why: str


class Estimate(msgspec.Struct):
    value: float | None
    interval: tuple[float, float] | None  # 95%; None where the cells cannot bound it
    unit: str
    note: str | None = None
    unresolved: Unresolved | None = None

    @property
    def lo(self) -> float | None:
        return self.interval[0] if self.interval else None

    @property
    def hi(self) -> float | None:
        return self.interval[1] if self.interval else None

    @classmethod
    def of(cls, doc: Mapping[str, Any] | None, unit: str) -> Estimate:
        """From an estimate document; an interval with a missing bound is no interval."""
        doc = doc or {}
        ci = doc.get("ci")
        interval = (float(ci[0]), float(ci[1])) if ci and len(ci) == 2 and None not in ci else None
        value = doc.get("value")
        unresolved = doc.get("unresolved")
        return cls(
            value=None if value is None else float(value),
            interval=interval,
            unit=unit,
            note=doc.get("note"),
            unresolved=msgspec.convert(unresolved, Unresolved) if unresolved else None,
        )
