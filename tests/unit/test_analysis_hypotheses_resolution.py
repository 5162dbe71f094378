"""A ratio of a tax the cells cannot tell from 0 gets no call.

H3 (noop's share of mooncake_both's tax) and H4 (multi's relative deviation from additivity)
divide by a tax. When that tax's interval covers 0, the ratio has no interval
(any bound is infinite) and the side of the threshold its point estimate falls on is noise: the
verdict is "inconclusive" with confidence "below resolution" and the reason names the tax, its
interval and the cells' resolution, instead of "supported"/"refuted (no interval)" as before (seen
on the simulated H20 study: H4 "supported" in the fixed plan and "refuted" in the tax-precision
plan, both on a mooncake_both tax of -0.6 % whose interval covered 0). The truth oracle judges its
own numbers by the same rule, the coverage check counts such a study's non-call as no call (not a
wrong one), and two studies' calls are compared by what their intervals say."""

from __future__ import annotations

import pytest

from connector_tax.analysis import constants as K
from connector_tax.analysis.core import verdicts_tsv
from connector_tax.analysis.estimates import div_interval, share_interval
from connector_tax.analysis.hypotheses import BELOW_RESOLUTION, compare_calls, evaluate
from connector_tax.analysis.report import _verdicts
from connector_tax.oracle.coverage import score, summarize
from connector_tax.oracle.truth import hypotheses_of, margin

NAMES = [K.PLAIN, K.NOOP, K.MOONCAKE_BOTH, K.NIXL_BOTH, K.LMCACHE_ONLY, K.MULTI]


def _tax(value: float, ci: list[float] | None) -> dict:
    return {"value": value, "ci": ci, "method": "launch"}  # combinations take the intervals as they are


def _doc(taxes: dict[str, tuple[float, list[float] | None]]) -> dict:
    """A taxes document with TTFT (and a like TPOT) taxes at ref_safe."""
    variants = {n: {"ttft_p90": _tax(v, ci), "tpot_p90": _tax(v, ci)} for n, (v, ci) in taxes.items()}
    safe = {"rate": 0.5, "cell": "r0.5", "variants": variants, "missing": {}}
    return {"baseline": K.PLAIN, "phase_a": {"ref_safe": safe, "ref_load": safe}, "phase_b": {}, "phase_b_prime": {}}


def _judge(doc: dict) -> dict[str, dict]:
    hyp = evaluate(doc, {"ref_safe": 0.5, "ref_load": 0.5}, NAMES, K.PLAIN, {"ok": True}, {}, True)
    return {h["id"]: h for h in hyp["hypotheses"]} | {"_doc": hyp}


# The simulated H20 study at 0.5 req/s: every connector's TTFT tax within a percent of 0,
# resolved to about +-2 pp by its paired cells.
H20_LIKE = {
    K.NOOP: (0.002, [-0.015, 0.019]),
    K.MOONCAKE_BOTH: (-0.006, [-0.025, 0.014]),
    K.NIXL_BOTH: (0.001, [-0.018, 0.020]),
    K.LMCACHE_ONLY: (0.005, [-0.014, 0.024]),
    K.MULTI: (0.004, [-0.016, 0.025]),
}


def test_a_ratio_of_a_tax_whose_interval_covers_0_gets_no_call():
    h = _judge(_doc(H20_LIKE))
    for hid, den in (("H3", K.MOONCAKE_BOTH), ("H4", K.MULTI)):
        assert h[hid]["verdict"] == "inconclusive", h[hid]  # was supported/refuted "(no interval)"
        assert h[hid]["confidence"] == BELOW_RESOLUTION
        assert h[hid]["ci"] is None and h[hid]["ci_overlaps_threshold"] is None
        res = h[hid]["resolution"]
        assert res["denominator"] == den and res["ci"] == H20_LIKE[den][1]
        assert res["half_width"] == pytest.approx((H20_LIKE[den][1][1] - H20_LIKE[den][1][0]) / 2)
        assert f"{den}'s TTFT p90 tax" in h[hid]["reason"] and "which covers 0" in h[hid]["reason"]
        assert "below what these cells resolve (about ±" in h[hid]["reason"]
        assert h[hid]["value"] is not None  # the point is kept, for the record, but not called
    assert "(H1's number)" in h["H3"]["reason"]
    # H1 and H2 are differences, not ratios: their calls stand, confident where the interval is clear
    assert h["H1"]["verdict"] == "refuted" and h["H1"]["confidence"] == "confident"
    assert h["H2"]["verdict"] == "refuted"
    # their success criteria are not met: the split and the additivity are not disambiguated
    sc = {s["id"]: s for s in h["_doc"]["success_criteria"]}
    assert sc["SC3"]["status"] == "not_met" and sc["SC3"]["outcome"] is None
    assert sc["SC4"]["status"] == "not_met" and "covers 0" in sc["SC4"]["reason"]


def test_the_non_call_is_written_in_verdicts_tsv_and_the_report():
    hyp = _judge(_doc(H20_LIKE))["_doc"]
    rows = {line.split("\t")[0]: line.split("\t") for line in verdicts_tsv(hyp).splitlines()[1:]}
    assert rows["H3"][1:3] == ["inconclusive", BELOW_RESOLUTION]
    assert rows["H4"][1:3] == ["inconclusive", BELOW_RESOLUTION]
    report = "\n".join(_verdicts(hyp))
    assert f"| H4 | **inconclusive** | {BELOW_RESOLUTION} |" in report
    assert "No call (inconclusive)" in hyp["verdict_rule"]


def test_a_denominator_without_an_interval_leaves_a_point_call_without_one():
    # cells too short to bound any p90 (the default study's 48-request cells at 16 req/s): every
    # number is a point without an interval, the ratio's too; nothing says the tax is near 0
    taxes = {**H20_LIKE, K.NOOP: (0.01, None), K.MOONCAKE_BOTH: (0.60, None)}
    h3 = _judge(_doc(taxes))["H3"]
    assert h3["verdict"] == "supported" and h3["confidence"] == "no interval" and "resolution" not in h3


def test_a_resolved_denominator_keeps_the_call_and_gets_an_interval():
    taxes = {
        **H20_LIKE,
        K.NOOP: (0.05, [0.04, 0.06]),
        K.MOONCAKE_BOTH: (0.60, [0.50, 0.70]),
        K.LMCACHE_ONLY: (0.20, [0.15, 0.25]),
        K.MULTI: (1.40, [1.30, 1.50]),
    }
    h = _judge(_doc(taxes))
    assert h["H3"]["verdict"] == "supported" and h["H3"]["confidence"] == "confident"
    # H3's share gets its own interval (estimates.share_interval), inside the box's
    share = h["H3"]["ci"]
    assert share == share_interval({"value": 0.05, "ci": [0.04, 0.06]}, {"value": 0.60, "ci": [0.50, 0.70]})
    assert 0.04 / 0.70 < share[0] < 0.05 / 0.60 < share[1] < 0.06 / 0.50
    assert h["H4"]["verdict"] == "refuted" and h["H4"]["ci"] is not None
    assert "resolution" not in h["H3"]


def test_a_denominator_wholly_below_0_bounds_the_ratio():
    # the old rule took any interval below 0 for one that reaches it
    assert div_interval([0.1, 0.2], [-0.5, -0.25]) == pytest.approx([-0.8, -0.2])
    assert div_interval([0.1, 0.2], [-0.1, 0.3]) is None
    assert div_interval([0.1, 0.2], [0.0, 0.3]) is None


def test_perturbed_cells_behind_a_non_call_are_a_caveat_not_its_confidence():
    doc = _doc(H20_LIKE)
    rows = [
        {"variant": n, "phase": "phase_a", "cell": "r0.5", "rate": 0.5, "valid": n != K.MULTI}
        | ({} if n != K.MULTI else {"validity_reasons": "host busy"})
        for n in NAMES
    ]
    hyp = evaluate(doc, {"ref_safe": 0.5, "ref_load": 0.5}, NAMES, K.PLAIN, {"ok": True}, {}, True, rows)
    h4 = next(h for h in hyp["hypotheses"] if h["id"] == "H4")
    assert h4["verdict"] == "inconclusive" and h4["confidence"] == BELOW_RESOLUTION
    assert h4["reason"].endswith(f"({BELOW_RESOLUTION})") and h4["rests_on_perturbed"]


@pytest.mark.parametrize(
    ("a", "b", "kind"),
    [
        (("refuted", "confident"), ("refuted", "confident"), "same"),
        (("refuted", "confident"), ("refuted", "within noise"), "same"),
        (("inconclusive", BELOW_RESOLUTION), ("inconclusive", BELOW_RESOLUTION), "same_no_call"),
        (("not_applicable", None), ("inconclusive", BELOW_RESOLUTION), "same_no_call"),
        (("supported", "within noise"), ("refuted", "within noise"), "opposite_within_noise"),
        (("supported", "no interval"), ("refuted", "rests on perturbed cells"), "opposite_within_noise"),
        (("supported", "confident"), ("refuted", "within noise"), "different"),
        (("supported", "no interval"), ("inconclusive", BELOW_RESOLUTION), "different"),
        (("supported", "confident"), ("refuted", "confident"), "contradicts"),
    ],
)
def test_two_studies_calls_are_compared_by_what_their_intervals_say(a, b, kind):
    got, words = compare_calls({"verdict": a[0], "confidence": a[1]}, {"verdict": b[0], "confidence": b[1]})
    assert got == kind
    assert ("DIFFERENT" in words) == (kind == "different") and ("CONTRADICTS" in words) == (kind == "contradicts")


def _row(name: str, p90: float, half: float) -> dict:
    row = {"variant": name, "phase": "phase_a", "cell": "r0.5", "rate": 0.5, "valid": True, "replicate": 1}
    for m in ("ttft_ms", "tpot_ms"):
        row |= {f"{m}_p90": p90, f"{m}_p90_ci_lo": p90 - half, f"{m}_p90_ci_hi": p90 + half, f"{m}_n": 400}
    return row


def _rows(p90s: dict[str, float], half: float) -> list[dict]:
    return [_row(n, p90, half) for n, p90 in p90s.items()]


REFERENCE = {"ref_safe": 0.5, "ref_load": 0.5}
# mooncake_both +0.2 % and multi +0.5 % over plain: taxes far below a 1 % p90 interval
TINY = {
    K.PLAIN: 300.0,
    K.NOOP: 300.1,
    K.MOONCAKE_BOTH: 300.6,
    K.NIXL_BOTH: 300.3,
    K.LMCACHE_ONLY: 300.9,
    K.MULTI: 301.5,
}


def test_the_oracle_judges_a_ratio_by_its_own_interval_of_the_denominator():
    pooled = [{**r, "ttft_ms_p90_ci_lo": None, "ttft_ms_p90_ci_hi": None} for r in _rows(TINY, 0.0)]
    keys = [(n, "phase_a/r0.5", m) for n in NAMES[1:] for m in ("ttft_p90", "tpot_p90")]
    # the oracle's replications resolve every tax: the ratios are called
    tight = {k: [0.9 * v, 1.1 * v] for k in keys for v in [TINY[k[0]] / TINY[K.PLAIN] - 1]}
    _, called = hypotheses_of(pooled, NAMES, REFERENCE, {"H3": [0.1, 0.2], "H4": [-0.1, 0.1]}, tax_cis=tight)
    assert called["H3"]["verdict"] == "supported" and called["H4"]["verdict"] == "supported"
    assert margin(called["H3"]) is not None
    # they do not: no true call, and no margin to a threshold
    wide = {k: [-0.01, 0.01] for k in keys}
    _, none = hypotheses_of(pooled, NAMES, REFERENCE, {"H3": [0.1, 0.2], "H4": [-0.1, 0.1]}, tax_cis=wide)
    assert none["H3"]["verdict"] == "inconclusive" and none["H4"]["verdict"] == "inconclusive"
    assert margin(none["H3"]) is None


def test_coverage_counts_a_non_call_as_no_call_not_a_wrong_one():
    _, true = hypotheses_of(
        [{**r, "ttft_ms_p90_ci_lo": None} for r in _rows(TINY, 0.0)],
        NAMES,
        REFERENCE,
        {"H3": [0.1, 0.2], "H4": [-0.1, 0.1]},
        tax_cis={(n, "phase_a/r0.5", m): [0.001, 0.02] for n in NAMES[1:] for m in ("ttft_p90", "tpot_p90")},
    )
    truth = {"variants": NAMES, "reference": REFERENCE, "taxes": [], "hypotheses": true}
    assert true["H3"]["verdict"] == "supported" and true["H4"]["verdict"] == "supported"
    # a short study whose p90s are known to +-3 ms: mooncake_both's +0.2 % tax covers 0
    seed = score(_rows(TINY, 3.0), truth)
    assert seed["hypotheses"]["H3"]["verdict"] == "inconclusive"
    assert seed["hypotheses"]["H3"]["no_call"] is True and seed["hypotheses"]["H3"]["wrong"] is False
    table = summarize([seed])["hypotheses"]
    assert table["H3"]["agrees"] == 0 and table["H3"]["no_call"] == 1 and table["H3"]["wrong"] == 0


@pytest.mark.parametrize(
    ("nixl", "says"),
    [
        (0.10, "the gap widens past 5-10 pp: mechanism-side, but larger than the trace replay's ~7 pp"),
        (0.58, "the gap shrinks: a coupling artifact"),
        (0.70, "the gap inverts: a coupling artifact"),
    ],
)
def test_h2_calls_only_a_gap_that_shrinks_or_inverts_a_coupling_artifact(nixl, says):
    # mooncake_both +60 %: NIXL at +10 % is a 50 pp gap (wider than 5-10 pp, not coupling's doing)
    taxes = {n: (0.3, [0.25, 0.35]) for n in NAMES if n != K.PLAIN}
    taxes[K.MOONCAKE_BOTH], taxes[K.NIXL_BOTH] = (0.60, [0.55, 0.65]), (nixl, [nixl - 0.01, nixl + 0.01])
    h2 = _judge(_doc(taxes))["H2"]
    assert h2["verdict"] == "refuted" and says in h2["reason"], h2["reason"]
