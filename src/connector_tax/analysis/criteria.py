"""Success criteria 1–7 of the study (docs/study-design.md): 1–5 read the hypotheses' numbers
(hypotheses.py), 6 and 7 the study's artifacts and run time (artifacts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connector_tax.analysis import constants as K


def _sc(
    cid: str,
    title: str,
    status: str,
    outcome: str | None,
    reason: str,
    numbers: dict[str, Any] | None = None,
    confidence: str | None = None,
) -> dict[str, Any]:
    return {
        "id": cid,
        "title": title,
        "status": status,
        "outcome": outcome,
        "reason": reason,
        "numbers": numbers or {},
        "confidence": confidence,
    }


Regions = list[tuple[str, float, float]]


def _region(value: float, regions: Regions) -> tuple[str, float, float]:
    return next((name, lo, hi) for name, lo, hi in regions if lo <= value < hi)


def _from(
    h: dict[str, Any],
    cid: str,
    title: str,
    outcome: Callable[[dict[str, Any]], str] | Regions,
    numbers: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """A success criterion that reports one hypothesis's number: met once the number exists.
    `outcome` names it from the hypothesis's call (the same threshold: its confidence is the
    hypothesis's), or by bands of the criterion's own (SC1's accept band, SC3's 30 / 50 % shares):
    then the confidence is the criterion's, confident only when the number's interval lies inside
    the band it is called in. H1's interval above its 10 % threshold says nothing about 60 %."""
    if h["verdict"] == "not_applicable":
        return _sc(cid, title, "not_applicable", None, h["reason"])
    if h["verdict"] == "inconclusive":
        return _sc(cid, title, "not_met", None, h["reason"])
    if callable(outcome):
        return _sc(cid, title, "met", outcome(h), h["reason"], numbers(h), h["confidence"])
    name, lo, hi = _region(h["value"], outcome)
    ci, confidence = h.get("ci"), h["confidence"]
    if ci and confidence in ("confident", "within noise"):  # else: perturbed cells, or no interval
        confidence = "confident" if lo <= ci[0] and ci[1] < hi else "within noise"
    shown = h["reason"].split(": ", 1)[0]  # the number and its interval, as the hypothesis shows them
    return _sc(cid, title, "met", name, f"{shown}: {name} ({confidence})", numbers(h), confidence)


def _direction(h: dict[str, Any], hid: str, metric: str, along: str) -> str | None:
    """SC5's reason for one hypothesis: its tax's total change along each series, with the interval."""
    parts = []
    for ser in ((h.get("numbers") or {}).get(K.MOONCAKE_BOTH) or {}).get("series") or []:
        pts, total, ci = ser.get("points") or [], ser.get("total_pp"), ser.get("total_ci")
        if len(pts) < 2 or total is None:
            continue
        across = "output" if along == "input" else "input"
        span = f"{along} {pts[0][along]:g} -> {pts[-1][along]:g} at {across} {ser.get(across)}"
        parts.append(f"{span}: {total:+.1f} pp" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""))
    return f"{hid} {metric} tax, {'; '.join(parts)}" if parts else None


def success_criteria(
    hyps: dict[str, dict[str, Any]], artifacts: dict[str, Any], runtime: dict[str, Any], simulated: bool
) -> list[dict[str, Any]]:
    lo, hi = K.SC1_ACCEPT
    a, b = K.H3_IMPLEMENTATION_SHARE, K.H3_FRAMEWORK_SHARE
    inf = float("inf")
    out = [
        _from(
            hyps["H1"],
            "SC1",
            "1. H1 falsifiable: mooncake_both tax_TTFT_p90 at ref_safe reported; prior accepted if in [25%, 60%]",
            [
                ("revise prior (below)", -inf, lo),
                ("accept prior", lo, hi + 1e-12),
                ("revise prior (above)", hi + 1e-12, inf),
            ],
            lambda h: {**h["numbers"], "accept_band": [lo, hi], "prior": K.PRIOR_TAX},
        ),
        _from(
            hyps["H2"],
            "SC2",
            "2. H2 testable: NIXL-vs-Mooncake gap at ref_safe reported and compared with ~7 pp",
            lambda h: "agrees with trace replay" if h["verdict"] == "supported" else "disagrees with trace replay",
            lambda h: h["numbers"],
        ),
        _from(
            hyps["H3"],
            "SC3",
            "3. H3 disambiguated: framework-dominated if noop >= 50% of mooncake_both tax, implementation-dominated if < 30%",
            [
                ("implementation-cost-dominated", -inf, a),
                ("neither (30-50%)", a, b),
                ("framework-cost-dominated", b, inf),
            ],
            lambda h: {"noop_share": h["numbers"].get("noop_share")},
        ),
        _from(
            hyps["H4"],
            "SC4",
            "4. H4 additivity: |multi - (mooncake_both + lmcache_only)| / multi <= 0.30 -> linear",
            lambda h: (
                "linear" if h["verdict"] == "supported" else "super-additive" if h["value"] > 0 else "sub-additive"
            ),
            lambda h: {"rel_dev": h["numbers"].get("rel_dev")},
        ),
    ]
    h5, h6 = hyps["H5"], hyps["H6"]
    title = "5. H5 + H6 directional: sign and magnitude of tax growth with input (TTFT) and output (TPOT)"
    if h5["verdict"] == "not_applicable" and h6["verdict"] == "not_applicable":
        out.append(_sc("SC5", title, "not_applicable", None, f"H5: {h5['reason']}; H6: {h6['reason']}"))
    else:

        def series(h: dict[str, Any], key: str) -> list[dict[str, Any]]:
            ser = ((h.get("numbers") or {}).get(K.MOONCAKE_BOTH) or {}).get("series") or []
            return [{key: s.get(key), "sign": s["sign"], "total_pp": s["total_pp"], "ci": s["total_ci"]} for s in ser]

        nums = {"ttft_tax_vs_input": series(h5, "output"), "tpot_tax_vs_output": series(h6, "input")}
        met = bool(nums["ttft_tax_vs_input"]) and bool(nums["tpot_tax_vs_output"])
        out.append(
            _sc(
                "SC5",
                title,
                "met" if met else "not_met",
                f"H5 {h5['verdict']}, H6 {h6['verdict']}",
                "; ".join(filter(None, (_direction(h5, "H5", "TTFT", "input"), _direction(h6, "H6", "TPOT", "output"))))
                if met
                else "one direction could not be computed",
                nums,
            )
        )
    missing = artifacts.get("missing") or []
    out.append(
        _sc(
            "SC6",
            "6. All artifacts present: every config that ran has its file types; every SKIP has a reason",
            "met" if artifacts.get("ok") else "not_met",
            None,
            "all present" if artifacts.get("ok") else f"{len(missing)} problem(s): " + "; ".join(missing[:5]),
            artifacts,
        )
    )
    title = f"7. Bench finishes < {K.SC7_MAX_HOURS:g} h wall clock"
    hours = runtime.get("wall_hours")
    if hours is None:
        out.append(_sc("SC7", title, "not_met", None, "no run.json with start and finish times", runtime))
        return out
    if runtime.get("simulated_cell_hours") is not None:
        computed_s = hours * 3600
        hours = runtime["simulated_cell_hours"]
        why = (
            f"{hours:.2f} h of cells in the simulator's virtual time, one job at a time, "
            f"server start-ups not included ({computed_s:.0f} s computed here)"
        )
    else:
        note = " (simulated backend: the 6 h budget is for the real H20 study)" if simulated else ""
        why = f"{hours:.2f} h from first phase start to last phase finish{note}"
    out.append(_sc("SC7", title, "met" if hours < K.SC7_MAX_HOURS else "not_met", None, why, runtime))
    return out
