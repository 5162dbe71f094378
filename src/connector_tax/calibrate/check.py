"""`ctax calibrate --check RESULTS_DIR --profile PROFILE.yaml`: the profile's error on a real study.

Every usable cell of the real study is computed again in the simulator's virtual time with the
profile: the same cell (its rate, from the study's own reference rates, shape, warm-up, floor,
min-completed), the same arrival schedule and shapes (the load generator's generators with the
study's seed), the same cell rules (loadgen/schedule/rules.py, through the pipeline's VirtualRunner, with
the precision watch and Phase B's overload guard as the measuring loop sets them up). Both
sides then go through the analysis's own code: the cell's row (analysis.cellstats.cell_row, the
measured one from analysis.build) and the taxes (analysis.taxes.compute_taxes at the study's
reference rates), so predicted and measured numbers are the same statistics of the same cells.

Per cell: TTFT p90, TPOT p90, the step (schedule()) p50, the engine step p50 and the throughput,
predicted against measured, the relative error, and whether the prediction lies inside the
measured 95 % interval (none for a cell too short for batch means). Per variant: each TTFT and
TPOT tax, predicted against measured and its interval. Beside them, the anchors' measure
(anchors.py): mean TTFT, TPOT and E2E per cell, step time per batch composition. GOALS are the
calibration's bar: TTFT p90 within 10 % and TPOT p90 within 5 % on at least 90 % of cells, every
tax inside its interval, on a study the profile was not fitted on (the split: which cells the profile's provenance lists).
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from connector_tax.analysis import build
from connector_tax.analysis.cellstats import cell_row
from connector_tax.analysis.jsonl import NULL_INT, read_columns
from connector_tax.analysis.taxes import compute_taxes
from connector_tax.analysis.usable_cells import Measurement
from connector_tax.calibrate import anchors
from connector_tax.calibrate.anchors import GOALS as ANCHOR_GOALS
from connector_tax.calibrate.speed import at_speed, launch_speeds
from connector_tax.calibrate.study_tables import CalibrationError, open_study, read_study
from connector_tax.config import LAUNCH_OF, PHASE_A, ConfigError, StudyConfig
from connector_tax.config.profile import check_model, read_profile
from connector_tax.contract.layout import CellFiles
from connector_tax.measure.precision import OverloadGuard, PrecisionWatch
from connector_tax.measure.runners import VirtualRunner

GOALS = {"ttft_p90": 0.10, "tpot_p90": 0.05, "cells_share": 0.90}
# (name in the output, aggregate column, its interval's columns or None)
CELL_METRICS = (
    ("ttft_p90_ms", "ttft_ms_p90", ("ttft_ms_p90_ci_lo", "ttft_ms_p90_ci_hi")),
    ("tpot_p90_ms", "tpot_ms_p90", ("tpot_ms_p90_ci_lo", "tpot_ms_p90_ci_hi")),
    ("step_p50_us", "step_duration_us_p50", ("step_duration_us_p50_ci_lo", "step_duration_us_p50_ci_hi")),
    ("engine_step_p50_us", "engine_step_us_p50", ("engine_step_us_p50_ci_lo", "engine_step_us_p50_ci_hi")),
    ("throughput_rps", "effective_rps", None),
)
TAX_METRICS = ("ttft_p90", "tpot_p90")
_T0_NS = 10**12  # the virtual cells' clock base (any value: the analysis reads differences)


@dataclass
class Comparison:
    measured: float | None
    predicted: float | None
    ci: tuple[float, float] | None

    @property
    def error(self) -> float | None:
        """predicted / measured - 1."""
        if self.measured in (None, 0) or self.predicted is None:
            return None
        return self.predicted / self.measured - 1.0

    @property
    def inside(self) -> bool | None:
        if self.ci is None or self.predicted is None:
            return None
        return self.ci[0] <= self.predicted <= self.ci[1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "measured": _r(self.measured),
            "predicted": _r(self.predicted),
            "ci95": [_r(self.ci[0]), _r(self.ci[1])] if self.ci else None,
            "error": _r(self.error),
            "inside": self.inside,
        }


@dataclass
class CheckResult:
    study: str
    profile: str
    split: dict[str, Any]
    cells: list[dict[str, Any]] = field(default_factory=list)
    taxes: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    launch_speeds: dict[str, float] | None = None  # --launch-speed: measured / predicted per launch
    # The anchors' measure (anchors.py): step time per batch composition, and its summary.
    compositions: list[dict[str, Any]] = field(default_factory=list)
    anchors: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "profile": self.profile,
            "split": self.split,
            "launch_speeds": self.launch_speeds,
            "goals": GOALS,
            "cells": self.cells,
            "taxes": self.taxes,
            "summary": self.summary,
            "anchors_goals": ANCHOR_GOALS,
            "compositions": self.compositions,
            "anchors": self.anchors,
        }


def _r(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.5g}")


def _num(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def compare_row(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Comparison]:
    out = {}
    for name, column, ci in CELL_METRICS:
        bounds = None
        if ci is not None:
            lo, hi = _num(measured, ci[0]), _num(measured, ci[1])
            bounds = (lo, hi) if lo is not None and hi is not None else None
        out[name] = Comparison(_num(measured, column), _num(predicted, column), bounds)
    return out


def compare_taxes(measured: dict[str, Any], predicted: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per (variant, where, metric) that both sides have: the tax, predicted against measured."""
    out = []

    def add(variant: str, where: str, m: dict[str, Any], p: dict[str, Any]) -> None:
        for metric in TAX_METRICS:
            mv, pv = (m.get(metric) or {}), (p.get(metric) or {})
            if mv.get("value") is None:
                continue
            ci = mv.get("ci")
            comp = Comparison(mv["value"], pv.get("value"), (ci[0], ci[1]) if ci and None not in ci else None)
            d = comp.as_dict()
            d.pop("error")  # a tax's relative error means little near 0: its difference does
            d["difference"] = _r(None if comp.predicted is None else comp.predicted - mv["value"])
            out.append({"variant": variant, "at": where, "metric": metric, **d})

    for ref in ("ref_safe", "ref_load"):
        ma = (measured.get("phase_a") or {}).get(ref) or {}
        pa = (predicted.get("phase_a") or {}).get(ref) or {}
        if ref == "ref_load" and ma.get("cell") == ((measured.get("phase_a") or {}).get("ref_safe") or {}).get("cell"):
            continue  # the same cell as ref_safe: counted once
        for variant, m in (ma.get("variants") or {}).items():
            add(variant, f"phase_a {ref} ({ma.get('cell')})", m, (pa.get("variants") or {}).get(variant) or {})
    for phase in ("phase_b", "phase_b_prime"):
        for label, cell in ((measured.get(phase) or {}).get("cells") or {}).items():
            pcell = ((predicted.get(phase) or {}).get("cells") or {}).get(label) or {}
            for variant, m in (cell.get("variants") or {}).items():
                add(variant, f"{phase} {label}", m, (pcell.get("variants") or {}).get(variant) or {})
    return out


def _schedule_offsets(path: Path) -> np.ndarray:
    r = read_columns(path, {"t_scheduled_ns": "int"})["t_scheduled_ns"]
    r = np.sort(r[r != NULL_INT])
    return (r - r[0]) if r.size else r


def replay(cell: Measurement, folder: Path, runner: VirtualRunner) -> Measurement:
    """The measured cell computed again in virtual time, its records under `folder`."""
    planned = cell.planned
    files = CellFiles(folder, planned.phase, planned.label)
    folder.mkdir(parents=True, exist_ok=True)
    waiting: list[tuple[float, float]] = []
    precision = PrecisionWatch(files.requests, planned.precision_target)
    guard = OverloadGuard(
        waiting,
        _T0_NS / 1e9 + planned.warmup_s,
        runner.study.saturation.waiting_p50_max,
        planned.phase != PHASE_A and planned.overload_guard,
    )
    with contextlib.redirect_stdout(sys.stderr):  # the runner's progress lines are not the check's output
        summary, _ = runner.run(planned, files, _T0_NS, precision, guard.overloaded, waiting)
    return Measurement(cell.variant, cell.phase, cell.label, files, planned, summary)


def check(
    results_dir: Path,
    profile_file: str | Path,
    workdir: Path | None = None,
    simulated_ok: bool = False,
    launch_speed: bool = False,
) -> CheckResult:
    """Replay the real study under `results_dir` with the profile; CalibrationError (one line).
    `simulated_ok`: check against the simulator's own records (tests: a known answer);
    `launch_speed`: the diagnostic of speed.py (each launch at its own measured speed)."""
    study = open_study(Path(results_dir), "the check", simulated_ok)
    try:
        profile = read_profile(profile_file)
        check_model(profile, study.settings.raw, where="--profile")
    except ConfigError as exc:
        raise CalibrationError(str(exc)) from None
    measured_cells = study.cells()
    variants = [v for v in study.variants if any(c.variant == v for c in measured_cells)]
    missing = [v for v in variants if profile.variant_for(v, study.settings.variant(v).connector) is None]
    missing = [v for v in missing if study.settings.variant(v).connector]
    if missing:
        raise CalibrationError(
            f"--profile: {profile_file} has no fitted costs for variant {missing[0]} "
            f"(fitted: {', '.join(profile.variants) or 'none'}): its prediction would be the hand-set model's"
        )
    built = build(Path(results_dir))["aggregate"]
    measured_rows = {(r["variant"], r["phase"], r["cell"]): r for r in built["rows"]}
    reference = built["reference"]
    baseline = built.get("baseline")
    config = study.settings.virtual(str(profile.source))
    fitted = {
        (c["variant"], c["phase"], c["cell"]): c.get("fingerprint") for c in profile.provenance.get("cells") or []
    }
    overlap = [
        c.key
        for c in measured_cells
        if c.summary is not None and fitted.get((c.variant, c.phase, c.label)) == c.summary.fingerprint
    ]
    result = CheckResult(
        study=study.name,
        profile=profile.describe(),
        split={
            "fitted_on": profile.provenance.get("study"),
            "fitted_seed": profile.provenance.get("seed"),
            "fitted_phase_a_rates": profile.provenance.get("phase_a_rates"),
            "checked": study.name,
            "checked_seed": study.settings.seed,
            "checked_phase_a_rates": study.phase_a_rates,
            "cells_also_fitted": len(overlap),
            "held_out": not overlap,
        },
    )
    speeds: dict[tuple[str, str], float] = {}
    data = read_study(Path(results_dir), "the check", simulated_ok)
    if launch_speed:
        speeds = launch_speeds(profile, data)
        result.launch_speeds = {f"{v}/{ph}": round(x, 4) for (v, ph), x in speeds.items()}
    predicted_rows = []
    with tempfile.TemporaryDirectory(prefix="ctax-check-") as scratch:
        root = Path(workdir) if workdir else Path(scratch)
        runners: dict[tuple[str, str], VirtualRunner] = {}
        for variant in variants:
            for cell in [c for c in measured_cells if c.variant == variant]:
                launch = (variant, LAUNCH_OF[cell.phase])
                if launch not in runners:
                    launch_config = config
                    if launch in speeds:
                        connector = study.settings.variant(variant).connector
                        path = at_speed(profile, variant, connector, speeds[launch], root / "profiles")
                        launch_config = study.settings.virtual(str(read_profile(path).source))
                    launch_study = StudyConfig.from_mapping(launch_config)
                    runners[launch] = VirtualRunner(launch_study, launch_study.variant(variant))
                runner = runners[launch]
                virtual = replay(cell, root / variant / cell.phase, runner)
                row, _ = cell_row(virtual, backend="sim", simulated=True, run_status="ok", step_timing_available=True)
                predicted_rows.append(row)
                measured = measured_rows.get((variant, cell.phase, cell.label), {})
                comps = compare_row(measured, row)
                real_offsets = _schedule_offsets(cell.path("requests"))
                virt_offsets = _schedule_offsets(virtual.path("requests"))
                n = min(real_offsets.size, virt_offsets.size)
                same = bool(n) and bool(np.abs(real_offsets[:n] - virt_offsets[:n]).max() < 1_000_000)
                result.cells.append(
                    {
                        "variant": variant,
                        "phase": cell.phase,
                        "cell": cell.label,
                        "rate": cell.rate,
                        "requests": {"measured": measured.get("ttft_ms_n"), "predicted": row.get("ttft_ms_n")},
                        "same_arrivals": same,
                        "saturated": measured.get("saturated"),
                        "valid": measured.get("valid"),
                        **{k: c.as_dict() for k, c in comps.items()},
                        "means": anchors.compare_means(cell.path("requests"), virtual.path("requests")),
                    }
                )
    if baseline:
        predicted_taxes = compute_taxes(predicted_rows, variants, baseline, reference)
        result.taxes = compare_taxes(built.get("taxes") or {}, predicted_taxes)
    result.summary = summarize(result.cells, result.taxes)
    result.compositions = anchors.step_compositions(profile, data)
    result.anchors = anchors.summarize(result.cells, result.compositions)
    return result


def summarize(cells: list[dict[str, Any]], taxes: list[dict[str, Any]]) -> dict[str, Any]:
    def within(metric: str, bound: float) -> tuple[int, int]:
        errors = [c[metric]["error"] for c in cells if c[metric]["error"] is not None]
        return sum(abs(e) <= bound for e in errors), len(errors)

    ttft_ok, ttft_n = within("ttft_p90_ms", GOALS["ttft_p90"])
    tpot_ok, tpot_n = within("tpot_p90_ms", GOALS["tpot_p90"])
    judged = [t for t in taxes if t["inside"] is not None]
    inside = sum(bool(t["inside"]) for t in judged)
    cell_inside = {
        m: (
            sum(bool(c[m]["inside"]) for c in cells if c[m]["inside"] is not None),
            sum(c[m]["inside"] is not None for c in cells),
        )
        for m in ("ttft_p90_ms", "tpot_p90_ms")
    }
    abs_err = {
        m: _r(float(np.median([abs(c[m]["error"]) for c in cells if c[m]["error"] is not None])))
        if any(c[m]["error"] is not None for c in cells)
        else None
        for m, _, _ in CELL_METRICS
    }
    share = GOALS["cells_share"]
    met = {
        "ttft_p90": ttft_n > 0 and ttft_ok >= share * ttft_n,
        "tpot_p90": tpot_n > 0 and tpot_ok >= share * tpot_n,
        "taxes": bool(judged) and inside == len(judged),
    }
    return {
        "cells": len(cells),
        "ttft_p90_within_10pct": [ttft_ok, ttft_n],
        "tpot_p90_within_5pct": [tpot_ok, tpot_n],
        "ttft_p90_inside_ci": list(cell_inside["ttft_p90_ms"]),
        "tpot_p90_inside_ci": list(cell_inside["tpot_p90_ms"]),
        "median_abs_error": abs_err,
        "taxes": len(taxes),
        "taxes_inside_ci": [inside, len(judged)],
        "taxes_without_ci": len(taxes) - len(judged),
        "goals_met": met,
    }
