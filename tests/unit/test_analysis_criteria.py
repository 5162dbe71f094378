"""Success criteria that band a hypothesis's number by thresholds of their own carry their own
confidence: H1's interval clear of its 10 % threshold says nothing about SC1's 60 % bound."""

from __future__ import annotations

from connector_tax.analysis.criteria import success_criteria


def _h(value: float | None, ci: list[float] | None, confidence: str | None = "confident") -> dict:
    shown = f"{value}, CI {ci}"
    return {
        "verdict": "supported",
        "value": value,
        "ci": ci,
        "confidence": confidence,
        "reason": f"{shown}: the hypothesis's own words ({confidence})",
        "numbers": {"noop_share": value, "rel_dev": value},
    }


def _criteria(h1: dict, h3: dict) -> dict:
    hyps = {"H1": h1, "H2": _h(50, [40, 60]), "H3": h3, "H4": _h(0.6, [0.4, 0.8])}
    hyps["H5"] = hyps["H6"] = {"verdict": "not_applicable", "reason": "no Phase B"}
    out = success_criteria(hyps, {"ok": True}, {"wall_hours": 0.1}, simulated=True)
    return {s["id"]: s for s in out}


def test_a_band_edge_inside_the_interval_is_within_noise():
    # H1 +60.3 % [+38.8, +85.0]: confident against 10 %, but the prior's band ends at 60 %.
    sc = _criteria(_h(0.603, [0.388, 0.850]), _h(0.2, [0.1, 0.25]))
    assert sc["SC1"]["outcome"] == "revise prior (above)" and sc["SC1"]["confidence"] == "within noise"
    assert sc["SC1"]["reason"].endswith("revise prior (above) (within noise)")
    assert sc["SC3"]["outcome"] == "implementation-cost-dominated" and sc["SC3"]["confidence"] == "confident"


def test_a_band_the_interval_stays_inside_is_confident_and_perturbed_cells_stay_so():
    sc = _criteria(_h(0.45, [0.40, 0.50]), _h(0.2, [0.1, 0.35], "rests on perturbed cells"))
    assert sc["SC1"]["outcome"] == "accept prior" and sc["SC1"]["confidence"] == "confident"
    # H3 0.2 [0.1, 0.35] crosses SC3's 30 % line, but its cells were perturbed: that is what it says
    assert sc["SC3"]["confidence"] == "rests on perturbed cells"
    # SC2 and SC4 name the hypothesis's own call: its confidence, as it stands
    assert sc["SC2"]["confidence"] == sc["SC4"]["confidence"] == "confident"


def test_the_truths_margin_reads_in_the_hypothesis_unit():
    from connector_tax.oracle.truth_render import _distance

    assert _distance(0.483, "H1") == "48.3 pp"  # H1 is a relative tax: 58.3 % is 48.3 points past 10 %
    assert _distance(38.0, "H2") == "38.0 pp"
    assert _distance(0.37, "H4") == "0.37"


def _trend(along: str, across: str, fixed: int, xs: tuple[int, int], total: float, ci: list[float]) -> dict:
    points = [{along: x, "tax": 0.0, "ci": None} for x in xs]
    series = {across: fixed, "points": points, "steps": [], "total_pp": total, "total_ci": ci, "sign": "-"}
    return {
        "verdict": "refuted",
        "value": total,
        "ci": ci,
        "confidence": "confident",
        "reason": "r",
        "numbers": {"mooncake_both": {"series": [series]}},
    }


def test_sc5_says_the_direction_and_size_of_each_trend():
    hyps = {h: _h(0.5, [0.4, 0.6]) for h in ("H1", "H2", "H3", "H4")}
    hyps["H5"] = _trend("input", "output", 8, (64, 512), -79.0, [-124.0, -34.0])
    hyps["H6"] = _trend("output", "input", 64, (8, 32), 51.2, [36.8, 65.6])
    sc5 = next(s for s in success_criteria(hyps, {"ok": True}, {"wall_hours": 0.1}, True) if s["id"] == "SC5")
    assert sc5["status"] == "met"
    assert sc5["reason"] == (
        "H5 TTFT tax, input 64 -> 512 at output 8: -79.0 pp [-124.0, -34.0]; "
        "H6 TPOT tax, output 8 -> 32 at input 64: +51.2 pp [+36.8, +65.6]"
    )
