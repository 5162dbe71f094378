"""The simulator judged as its anchors judge theirs, beside check.py's p90 table.

LLMServingSim 2.0 and LLM-Emu report the error of *mean* TTFT and TPOT per operating point, and
Vidur the error of its step-time predictor per batch; a p90 of a 64-request cell moves ±15-40 %
on this host by itself, so a 5 % bar on it measures the cell, not the model. Here, per checked cell:

* **means** — mean TTFT, mean TPOT and mean E2E over the cell's completed post-warm-up requests,
  predicted (the virtual replay) against measured, and the relative error;
* **p90 inside** — check.py's own test: the predicted p90 inside the measured 95 % interval.

And per batch composition, over every engine step of the checked study (thousands):

* **step time** — the steps binned by (prefill tokens, decoding sequences); per variant and bin
  the mean measured engine step against the mean of the profile's prediction for the *same*
  steps (speed.predicted_step: the fitted costs at each step's own batch), so the step model is
  judged apart from the queueing that composes the batches. Bins with fewer than MIN_STEPS steps
  are listed, not judged.

GOALS: mean TPOT within 5 % and mean TTFT within 10 % on >= 90 % of cells, step time within 5 %
in every judged composition, each predicted p90 inside the measured interval on >= 90 % of cells.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from connector_tax.analysis.jsonl import NULL_INT, read_columns
from connector_tax.calibrate.speed import predicted_step
from connector_tax.calibrate.study_tables import StudyData
from connector_tax.config.profile import EngineProfile

GOALS = {"ttft_mean": 0.10, "tpot_mean": 0.05, "step": 0.05, "cells_share": 0.90, "p90_inside_share": 0.90}
MEANS = ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms")
# A bin's mean step is judged from this many steps: steps scatter ~25 % around their mean and come
# in correlated runs, so 100 give the mean to about ±5 % (95 %).
MIN_STEPS = 100
# Bin edges [lo, hi): prefill tokens of the step, and sequences decoding in it. Coarse in prefill:
# a study has tens of prefill steps per shape and variant against thousands of decode steps.
PREFILL_EDGES = (0, 1, 257, math.inf)
DECODE_EDGES = (0, 1, 2, 5, 9, math.inf)
_FIELDS = {
    "t_send_ns": "int",
    "t_first_token_ns": "int",
    "t_last_token_ns": "int",
    "completion_tokens": "int",
    "warmup": "bool",
    "status": "str",
}


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.5g}")


def request_means(path: Path) -> dict[str, float | None]:
    """Mean TTFT, TPOT and E2E (ms) of a cell's completed post-warm-up requests (the study's
    definitions: TTFT and E2E from the send, TPOT over the tokens after the first)."""
    empty: dict[str, float | None] = {m: None for m in MEANS}
    if not path.exists():
        return empty
    r = read_columns(path, _FIELDS)
    ok = (r["status"] == "ok") & ~r["warmup"].astype(bool)
    ok &= (r["t_send_ns"] != NULL_INT) & (r["t_first_token_ns"] != NULL_INT) & (r["t_last_token_ns"] != NULL_INT)
    if not ok.any():
        return empty
    send, first, last = (r[k][ok].astype(float) for k in ("t_send_ns", "t_first_token_ns", "t_last_token_ns"))
    n = r["completion_tokens"][ok].astype(float)
    tpot = (last - first)[n > 1] / (n[n > 1] - 1)
    return {
        "ttft_mean_ms": float(np.mean(first - send)) / 1e6,
        "tpot_mean_ms": float(np.mean(tpot)) / 1e6 if tpot.size else None,
        "e2e_mean_ms": float(np.mean(last - send)) / 1e6,
    }


def compare_means(measured: Path, predicted: Path) -> dict[str, dict[str, float | None]]:
    """Per mean: measured, predicted and predicted / measured - 1."""
    m, p = request_means(measured), request_means(predicted)
    out = {}
    for k in MEANS:
        mv, pv = m[k], p[k]
        err = pv / mv - 1.0 if mv and pv is not None else None
        out[k] = {"measured": _r(mv), "predicted": _r(pv), "error": _r(err)}
    return out


def _label(edges: tuple[float, ...], i: int) -> str:
    lo, hi = edges[i], edges[i + 1]
    if hi == lo + 1:
        return f"{lo:g}"
    return f">={lo:g}" if math.isinf(hi) else f"{lo:g}-{hi - 1:g}"


def step_compositions(profile: EngineProfile, data: StudyData) -> list[dict[str, Any]]:
    """Per variant and (prefill, decode) bin: steps, mean measured and predicted engine step (µs),
    the error, and whether the bin is judged (>= MIN_STEPS steps). Steps that schedule no token
    are left out (the simulator has no such step: README)."""
    out = []
    for variant in data.variants:
        steps = data.steps(variant)
        if steps.empty:
            continue
        prefill = steps["prefill_tokens"].fillna(0).to_numpy()
        decode = steps["decode_tokens"].fillna(0).to_numpy()
        keep = (prefill + decode) > 0
        steps, prefill, decode = steps[keep].reset_index(drop=True), prefill[keep], decode[keep]
        connector = data.study.settings.variant(variant).connector
        predicted = predicted_step(profile, profile.variant_for(variant, connector), steps)
        frame = pd.DataFrame(
            {
                "p": np.digitize(prefill, PREFILL_EDGES[1:-1]),
                "d": np.digitize(decode, DECODE_EDGES[1:-1]),
                "measured": steps["engine_step_us"].to_numpy(dtype=float),
                "predicted": predicted,
            }
        )
        for (p, d), g in frame.groupby(["p", "d"]):
            mean_m, mean_p = float(g["measured"].mean()), float(g["predicted"].mean())
            out.append(
                {
                    "variant": variant,
                    "prefill_tokens": _label(PREFILL_EDGES, int(p)),
                    "decode_seqs": _label(DECODE_EDGES, int(d)),
                    "steps": len(g),
                    "measured_us": _r(mean_m),
                    "predicted_us": _r(mean_p),
                    "error": _r(mean_p / mean_m - 1.0 if mean_m > 0 else None),
                    "judged": len(g) >= MIN_STEPS,
                }
            )
    return out


def summarize(cells: list[dict[str, Any]], compositions: list[dict[str, Any]]) -> dict[str, Any]:
    """The anchors' measure over the check's cells and the step compositions, against GOALS."""

    def within(key: str, bound: float) -> list[int]:
        errors = [
            c["means"][key]["error"] for c in cells if (c.get("means") or {}).get(key, {}).get("error") is not None
        ]
        return [sum(abs(e) <= bound for e in errors), len(errors)]

    def inside(key: str) -> list[int]:
        judged = [c[key]["inside"] for c in cells if c[key]["inside"] is not None]
        return [sum(bool(x) for x in judged), len(judged)]

    def median_abs(key: str) -> float | None:
        errors = [abs(c["means"][key]["error"]) for c in cells if c["means"][key]["error"] is not None]
        return _r(float(np.median(errors))) if errors else None

    judged = [c for c in compositions if c["judged"] and c["error"] is not None]
    steps_ok = [sum(abs(c["error"]) <= GOALS["step"] for c in judged), len(judged)]
    ttft, tpot = within("ttft_mean_ms", GOALS["ttft_mean"]), within("tpot_mean_ms", GOALS["tpot_mean"])
    in_ttft, in_tpot = inside("ttft_p90_ms"), inside("tpot_p90_ms")
    share, p90_share = GOALS["cells_share"], GOALS["p90_inside_share"]

    def met(pair: list[int], bar: float) -> bool:
        return pair[1] > 0 and pair[0] >= bar * pair[1]

    return {
        "ttft_mean_within_10pct": ttft,
        "tpot_mean_within_5pct": tpot,
        "median_abs_error": {k: median_abs(k) for k in MEANS},
        "step_compositions_within_5pct": steps_ok,
        "step_compositions_not_judged": len(compositions) - len(judged),
        "steps_judged": sum(c["steps"] for c in judged),
        "ttft_p90_inside_ci": in_ttft,
        "tpot_p90_inside_ci": in_tpot,
        "goals_met": {
            "ttft_mean": met(ttft, share),
            "tpot_mean": met(tpot, share),
            "step": bool(judged) and steps_ok[0] == steps_ok[1],
            "ttft_p90_inside": met(in_ttft, p90_share),
            "tpot_p90_inside": met(in_tpot, p90_share),
        },
    }
