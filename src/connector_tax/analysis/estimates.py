"""The numbers the hypotheses rest on, each an estimate with its 95% interval, from the taxes.

Every function takes the taxes document (taxes.compute_taxes) and returns
{"value", "ci", ...detail} or None when a configuration it needs has no tax; a ratio of taxes
(H3's share, H4's relative deviation) also says, under "unresolved", when its denominator's
tax is one these cells cannot tell from 0 (`unresolved`). Nothing here decides anything
(hypotheses.py does, from the rule table).
"""

from __future__ import annotations

import math
from typing import Any

from connector_tax.analysis import constants as K
from connector_tax.analysis.quantiles import Z95, combine, tax_combination
from connector_tax.config import PHASE_B
from connector_tax.contract.estimate import RELATIVE, Estimate


def ci_of(est: dict[str, Any] | None) -> list[float] | None:
    """The estimate's 95% interval, or None where it has none (contract.estimate reads it)."""
    interval = Estimate.of(est, RELATIVE).interval
    return list(interval) if interval else None


def div_interval(num: list[float], den: list[float]) -> list[float] | None:
    """num / den for intervals (the box's image: it holds the ratio whenever both intervals hold
    their values, whatever their correlation); None when den reaches 0, where the ratio is
    unbounded."""
    if den[0] <= 0 <= den[1]:
        return None
    vals = [num[0] / den[0], num[0] / den[1], num[1] / den[0], num[1] / den[1]]
    return [min(vals), max(vals)]


def share_interval(num: dict[str, Any], den: dict[str, Any]) -> list[float] | None:
    """The 95% interval of num / den for two taxes over ONE baseline (H3's share): Fieller's
    confidence set, each tax's standard error from its interval (half-width / z, as `combine`
    takes them), holding for every correlation rho >= 0 between the two. rho is never negative
    here: both taxes divide by the same baseline p90 and, on common random numbers, ride the same
    traffic; the taxes do not carry its size. (a - t b) has variance sa^2 - 2 t rho sa sb +
    t^2 sb^2, largest at rho = 0 for t >= 0 and at rho = 1 for t < 0, so the set is Fieller's
    with rho = 0 above 0 (where H3's threshold lies) and the rho = 1 set
    [(a - z sa) / (b - z sb), (a + z sa) / (b + z sb)] below 0. The box (`div_interval`) holds
    whatever the correlation, negative included, and so pays twice for the denominator's error:
    it divides by the end of its interval, not by the tax. None when either tax has no interval;
    the box's when the denominator is not clear of 0 at z standard errors (`unresolved` decides
    that case from the interval itself)."""
    num_ci, den_ci = ci_of(num), ci_of(den)
    if num_ci is None or den_ci is None:
        return None
    a, b = float(num["value"]), float(den["value"])
    if b < 0:  # a / b = (-a) / (-b), and negating both keeps rho
        a, b = -a, -b
    z = Z95
    sa, sb = (num_ci[1] - num_ci[0]) / (2 * z), (den_ci[1] - den_ci[0]) / (2 * z)
    curv = b * b - (z * sb) ** 2
    if curv <= 0:
        return div_interval(num_ci, den_ci)
    # rho = 0: (a - t b)^2 <= z^2 (sa^2 + t^2 sb^2), a quadratic in t opening upwards (curv > 0)
    # whose discriminant 4 z^2 (a^2 sb^2 + sa^2 curv) is positive, so two roots around a / b.
    root = math.sqrt(4 * z * z * (a * a * sb * sb + sa * sa * curv))
    lo0, hi0 = (2 * a * b - root) / (2 * curv), (2 * a * b + root) / (2 * curv)
    parts = [(max(lo0, 0.0), hi0)] if hi0 >= 0 else []
    lo1, hi1 = (a - z * sa) / (b - z * sb), (a + z * sa) / (b + z * sb)
    if lo1 < 0:  # then a / b < sa / sb, so lo1 <= hi1; at 0 both sets agree (|a| <= z sa)
        parts.append((lo1, min(hi1, 0.0)))
    return [min(p[0] for p in parts), max(p[1] for p in parts)]


def unresolved(den: dict[str, Any], name: str) -> dict[str, Any] | None:
    """Why a ratio over the tax `den` (of configuration `name`) cannot be estimated, or None when
    it can: the tax's 95% interval covers 0, so these cells cannot tell it from 0. A ratio over
    a tax that may be 0 has no interval (any bound of its interval is infinite, by interval
    arithmetic and by Fieller's theorem alike) and its point estimate's side of a threshold is
    noise: the hypothesis gets no call. `half_width` is the resolution: the smallest tax these
    cells tell from 0. A tax with no interval at all (cells too short to bound a p90) says
    nothing either way: the ratio is then a point without an interval, like the tax itself."""
    ci = ci_of(den)
    if ci is None or not ci[0] <= 0 <= ci[1]:
        return None
    return {
        "denominator": name,
        "value": den.get("value"),
        "ci": ci,
        "half_width": (ci[1] - ci[0]) / 2,
        "why": "its 95% interval covers 0",
    }


def tax_number(est: dict[str, Any]) -> dict[str, Any]:
    return {
        "value": est.get("value"),
        "ci": ci_of(est),
        "x_p90": est.get("x_p90"),
        "base_p90": est.get("base_p90"),
        "x_n": est.get("x_n"),
        "base_n": est.get("base_n"),
        "cells_valid": [est.get("x_valid"), est.get("base_valid")],
    }


class Taxes:
    """The taxes at ref_safe (Phase A) and along Phase B, read by configuration and metric."""

    def __init__(self, taxes: dict[str, Any] | None) -> None:
        self.doc = taxes or {}
        self.safe = (self.doc.get("phase_a") or {}).get("ref_safe") or {}

    def at_safe(self, config: str, metric: str = "ttft_p90") -> dict[str, Any] | None:
        est = ((self.safe.get("variants") or {}).get(config) or {}).get(metric)
        return est if est and est.get("value") is not None else None

    def missing_reason(self, config: str) -> str:
        return str((self.safe.get("missing") or {}).get(config, "no TTFT p90 tax at ref_safe"))

    def phase_b_cells(self) -> dict[str, Any]:
        return (self.doc.get(PHASE_B) or {}).get("cells") or {}


def h1_tax(t: Taxes) -> dict[str, Any] | None:
    est = t.at_safe(K.MOONCAKE_BOTH)
    return None if est is None else {**tax_number(est), "numbers": {"tax_ttft_p90_mooncake_both": tax_number(est)}}


def h2_gap_pp(t: Taxes) -> dict[str, Any] | None:
    m, n = t.at_safe(K.MOONCAKE_BOTH), t.at_safe(K.NIXL_BOTH)
    if m is None or n is None:
        return None
    gap = tax_combination([(100.0, m), (-100.0, n)])
    return {
        "value": gap["value"],
        "ci": ci_of(gap),
        "numbers": {
            "gap_pp": {"value": gap["value"], "ci": ci_of(gap)},
            "tax_ttft_p90_mooncake_both": tax_number(m),
            "tax_ttft_p90_nixl_both": tax_number(n),
        },
    }


def h3_share(t: Taxes, metric: str = "ttft_p90") -> dict[str, Any] | None:
    noop, mb = t.at_safe(K.NOOP, metric), t.at_safe(K.MOONCAKE_BOTH, metric)
    if noop is None or mb is None or not mb["value"]:
        return None
    ci, note = None, None
    den = unresolved(mb, K.MOONCAKE_BOTH)
    if den is not None:
        note = f"mooncake_both's tax is not resolved ({den['why']}): the share is unbounded"
    else:
        ci = share_interval(noop, mb)
    value = noop["value"] / mb["value"]
    share = {"value": value, "ci": ci, "note": note}
    return {
        "value": value,
        "ci": ci,
        "note": note,
        "unresolved": den,
        "numbers": {
            "noop_share": share,
            "tax_ttft_p90_noop_connector": tax_number(noop),
            "tax_ttft_p90_mooncake_both": tax_number(mb),
        },
    }


def h4_rel_dev(t: Taxes, metric: str = "ttft_p90") -> dict[str, Any] | None:
    """(multi - (mooncake + lmcache)) / multi, i.e. 1 - sum / multi. Its interval is the box image
    of the sum's and multi's intervals through 1 - sum / multi: it holds whenever both hold
    (div_interval), as the deviation-over-multi box did, but the deviation contains multi, so
    dividing it by multi counted multi's uncertainty twice (seed 4 of the real-clock default
    study: [+0.24, +1.35] against [+0.42, +0.78] from the same cells; docs/simulator.md)."""
    mb, lmc, multi = t.at_safe(K.MOONCAKE_BOTH, metric), t.at_safe(K.LMCACHE_ONLY, metric), t.at_safe(K.MULTI, metric)
    if mb is None or lmc is None or multi is None or not multi["value"]:
        return None
    total = tax_combination([(1.0, mb), (1.0, lmc)])
    dev = tax_combination([(1.0, multi), (-1.0, mb), (-1.0, lmc)])
    ci, note = None, None
    den = unresolved(multi, K.MULTI)
    if den is not None:
        note = f"{K.MULTI}'s tax is not resolved ({den['why']}): the relative deviation is unbounded"
    elif (num := ci_of(total)) is not None and (over := ci_of(multi)) is not None:
        share = div_interval(num, over)
        ci = None if share is None else [1.0 - share[1], 1.0 - share[0]]
    value = dev["value"] / multi["value"]
    return {
        "value": value,
        "ci": ci,
        "note": note,
        "unresolved": den,
        "numbers": {
            "rel_dev": {"value": value, "ci": ci, "note": note},
            "sum": total,
            "deviation": dev,
            "multi": tax_number(multi),
            "mooncake_both": tax_number(mb),
            "lmcache_only": tax_number(lmc),
        },
    }


def trend(t: Taxes, config: str, metric: str, along: str) -> dict[str, Any]:
    """Steps of `config`'s tax along `along` ("input" / "output"), per fixed other dimension;
    shapes where `config` or the baseline was saturated are left out (listed in `excluded`)."""
    across = "output" if along == "input" else "input"
    groups: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    excluded = []
    baseline = t.doc.get("baseline")
    for label, cell in t.phase_b_cells().items():
        est = ((cell.get("variants") or {}).get(config) or {}).get(metric)
        if cell.get(along) is None or cell.get(across) is None or not est or est.get("value") is None:
            continue
        hit = {n: why for n, why in (cell.get("saturated") or {}).items() if n in (config, baseline)}
        if hit:
            excluded.append({"shape": label, "saturated": hit})
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
            steps.append({"from": a, "to": b, "delta_pp": d["value"], "ci": ci_of(d)})
        total = combine([(100.0, pts[-1][1]), (-100.0, pts[0][1])])
        sign = None if total["value"] is None else ("+" if total["value"] > 0 else "-" if total["value"] < 0 else "0")
        series.append(
            {
                across: fixed,
                "points": [{along: x, "tax": e["value"], "ci": ci_of(e)} for x, e in pts],
                "steps": steps,
                "total_pp": total["value"],
                "total_ci": ci_of(total),
                "sign": sign,
            }
        )
    return {"variant": config, "metric": metric, "along": along, "series": series, "excluded": excluded}


def monotone_steps(t: Taxes, metric: str, along: str) -> dict[str, Any] | None:
    """mooncake_both's tax steps along one dimension (H5: TTFT along input; H6: TPOT along output):
    the value is the smallest step (pp) and its interval the smallest step interval's."""
    tr = trend(t, K.MOONCAKE_BOTH, metric, along)
    steps = [s for ser in tr["series"] for s in ser["steps"] if s["delta_pp"] is not None]
    if not steps:
        return None
    low = min(steps, key=lambda s: s["delta_pp"])
    cis = [s["ci"] for s in steps]
    ci = [min(c[0] for c in cis), min(c[1] for c in cis)] if all(cis) else None
    return {"value": low["delta_pp"], "ci": ci, "numbers": {K.MOONCAKE_BOTH: tr}, "steps": len(steps)}
