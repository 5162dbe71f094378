"""Verdicts for H1-H6 and success criteria 1-7, each with the numbers it rests on.

Every verdict compares a 95% interval (quantiles.TAX_CI_METHOD), not just a point, with the
design's threshold: when the interval reaches across the threshold the verdict is
"inconclusive" and `ci_overlaps_threshold` is true; the point estimate's side is still
reported (`point_side`), so a reader sees which way the data lean.

Hypotheses use tax_TTFT_p90 / tax_TPOT_p90 at ref_safe (Phase A cell at that rate) unless
stated: H5/H6 use the Phase B shape grid. Verdicts: supported | refuted | inconclusive |
not_applicable (a configuration the hypothesis names did not run, or the study is not the
connector study). Success criteria: met | not_met | inconclusive | not_applicable, with an
`outcome` in the design's words (accept / revise the prior, framework- / implementation-
dominated, linear / super- / sub-additive, ...).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from connector_tax.analysis import constants as K
from connector_tax.analysis.quantiles import combine, tax_combination


def _ci(est: dict[str, Any] | None) -> list[float] | None:
    ci = (est or {}).get("ci")
    return list(ci) if ci and None not in ci else None


def _overlaps(ci: list[float] | None, *thresholds: float) -> bool | None:
    if ci is None:
        return None
    return any(ci[0] <= t <= ci[1] for t in thresholds)


def _side(value: float | None, threshold: float) -> str | None:
    if value is None:
        return None
    return "above" if value > threshold else "below" if value < threshold else "at"


def _div_interval(num: list[float], den: list[float]) -> list[float] | None:
    """num / den for intervals, den strictly positive."""
    if den[0] <= 0:
        return None
    vals = [num[0] / den[0], num[0] / den[1], num[1] / den[0], num[1] / den[1]]
    return [min(vals), max(vals)]


def _na(hid: str, title: str, reason: str) -> dict[str, Any]:
    return {"id": hid, "title": title, "verdict": "not_applicable", "reason": reason, "numbers": {},
            "ci_overlaps_threshold": None}  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _tax_number(est: dict[str, Any]) -> dict[str, Any]:
    return {"value": est.get("value"), "ci": _ci(est), "x_p90": est.get("x_p90"), "base_p90": est.get("base_p90"),
            "x_n": est.get("x_n"), "base_n": est.get("base_n"),
            "cells_valid": [est.get("x_valid"), est.get("base_valid")]}  # fmt: skip


class _Ctx:
    def __init__(self, taxes: dict[str, Any], reference: dict[str, Any], configs: list[str], baseline: str | None):
        self.taxes = taxes or {}
        self.reference = reference or {}
        self.configs = configs
        self.baseline = baseline
        self.safe = ((self.taxes.get("phase_a") or {}).get("ref_safe") or {})
        self.caveats: list[str] = []
        if self.reference.get("ref_safe_flagged"):
            self.caveats.append(f"ref_safe is flagged: {self.reference.get('ref_safe_reason')}")

    def tax(self, config: str, metric: str = "ttft_p90") -> dict[str, Any] | None:
        est = ((self.safe.get("configs") or {}).get(config) or {}).get(metric)
        return est if est and est.get("value") is not None else None

    def need(self, *names: str) -> str | None:
        if self.baseline != K.PLAIN:
            return f"connector-specific: the study's baseline is {self.baseline!r}, not 'plain'"
        missing = [n for n in (K.PLAIN, *names) if n not in self.configs]
        if missing:
            return f"configs not in the study: {', '.join(missing)}"
        absent = [n for n in names if self.tax(n) is None]
        if absent:
            why = (self.safe.get("missing") or {})
            detail = "; ".join(f"{n}: {why.get(n, 'no TTFT p90 tax at ref_safe')}" for n in absent)
            return f"no tax at ref_safe ({detail})"
        return None

    def where(self) -> dict[str, Any]:
        return {"phase": K.PHASE_A, "reference": "ref_safe", "rate": self.safe.get("rate"), "cell": self.safe.get("cell")}


def _h1(ctx: _Ctx) -> dict[str, Any]:
    title = "H1: substrate tax persists at single instance (mooncake_both TTFT p90 tax >= 10%)"
    why = ctx.need(K.MOONCAKE_BOTH)
    if why:
        return _na("H1", title, why)
    est = ctx.tax(K.MOONCAKE_BOTH)
    ci, t = _ci(est), K.H1_MIN_TAX
    if ci is None:
        verdict, reason = "inconclusive", f"tax {_pct(est['value'])}, no confidence interval (too few samples for a p90 CI)"
    elif ci[0] >= t:
        verdict, reason = "supported", f"tax {_pct(est['value'])}, CI entirely >= {_pct(t)}"
    elif ci[1] < t:
        verdict, reason = "refuted", f"tax {_pct(est['value'])}, CI entirely < {_pct(t)}: trace-replay tax is coupling"
    else:
        verdict, reason = "inconclusive", f"tax {_pct(est['value'])}, CI [{_pct(ci[0])}, {_pct(ci[1])}] straddles {_pct(t)}"
    return {"id": "H1", "title": title, "verdict": verdict, "reason": reason, "where": ctx.where(),
            "numbers": {"tax_ttft_p90_mooncake_both": _tax_number(est)}, "thresholds": {"min_tax": t},
            "ci_overlaps_threshold": _overlaps(ci, t), "point_side": _side(est["value"], t)}  # fmt: skip


def _gap(ctx: _Ctx) -> dict[str, Any]:
    m, n = ctx.tax(K.MOONCAKE_BOTH), ctx.tax(K.NIXL_BOTH)
    return tax_combination([(100.0, m), (-100.0, n)])  # type: ignore[list-item]


def _h2(ctx: _Ctx) -> dict[str, Any]:
    title = "H2: NIXL-vs-Mooncake gap is mechanism-side (NIXL tax below Mooncake tax by 5-10 pp)"
    why = ctx.need(K.MOONCAKE_BOTH, K.NIXL_BOTH)
    if why:
        return _na("H2", title, why)
    gap = _gap(ctx)
    ci, (lo, hi) = _ci(gap), K.H2_GAP_PP
    v = gap["value"]
    if ci is None:
        verdict, reason = "inconclusive", "no confidence interval"
    elif lo <= ci[0] and ci[1] <= hi:
        verdict, reason = "supported", f"gap {v:+.1f} pp, CI within [{lo:g}, {hi:g}] pp"
    elif ci[1] < lo:
        verdict = "refuted"
        reason = f"gap {v:+.1f} pp, CI below {lo:g} pp: the gap " + ("inverts" if ci[1] < 0 else "shrinks")
    elif ci[0] > hi:
        verdict, reason = "refuted", f"gap {v:+.1f} pp, CI above {hi:g} pp: wider than the trace-replay ~7 pp"
    else:
        verdict, reason = "inconclusive", f"gap {v:+.1f} pp, CI [{ci[0]:+.1f}, {ci[1]:+.1f}] pp overlaps a band edge"
    return {"id": "H2", "title": title, "verdict": verdict, "reason": reason, "where": ctx.where(),
            "numbers": {"gap_pp": {"value": v, "ci": ci},
                        "tax_ttft_p90_mooncake_both": _tax_number(ctx.tax(K.MOONCAKE_BOTH)),  # type: ignore[arg-type]
                        "tax_ttft_p90_nixl_both": _tax_number(ctx.tax(K.NIXL_BOTH))},  # type: ignore[arg-type]
            "thresholds": {"gap_pp_band": [lo, hi], "prior_gap_pp": 7.0},
            "ci_overlaps_threshold": _overlaps(ci, lo, hi),
            "point_side": "inside" if v is not None and lo <= v <= hi else "outside"}  # fmt: skip


def _share(ctx: _Ctx, metric: str = "ttft_p90") -> dict[str, Any]:
    """noop tax / mooncake_both tax, with an interval when the denominator is clearly > 0."""
    noop, mb = ctx.tax(K.NOOP, metric), ctx.tax(K.MOONCAKE_BOTH, metric)
    if noop is None or mb is None:
        return {"value": None, "ci": None, "note": "missing tax"}
    value = noop["value"] / mb["value"] if mb["value"] else None
    ci = None
    note = None
    if _ci(noop) and _ci(mb):
        ci = _div_interval(_ci(noop), _ci(mb))  # type: ignore[arg-type]
        if ci is None:
            note = "mooncake_both tax CI reaches 0: the share is unbounded"
    return {"value": value, "ci": ci, "note": note}


def _step_share(ctx: _Ctx) -> dict[str, Any] | None:
    conf = ctx.safe.get("configs") or {}
    noop = (conf.get(K.NOOP) or {}).get("step_p50_us")
    mb = (conf.get(K.MOONCAKE_BOTH) or {}).get("step_p50_us")
    if not noop or not mb or noop.get("value") is None or not mb.get("value"):
        return None
    ci = _div_interval(_ci(noop), _ci(mb)) if _ci(noop) and _ci(mb) else None  # type: ignore[arg-type]
    return {"value": noop["value"] / mb["value"], "ci": ci, "noop_step_tax_us": noop.get("value"),
            "mooncake_both_step_tax_us": mb.get("value")}  # fmt: skip


def _h3(ctx: _Ctx) -> dict[str, Any]:
    title = "H3: framework-vs-implementation split (noop_connector tax < 50% of mooncake_both tax)"
    why = ctx.need(K.NOOP, K.MOONCAKE_BOTH)
    if why:
        return _na("H3", title, why)
    share = _share(ctx)
    ci, t = share["ci"], K.H3_FRAMEWORK_SHARE
    if share["value"] is None or ci is None:
        verdict, reason = "inconclusive", share.get("note") or "no confidence interval for the share"
    elif ci[1] < t:
        verdict, reason = "supported", f"noop share {share['value']:.2f}, CI entirely < {t:g}"
    elif ci[0] >= t:
        verdict, reason = "refuted", f"noop share {share['value']:.2f}, CI entirely >= {t:g}"
    else:
        verdict, reason = "inconclusive", f"noop share {share['value']:.2f}, CI [{ci[0]:.2f}, {ci[1]:.2f}] straddles {t:g}"
    numbers = {"noop_share": share, "tax_ttft_p90_noop_connector": _tax_number(ctx.tax(K.NOOP)),  # type: ignore[arg-type]
               "tax_ttft_p90_mooncake_both": _tax_number(ctx.tax(K.MOONCAKE_BOTH))}  # type: ignore[arg-type]
    step = _step_share(ctx)
    if step:
        numbers["noop_share_step_p50"] = step
    return {"id": "H3", "title": title, "verdict": verdict, "reason": reason, "where": ctx.where(),
            "numbers": numbers, "thresholds": {"share_max": t},
            "ci_overlaps_threshold": _overlaps(ci, t), "point_side": _side(share["value"], t)}  # fmt: skip


def _additivity(ctx: _Ctx, metric: str = "ttft_p90") -> dict[str, Any]:
    mb, lmc, multi = ctx.tax(K.MOONCAKE_BOTH, metric), ctx.tax(K.LMCACHE_ONLY, metric), ctx.tax(K.MULTI, metric)
    if mb is None or lmc is None or multi is None:
        return {"rel_dev": {"value": None, "ci": None}}
    total = tax_combination([(1.0, mb), (1.0, lmc)])
    dev = tax_combination([(1.0, multi), (-1.0, mb), (-1.0, lmc)])
    rel = {"value": dev["value"] / multi["value"] if multi["value"] else None, "ci": None}
    if _ci(dev) and _ci(multi):
        rel["ci"] = _div_interval(_ci(dev), _ci(multi))  # type: ignore[arg-type]
        if rel["ci"] is None:
            rel["note"] = "multi tax CI reaches 0: the relative deviation is unbounded"
    return {"sum": total, "deviation": dev, "rel_dev": rel, "multi": _tax_number(multi),
            "mooncake_both": _tax_number(mb), "lmcache_only": _tax_number(lmc)}  # fmt: skip


def _h4(ctx: _Ctx) -> dict[str, Any]:
    title = "H4: MultiConnector tax is additive (|multi - (mooncake + lmcache)| / multi <= 0.30)"
    why = ctx.need(K.MOONCAKE_BOTH, K.LMCACHE_ONLY, K.MULTI)
    if why:
        return _na("H4", title, why)
    add = _additivity(ctx)
    rel, t = add["rel_dev"], K.H4_MAX_REL_DEV
    ci = rel["ci"]
    v = rel["value"]
    if v is None or ci is None:
        verdict, reason = "inconclusive", rel.get("note") or "no confidence interval"
    elif -t <= ci[0] and ci[1] <= t:
        verdict, reason = "supported", f"relative deviation {v:+.2f}, CI within +-{t:g}: additive"
    elif ci[0] > t:
        verdict, reason = "refuted", f"relative deviation {v:+.2f}, CI above +{t:g}: super-additive (interference)"
    elif ci[1] < -t:
        verdict, reason = "refuted", f"relative deviation {v:+.2f}, CI below -{t:g}: sub-additive (shared cost amortized)"
    else:
        verdict, reason = "inconclusive", f"relative deviation {v:+.2f}, CI [{ci[0]:+.2f}, {ci[1]:+.2f}] crosses +-{t:g}"
    numbers = dict(add)
    tpot = _additivity(ctx, "tpot_p90")
    numbers["tpot_p90_rel_dev"] = tpot["rel_dev"]
    return {"id": "H4", "title": title, "verdict": verdict, "reason": reason, "where": ctx.where(),
            "numbers": numbers, "thresholds": {"max_rel_dev": t},
            "ci_overlaps_threshold": _overlaps(ci, -t, t),
            "point_side": None if v is None else ("inside" if abs(v) <= t else "outside")}  # fmt: skip


def _trend(ctx: _Ctx, config: str, metric: str, along: str) -> dict[str, Any]:
    """Steps of the tax along `along` ("input" / "output") per fixed other dimension."""
    cells = ((ctx.taxes.get(K.PHASE_B) or {}).get("cells") or {})
    across = "output" if along == "input" else "input"
    groups: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for cell in cells.values():
        est = ((cell.get("configs") or {}).get(config) or {}).get(metric)
        if cell.get(along) is None or cell.get(across) is None or not est or est.get("value") is None:
            continue
        groups.setdefault(int(cell[across]), []).append((int(cell[along]), est))
    series = []
    for fixed, pts in sorted(groups.items()):
        pts.sort(key=lambda p: p[0])
        if len(pts) < 2:
            continue
        steps = []
        for (a, ea), (b, eb) in zip(pts, pts[1:]):
            d = combine([(100.0, eb), (-100.0, ea)])
            steps.append({"from": a, "to": b, "delta_pp": d["value"], "ci": _ci(d)})
        total = combine([(100.0, pts[-1][1]), (-100.0, pts[0][1])])
        series.append({across: fixed, "points": [{along: x, "tax": e["value"], "ci": _ci(e)} for x, e in pts],
                       "steps": steps, "total_pp": total["value"], "total_ci": _ci(total),
                       "sign": None if total["value"] is None else ("+" if total["value"] > 0 else "-" if total["value"] < 0 else "0")})  # fmt: skip
    return {"config": config, "metric": metric, "along": along, "series": series}


def _monotone(hid: str, title: str, ctx: _Ctx, metric: str, along: str) -> dict[str, Any]:
    if ctx.baseline != K.PLAIN or K.MOONCAKE_BOTH not in ctx.configs:
        return _na(hid, title, ctx.need(K.MOONCAKE_BOTH) or "mooncake_both not in the study")
    trend = _trend(ctx, K.MOONCAKE_BOTH, metric, along)
    if not trend["series"]:
        return _na(hid, title, f"no Phase B cells with >= 2 {along} lengths for mooncake_both and plain")
    steps = [s for ser in trend["series"] for s in ser["steps"]]
    if any(s["ci"] is None for s in steps):
        verdict, reason = "inconclusive", "a step has no confidence interval"
    elif all(s["ci"][0] > 0 for s in steps):
        verdict, reason = "supported", f"every step up in {along} raises the tax (all step CIs > 0)"
    elif any(s["ci"][1] < 0 for s in steps) or all(ser["total_ci"] and ser["total_ci"][1] <= 0 for ser in trend["series"]):
        verdict, reason = "refuted", f"the tax falls significantly along {along} somewhere (a step CI < 0) or never grows"
    else:
        verdict, reason = "inconclusive", "some step CIs include 0"
    overlaps = any(s["ci"] is None or s["ci"][0] <= 0 <= s["ci"][1] for s in steps)
    others = {}
    for name in ctx.configs:
        if name not in (K.PLAIN, K.MOONCAKE_BOTH):
            t = _trend(ctx, name, metric, along)
            if t["series"]:
                others[name] = [{"fixed": s, "total_pp": s["total_pp"], "total_ci": s["total_ci"]} for s in t["series"]]
    return {"id": hid, "title": title, "verdict": verdict, "reason": reason,
            "where": {"phase": K.PHASE_B, "rates": (ctx.taxes.get(K.PHASE_B) or {}).get("rates")},
            "numbers": {"mooncake_both": trend, "other_configs_total_pp": others},
            "thresholds": {"step_delta_pp": 0.0}, "ci_overlaps_threshold": overlaps,
            "point_side": "growing" if all((s["delta_pp"] or 0) > 0 for s in steps) else "not monotone"}  # fmt: skip


# --------------------------------------------------------------------------- success criteria


def _sc(cid: str, title: str, status: str, outcome: str | None, reason: str, numbers: dict | None = None,
        overlaps: bool | None = None) -> dict[str, Any]:  # fmt: skip
    return {"id": cid, "title": title, "status": status, "outcome": outcome, "reason": reason,
            "numbers": numbers or {}, "ci_overlaps_threshold": overlaps}  # fmt: skip


def _band(ci: list[float] | None, regions: list[tuple[str, float, float]]) -> str | None:
    """The one region that holds the whole interval, or None."""
    if ci is None:
        return None
    for name, lo, hi in regions:
        if lo <= ci[0] and ci[1] < hi:
            return name
    return None


def success_criteria(ctx: _Ctx, hyps: dict[str, dict[str, Any]], artifacts: dict[str, Any],
                     runtime: dict[str, Any], simulated: bool) -> list[dict[str, Any]]:  # fmt: skip
    out = []
    # 1
    title = "1. H1 falsifiable: mooncake_both tax_TTFT_p90 at ref_safe reported; prior accepted if in [25%, 60%]"
    if hyps["H1"]["verdict"] == "not_applicable":
        out.append(_sc("SC1", title, "not_applicable", None, hyps["H1"]["reason"]))
    else:
        est = ctx.tax(K.MOONCAKE_BOTH)
        lo, hi = K.SC1_ACCEPT
        ci = _ci(est)
        region = _band(ci, [("revise prior (below)", float("-inf"), lo), ("accept prior", lo, hi + 1e-12),
                            ("revise prior (above)", hi + 1e-12, float("inf"))])  # fmt: skip
        status = "met" if region else "inconclusive"
        out.append(_sc("SC1", title, status, region or "inconclusive",
                       f"tax {_pct(est['value'])} (prior {_pct(K.PRIOR_TAX)}), CI "  # type: ignore[index]
                       + (f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "n/a"),
                       {"tax_ttft_p90_mooncake_both": _tax_number(est), "accept_band": [lo, hi]},  # type: ignore[arg-type]
                       _overlaps(ci, lo, hi)))  # fmt: skip
    # 2
    title = "2. H2 testable: NIXL-vs-Mooncake gap at ref_safe reported and compared with ~7 pp"
    h2 = hyps["H2"]
    if h2["verdict"] == "not_applicable":
        out.append(_sc("SC2", title, "not_applicable", None, h2["reason"]))
    else:
        outcome = {"supported": "agrees with trace replay", "refuted": "disagrees with trace replay"}.get(h2["verdict"], "inconclusive")
        out.append(_sc("SC2", title, "met" if h2["verdict"] != "inconclusive" else "inconclusive", outcome,
                       h2["reason"], h2["numbers"], h2["ci_overlaps_threshold"]))  # fmt: skip
    # 3
    title = "3. H3 disambiguated: framework-dominated if noop >= 50% of mooncake_both tax, implementation-dominated if < 30%"
    if hyps["H3"]["verdict"] == "not_applicable":
        out.append(_sc("SC3", title, "not_applicable", None, hyps["H3"]["reason"]))
    else:
        share = hyps["H3"]["numbers"]["noop_share"]
        a, b = K.H3_IMPLEMENTATION_SHARE, K.H3_FRAMEWORK_SHARE
        region = _band(share.get("ci"), [("implementation-cost-dominated", float("-inf"), a),
                                          ("neither (30-50%)", a, b), ("framework-cost-dominated", b, float("inf"))])  # fmt: skip
        v = share.get("value")
        out.append(_sc("SC3", title, "met" if region else "inconclusive", region or "inconclusive",
                       f"noop share {'n/a' if v is None else f'{v:.2f}'}"
                       + (f", CI [{share['ci'][0]:.2f}, {share['ci'][1]:.2f}]" if share.get("ci") else ", no CI"),
                       {"noop_share": share}, _overlaps(share.get("ci"), a, b)))  # fmt: skip
    # 4
    title = "4. H4 additivity: |multi - (mooncake_both + lmcache_only)| / multi <= 0.30 -> linear"
    h4 = hyps["H4"]
    if h4["verdict"] == "not_applicable":
        out.append(_sc("SC4", title, "not_applicable", None, h4["reason"]))
    else:
        outcome = "linear" if h4["verdict"] == "supported" else (
            "super-additive" if "super" in h4["reason"] else "sub-additive") if h4["verdict"] == "refuted" else "inconclusive"
        out.append(_sc("SC4", title, "met" if h4["verdict"] != "inconclusive" else "inconclusive", outcome,
                       h4["reason"], {"rel_dev": h4["numbers"]["rel_dev"]}, h4["ci_overlaps_threshold"]))  # fmt: skip
    # 5
    title = "5. H5 + H6 directional: sign and magnitude of tax growth with input (TTFT) and output (TPOT)"
    h5, h6 = hyps["H5"], hyps["H6"]
    if h5["verdict"] == "not_applicable" and h6["verdict"] == "not_applicable":
        out.append(_sc("SC5", title, "not_applicable", None, f"H5: {h5['reason']}; H6: {h6['reason']}"))
    else:
        def summary(h: dict[str, Any], key: str) -> list[dict[str, Any]]:
            ser = ((h.get("numbers") or {}).get(K.MOONCAKE_BOTH) or {}).get("series") or []
            return [{key: s.get(key), "sign": s["sign"], "total_pp": s["total_pp"], "ci": s["total_ci"]} for s in ser]
        nums = {"ttft_tax_vs_input": summary(h5, "output"), "tpot_tax_vs_output": summary(h6, "input")}
        met = bool(nums["ttft_tax_vs_input"]) and bool(nums["tpot_tax_vs_output"])
        out.append(_sc("SC5", title, "met" if met else "not_met", f"H5 {h5['verdict']}, H6 {h6['verdict']}",
                       "reported" if met else "one direction could not be computed", nums))  # fmt: skip
    # 6
    title = "6. All artifacts present: every config that ran has its file types; every SKIP has a reason"
    missing = artifacts.get("missing") or []
    out.append(_sc("SC6", title, "met" if artifacts.get("ok") else "not_met", None,
                   "all present" if artifacts.get("ok") else f"{len(missing)} problem(s): " + "; ".join(missing[:5]),
                   artifacts))  # fmt: skip
    # 7
    title = f"7. Bench finishes < {K.SC7_MAX_HOURS:g} h wall clock"
    hours = runtime.get("wall_hours")
    if hours is None:
        out.append(_sc("SC7", title, "inconclusive", None, "no run.json with start and finish times", runtime))
    else:
        note = " (simulated backend: the 6 h budget is for the real H20 study)" if simulated else ""
        out.append(_sc("SC7", title, "met" if hours < K.SC7_MAX_HOURS else "not_met", None,
                       f"{hours:.2f} h from first phase start to last phase finish{note}", runtime))  # fmt: skip
    return out


def check_artifacts(study: Any) -> dict[str, Any]:
    """SC6: per launch: its run.json index and env.txt; every planned cell complete (its sealed
    summary vouches for requests, metrics and engine-step files); every non-ok preflight entry and
    every cell not analysed has a reason."""
    missing: list[str] = []
    checked = 0
    for name in study.configs:
        pf = study.preflight.get(name)
        if pf is None and study.preflight:
            missing.append(f"{name}: not in preflight_status.json")
        elif pf is not None and pf.get("status") != "ok" and not pf.get("reason"):
            missing.append(f"{name}: preflight {pf.get('status')} without a reason")
        if pf is not None and pf.get("status") != "ok":
            continue
        for phase in K.PHASES:
            run = study.run_of(name, phase)
            if run is None or (run.run is None and not run.problems):
                continue
            if run.status == "skipped":
                if not run.reason:
                    missing.append(f"{name}/{phase}: skipped without a reason")
                continue
            if run.run is None:
                missing.append(f"{name}/{phase}: run.json")
            elif phase != K.PHASE_B_PRIME and not (run.folder / "env.txt").is_file():
                missing.append(f"{name}/{phase}: env.txt")
            checked += len(run.cells) + len(run.problems)
            missing += [f"{name}/{phase}/{label}: {why}" for label, why in run.problems.items()]
    return {"ok": not missing, "missing": missing, "cells_checked": checked,
            "file_types": ["run.json", "env.txt", "requests_*.jsonl", "summary_*.json", "metrics_*.jsonl",
                           "engine_step_*.jsonl"]}  # fmt: skip


def runtime_of(study: Any) -> dict[str, Any]:
    starts, ends = [], []
    for run in study.runs.values():
        r = run.run or {}
        for key, bucket in (("started", starts), ("finished", ends)):
            try:
                if r.get(key):
                    bucket.append(_dt.datetime.fromisoformat(str(r[key]).replace("Z", "+00:00")))
            except ValueError:
                pass
    if not starts or not ends:
        return {"wall_hours": None}
    span = (max(ends) - min(starts)).total_seconds()
    return {"wall_hours": span / 3600.0, "first_start": min(starts).isoformat(), "last_finish": max(ends).isoformat(),
            "scope": "phase runs (run.json started/finished); preflight and analysis not included"}  # fmt: skip


def evaluate(taxes: dict[str, Any], reference: dict[str, Any], configs: list[str], baseline: str | None,
             artifacts: dict[str, Any], runtime: dict[str, Any], simulated: bool) -> dict[str, Any]:  # fmt: skip
    ctx = _Ctx(taxes, reference, configs, baseline)
    hyps = {
        "H1": _h1(ctx), "H2": _h2(ctx), "H3": _h3(ctx), "H4": _h4(ctx),
        "H5": _monotone("H5", "H5: tax is shape-dependent (mooncake_both tax_TTFT_p90 grows monotonically with input)",
                        ctx, "ttft_p90", "input"),
        "H6": _monotone("H6", "H6: tax compounds in decode (mooncake_both tax_TPOT_p90 grows with output)",
                        ctx, "tpot_p90", "output"),
    }  # fmt: skip
    for h in hyps.values():
        h.setdefault("caveats", [])
        if h["verdict"] != "not_applicable":
            h["caveats"] = list(ctx.caveats)
            nums = h.get("numbers") or {}
            for key, val in nums.items():
                if isinstance(val, dict) and False in (val.get("cells_valid") or []):
                    h["caveats"].append(f"{key}: rests on a cell the load generator marked invalid")
    return {
        "schema_version": 1,
        "simulated": simulated,
        "baseline": baseline,
        "reference": {k: reference.get(k) for k in ("ref_safe", "ref_load", "ref_safe_flagged", "ref_load_flagged",
                                                    "ref_safe_reason", "ref_load_reason")},
        "ci_method": taxes.get("ci_method") if taxes else None,
        "verdict_rule": "a verdict needs the whole 95% interval on one side of the threshold; otherwise inconclusive",
        "hypotheses": list(hyps.values()),
        "success_criteria": success_criteria(ctx, hyps, artifacts, runtime, simulated),
    }  # fmt: skip
