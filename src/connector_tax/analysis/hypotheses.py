"""Verdicts on H1–H6 and success criteria 1–7: rules as data, judged by one function.

Each hypothesis is a `Rule`: the configurations it needs, the estimate it rests on
(estimates.py: a number and its 95% interval), the study's comparison with its threshold, and
the words for each outcome. `judge` makes the study's call on the POINT estimate — supported
or refuted — and reports, beside it, what the interval says: `confidence` is "confident" when
the whole interval lies on the call's side of every threshold and "within noise" when it
reaches across one (`ci_overlaps_threshold`). A call resting on a cell the validity gate marked
invalid (measured while the host was busy or the load generator late), or on a ref_safe chosen
with such cells, is "rests on perturbed cells" whatever its interval says (contention.py).
"inconclusive" is for a number that does not exist: one that could not be computed at all, or a
ratio (H3's share, H4's relative deviation) whose denominator is a tax these cells cannot tell
from 0 (its interval covers 0: confidence "below resolution", `resolution` the denominator with
its interval). Such a ratio has no interval — any bound is infinite — and the side of the
threshold its point estimate falls on is noise, so no call is made. A number with an interval
that merely straddles the threshold keeps the study's call ("within noise").
"not_applicable" when a configuration the rule needs did not run, or the study is not the
connector study. Success criteria 1–5 read the hypotheses' numbers; 6 and 7 the study's
artifacts and run time (artifacts.py). `compare_calls` says how two studies' calls on one
hypothesis relate (the plan side by side uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connector_tax.analysis import constants as K
from connector_tax.analysis import contention
from connector_tax.analysis.criteria import success_criteria
from connector_tax.analysis.estimates import Taxes, h1_tax, h2_gap_pp, h3_share, h4_rel_dev, monotone_steps
from connector_tax.config import PHASE_A, PHASE_B

BELOW_RESOLUTION = "below resolution"
CALLED = ("supported", "refuted")
VERDICT_RULE = (
    "the call is made on the point estimate (supported / refuted); `confidence` says whether the 95% "
    "interval agrees (confident) or reaches across the threshold (within noise), and is "
    f"'{contention.PERTURBED}' when a cell behind the number, or behind the choice of ref_safe, was "
    "measured while the host or the load generator perturbed it (never confident then). "
    "No call (inconclusive) when the number cannot be computed, or is a ratio of a tax these cells "
    f"cannot tell from 0 ('{BELOW_RESOLUTION}': the tax's interval covers 0, so the "
    "ratio has no interval and its point's side of the threshold is noise)"
)


@dataclass(frozen=True)
class Test:
    """A comparison: `holds(x)` on a number, and the thresholds it compares with."""

    kind: str  # ge | lt | within | abs_le | gt
    lo: float
    hi: float | None = None

    def holds(self, x: float) -> bool:
        return {
            "ge": x >= self.lo,
            "lt": x < self.lo,
            "gt": x > self.lo,
            "within": self.lo <= x <= (self.hi or 0),
            "abs_le": abs(x) <= self.lo,
        }[self.kind]

    def thresholds(self) -> list[float]:
        if self.kind == "within":
            return [self.lo, self.hi or 0]
        return [-self.lo, self.lo] if self.kind == "abs_le" else [self.lo]

    def confident(self, ci: list[float] | None, call: bool) -> bool | None:
        """Does the whole interval agree with the call?"""
        if ci is None:
            return None
        return all(self.holds(x) == call for x in ci) and not any(ci[0] < t < ci[1] for t in self.thresholds())


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    needs: tuple[str, ...]
    estimate: Callable[[Taxes], dict[str, Any] | None]
    test: Test
    unit: str  # how the number reads: "%", "pp", "share", "rel"
    supported: str  # why, in the study's words
    refuted: Callable[[float], str]


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _show(x: float, unit: str) -> str:
    return {"%": _pct(x), "pp": f"{x:+.1f} pp", "share": f"{x:.2f}", "rel": f"{x:+.2f}"}[unit]


RULES = (
    Rule(
        "H1",
        "H1: substrate tax persists at single instance (mooncake_both TTFT p90 tax >= 10%)",
        (K.MOONCAKE_BOTH,),
        h1_tax,
        Test("ge", K.H1_MIN_TAX),
        "%",
        "the tax persists without 8-instance coupling",
        lambda v: "below 10%: the trace-replay tax is coupling",
    ),
    Rule(
        "H2",
        "H2: NIXL-vs-Mooncake gap is mechanism-side (NIXL tax below Mooncake tax by 5-10 pp)",
        (K.MOONCAKE_BOTH, K.NIXL_BOTH),
        h2_gap_pp,
        Test("within", *K.H2_GAP_PP),
        "pp",
        "the ~7 pp trace-replay gap is preserved",
        # The seed falsifies H2 when the gap shrinks or inverts without coupling (then coupling
        # made it). A gap that widens is not that: it exists without coupling, larger than the
        # trace replay's, so the ~7 pp is not preserved, but it is no coupling artifact either.
        lambda v: (
            f"the gap {'inverts' if v < 0 else 'shrinks'}: a coupling artifact"
            if v < K.H2_GAP_PP[0]
            else "the gap widens past 5-10 pp: mechanism-side, but larger than the trace replay's ~7 pp"
        ),
    ),
    Rule(
        "H3",
        "H3: framework-vs-implementation split (noop_connector tax < 50% of mooncake_both tax)",
        (K.NOOP, K.MOONCAKE_BOTH),
        h3_share,
        Test("lt", K.H3_FRAMEWORK_SHARE),
        "share",
        "most of the tax is the connector's own per-step work",
        lambda v: "vLLM's connector framework carries most of it",
    ),
    Rule(
        "H4",
        "H4: MultiConnector tax is additive (|multi - (mooncake + lmcache)| / multi <= 0.30)",
        (K.MOONCAKE_BOTH, K.LMCACHE_ONLY, K.MULTI),
        h4_rel_dev,
        Test("abs_le", K.H4_MAX_REL_DEV),
        "rel",
        "additive",
        lambda v: "super-additive (interference)" if v > 0 else "sub-additive (shared cost amortized)",
    ),
    Rule(
        "H5",
        "H5: tax is shape-dependent (mooncake_both tax_TTFT_p90 grows monotonically with input)",
        (K.MOONCAKE_BOTH,),
        lambda t: monotone_steps(t, "ttft_p90", "input"),
        Test("gt", 0.0),
        "pp",
        "every step up in input raises the TTFT tax",
        lambda v: "the TTFT tax does not grow at every step up in input",
    ),
    Rule(
        "H6",
        "H6: tax compounds in decode (mooncake_both tax_TPOT_p90 grows with output)",
        (K.MOONCAKE_BOTH,),
        lambda t: monotone_steps(t, "tpot_p90", "output"),
        Test("gt", 0.0),
        "pp",
        "every step up in output raises the TPOT tax",
        lambda v: "the TPOT tax does not grow at every step up in output",
    ),
)


def _na(rule: Rule, reason: str) -> dict[str, Any]:
    return {
        "id": rule.id,
        "title": rule.title,
        "verdict": "not_applicable",
        "reason": reason,
        "numbers": {},
        "confidence": None,
        "ci_overlaps_threshold": None,
    }


def _no_call(den: dict[str, Any]) -> str:
    """Why a ratio over an unresolved tax gets no call, with the tax and the cells' resolution."""
    tax = f"{den['denominator']}'s TTFT p90 tax" + (" (H1's number)" if den["denominator"] == K.MOONCAKE_BOTH else "")
    tax += "" if den.get("value") is None else f" is {_pct(den['value'])}"
    lo, hi = den["ci"]
    seen = (
        f"{tax}, CI [{_pct(lo)}, {_pct(hi)}], which covers 0: below what these cells resolve "
        f"(about ±{den['half_width'] * 100:.1f} pp)"
    )
    return f"no call: {seen}; a ratio of it has no interval and its point's side of the threshold is noise"


def judge(rule: Rule, taxes: Taxes, configs: list[str], baseline: str | None) -> dict[str, Any]:
    if baseline != K.PLAIN:
        return _na(rule, f"connector-specific: the study's baseline is {baseline!r}, not 'plain'")
    missing = [n for n in (K.PLAIN, *rule.needs) if n not in configs]
    if missing:
        return _na(rule, f"configs not in the study: {', '.join(missing)}")
    if rule.id in ("H5", "H6"):
        absent: list[str] = []
    else:
        absent = [n for n in rule.needs if taxes.at_safe(n) is None]
    if absent:
        return _na(rule, "no tax at ref_safe (" + "; ".join(f"{n}: {taxes.missing_reason(n)}" for n in absent) + ")")
    est = rule.estimate(taxes)
    out: dict[str, Any] = {
        "id": rule.id,
        "title": rule.title,
        "thresholds": {rule.test.kind: rule.test.thresholds()},
        "where": {
            "phase": PHASE_B if rule.id in ("H5", "H6") else PHASE_A,
            "rate": taxes.safe.get("rate"),
            "cell": taxes.safe.get("cell"),
        },
    }
    if est is None and rule.id in ("H5", "H6"):
        along = "input" if rule.id == "H5" else "output"
        return _na(rule, f"no Phase B cells with >= 2 {along} lengths for mooncake_both and plain")
    if est is None or est.get("value") is None:
        return {
            **out,
            "verdict": "inconclusive",
            "reason": "the number could not be computed from the cells measured",
            "numbers": {},
            "confidence": None,
            "ci_overlaps_threshold": None,
        }
    value, ci = est["value"], est.get("ci")
    if est.get("unresolved"):
        return {
            **out,
            "verdict": "inconclusive",
            "reason": f"{_show(value, rule.unit)}, no CI: {_no_call(est['unresolved'])} ({BELOW_RESOLUTION})",
            "value": value,
            "ci": None,
            "numbers": est.get("numbers") or {},
            "confidence": BELOW_RESOLUTION,
            "ci_overlaps_threshold": None,
            "resolution": est["unresolved"],
        }
    call = rule.test.holds(value)
    confident = rule.test.confident(ci, call)
    shown = _show(value, rule.unit) + (
        f", CI [{_show(ci[0], rule.unit)}, {_show(ci[1], rule.unit)}]" if ci else ", no CI"
    )
    why = rule.supported if call else rule.refuted(value)
    confidence = "confident" if confident else "within noise" if confident is False else "no interval"
    return {
        **out,
        "verdict": "supported" if call else "refuted",
        "reason": f"{shown}: {why} ({confidence})",
        "value": value,
        "ci": ci,
        "numbers": est.get("numbers") or {},
        "confidence": confidence,
        "ci_overlaps_threshold": None if ci is None else any(ci[0] <= t <= ci[1] for t in rule.test.thresholds()),
    }


def mark_perturbed(
    h: dict[str, Any],
    rule: Rule,
    taxes: dict[str, Any],
    baseline: str,
    rows: list[dict[str, Any]],
    reference: dict[str, Any],
) -> None:
    """A call resting on a cell measured while perturbed (or on a ref_safe such cells chose) is
    never "confident": `confidence` says what it rests on, `rests_on` lists the cells."""
    if h["verdict"] in ("not_applicable",):
        return
    rest = contention.rests_on(
        contention.cells_behind(rule.id, rule.needs, taxes, baseline), contention.perturbed_rows(rows), reference
    )
    h["rests_on_perturbed"] = rest
    if rest is None:
        return
    if h["verdict"] not in CALLED:  # no call to doubt: the reason stands, the cells are a caveat
        h.setdefault("caveats", []).append(contention.describe_rest(rest))
        return
    h["interval_confidence"] = h.get("confidence")
    h["confidence"] = contention.PERTURBED
    h["reason"] = h["reason"].replace(f"({h['interval_confidence']})", f"({contention.PERTURBED})")
    h.setdefault("caveats", []).append(contention.describe_rest(rest))


def confident_call(h: dict[str, Any]) -> bool:
    """A call whose whole interval lies on its side, on cells no contention perturbed."""
    return h.get("verdict") in CALLED and h.get("confidence") == "confident"


def compare_calls(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str]:
    """How study b's judgement of one hypothesis relates to study a's: (kind, words).

    same: the same call (the words say when only one of them is confident); same_no_call:
    neither makes one (inconclusive or not_applicable in both); opposite_within_noise: opposite
    calls of which neither is confident, i.e. both intervals reach the threshold (or are missing):
    the point estimates fall either side of it, which is no contradiction, but not the same call;
    different: a call in one only, or opposite calls of which one is confident; contradicts:
    opposite confident calls."""
    va, vb = a.get("verdict"), b.get("verdict")
    ca, cb = confident_call(a), confident_call(b)
    if va not in CALLED and vb not in CALLED:
        return "same_no_call", "same: no call"
    if va == vb:
        return "same", "same call" if ca == cb else "same call, confident in one only"
    if va not in CALLED or vb not in CALLED:
        return "different", "DIFFERENT: a call in one only"
    if ca and cb:
        return "contradicts", "CONTRADICTS: opposite confident calls"
    if not ca and not cb:
        return "opposite_within_noise", "opposite sides, neither confident (no contradiction)"
    return "different", "DIFFERENT: opposite sides, one confident"


def evaluate(
    taxes: dict[str, Any] | None,
    reference: dict[str, Any],
    variants: list[str],
    baseline: str | None,
    artifacts: dict[str, Any],
    runtime: dict[str, Any],
    simulated: bool,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """H1-H6 and the success criteria. `rows`: the aggregate rows, whose validity decides
    whether a call may be confident (a call on perturbed cells is not)."""
    t = Taxes(taxes)
    caveats = (
        [f"ref_safe is flagged: {reference.get('ref_safe_reason')}"]
        if (reference or {}).get("ref_safe_flagged")
        else []
    )
    hyps = {rule.id: judge(rule, t, variants, baseline) for rule in RULES}
    for h in hyps.values():
        h["caveats"] = []
        if h["verdict"] == "not_applicable":
            continue
        h["caveats"] = list(caveats)
        for left_out in ((h.get("numbers") or {}).get(K.MOONCAKE_BOTH) or {}).get("excluded") or []:
            why = "; ".join(f"{n}: {c}" for n, c in left_out["saturated"].items())
            h["caveats"].append(f"shape {left_out['shape']} left out: saturated at ref_safe ({why})")
    rules = {rule.id: rule for rule in RULES}
    for h in hyps.values():
        if baseline is not None:
            mark_perturbed(h, rules[h["id"]], taxes or {}, baseline, rows or [], reference or {})
    return {
        "schema_version": 2,
        "simulated": simulated,
        "baseline": baseline,
        "reference": {
            k: (reference or {}).get(k)
            for k in (
                "ref_safe",
                "ref_load",
                "ref_safe_flagged",
                "ref_load_flagged",
                "ref_safe_reason",
                "ref_load_reason",
                "ref_safe_perturbed",
                "ref_load_perturbed",
            )
        },
        "ci_method": (taxes or {}).get("ci_method"),
        "verdict_rule": VERDICT_RULE,
        "hypotheses": list(hyps.values()),
        "perturbed_calls": [h["id"] for h in hyps.values() if h.get("rests_on_perturbed")],
        "success_criteria": success_criteria(hyps, artifacts, runtime, simulated),
    }
