"""The analysis's tidy tables: one row per observation, as CSV (for eyes and spreadsheets) and
Parquet (typed, for pandas/polars/DuckDB).

    aggregate.csv / .parquet  one row per measured cell: its identity, run status, validity,
                              rates, latency percentiles with their intervals, step statistics
    taxes.csv / .parquet      one row per (phase, point, configuration, metric): the tax against
                              the baseline with its interval and its unit (relative: 0.12 is +12 %;
                              us: a difference in microseconds), and the two p90s (or p50s) it came from
Every row of both says its backend and whether it is simulated: a table read on its own says so.

A researcher's own question is a group-by away, e.g.
`pd.read_parquet("taxes.parquet").query("metric == 'ttft_p90'").pivot(index="variant", columns="point", values="value")`.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pandas as pd

from connector_tax.analysis.columns import COLUMNS
from connector_tax.atomic import write_atomic
from connector_tax.contract.estimate import Estimate, unit_of

TAX_COLUMNS = [
    "phase",
    "point",
    "rate",
    "input_len",
    "output_len",
    "variant",
    "baseline",
    "metric",
    "unit",
    "value",
    "ci_lo",
    "ci_hi",
    "x",
    "base",
    "x_n",
    "base_n",
    "backend",
    "simulated",
]


def cells_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The per-cell rows, columns in the order columns.COLUMNS defines."""
    return pd.DataFrame.from_records(rows, columns=COLUMNS)


def _tax_rows(
    phase: str, point: str, entry: dict[str, Any], baseline: str | None, shape: tuple[Any, Any]
) -> list[dict[str, Any]]:
    out = []
    for config, metrics in (entry.get("variants") or {}).items():
        for metric, doc in metrics.items():
            est = Estimate.of(doc, unit_of(metric))
            x = doc.get("x_p90", doc.get("x_p50"))
            base = doc.get("base_p90", doc.get("base_p50"))
            out.append(
                {
                    "phase": phase,
                    "point": point,
                    "rate": entry.get("rate"),
                    "input_len": shape[0],
                    "output_len": shape[1],
                    "variant": config,
                    "baseline": baseline,
                    "metric": metric,
                    "unit": est.unit,
                    "value": est.value,
                    "ci_lo": est.lo,
                    "ci_hi": est.hi,
                    "x": x,
                    "base": base,
                    "x_n": doc.get("x_n", doc.get("x_steps")),
                    "base_n": doc.get("base_n", doc.get("base_steps")),
                }
            )
    return out


def taxes_frame(
    taxes: dict[str, Any] | None, backend: str | None = None, simulated: bool | None = None
) -> pd.DataFrame:
    """Every tax the analysis computed, long form (empty when the study has no baseline), each row
    with the study's backend and whether it is simulated."""
    rows: list[dict[str, Any]] = []
    if taxes:
        baseline = taxes.get("baseline")
        for point, entry in (taxes.get("phase_a") or {}).items():
            if entry:
                rows += _tax_rows("phase_a", point, entry, baseline, (None, None))
        for phase in ("phase_b", "phase_b_prime"):
            section = taxes.get(phase) or {}
            rate = (section.get("rates") or [None])[0]
            for label, cell in (section.get("cells") or {}).items():
                rows += _tax_rows(
                    phase, label, {"rate": rate, **cell}, baseline, (cell.get("input"), cell.get("output"))
                )
    rows = [{**r, "backend": backend, "simulated": simulated} for r in rows]
    frame = pd.DataFrame.from_records(rows, columns=TAX_COLUMNS)
    return frame.astype(
        {"x_n": "Int64", "base_n": "Int64", "input_len": "Int64", "output_len": "Int64", "simulated": "boolean"}
    )


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def write_tables(
    aggregate: dict[str, Any], csv_path: Path, parquet_path: Path, taxes_csv: Path, taxes_parquet: Path
) -> None:
    """Both tables in both formats, each file replaced atomically."""
    for frame, csv_file, parquet_file in (
        (cells_frame(aggregate["rows"]), csv_path, parquet_path),
        (
            taxes_frame(aggregate.get("taxes"), aggregate.get("backend"), aggregate.get("simulated")),
            taxes_csv,
            taxes_parquet,
        ),
    ):
        write_atomic(csv_file, frame.to_csv(index=False, float_format="%.9g", lineterminator="\n"))
        write_atomic(parquet_file, _parquet_bytes(frame))
