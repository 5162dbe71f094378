"""The hypotheses' numbers: a trend across Phase B shapes leaves out shapes the server could
not take at ref_safe, and says so."""

from __future__ import annotations

from connector_tax.analysis.estimates import Taxes, monotone_steps, trend
from connector_tax.analysis.hypotheses import evaluate


def _tax(value: float) -> dict:
    return {"value": value, "ci": [value - 0.01, value + 0.01]}


def _taxes(saturated_at: str | None) -> dict:
    cells = {}
    for label, inp, tax in (("512x64", 512, 0.10), ("4096x64", 4096, 0.20), ("32768x64", 32768, 0.05)):
        cells[label] = {
            "input": inp,
            "output": 64,
            "missing": {},
            "variants": {"mooncake_both": {"ttft_p90": _tax(tax), "tpot_p90": _tax(0.1)}},
            "saturated": {"plain": "throughput;waiting"} if label == saturated_at else {},
        }
    return {"baseline": "plain", "phase_a": {}, "phase_b": {"cells": cells, "rates": [4.0]}}


def test_a_saturated_shape_is_left_out_of_the_trend_and_named():
    # Without the saturated 32k shape the TTFT tax grows at every step up in input.
    assert monotone_steps(Taxes(_taxes(None)), "ttft_p90", "input")["value"] < 0
    kept = trend(Taxes(_taxes("32768x64")), "mooncake_both", "ttft_p90", "input")
    assert [p["input"] for p in kept["series"][0]["points"]] == [512, 4096]
    assert kept["excluded"] == [{"shape": "32768x64", "saturated": {"plain": "throughput;waiting"}}]
    hyp = evaluate(_taxes("32768x64"), {}, ["plain", "mooncake_both"], "plain", {"ok": True}, {}, True)
    h5 = next(h for h in hyp["hypotheses"] if h["id"] == "H5")
    assert h5["verdict"] == "supported"
    assert "shape 32768x64 left out: saturated at ref_safe (plain: throughput;waiting)" in h5["caveats"]


def test_a_share_over_a_tax_without_an_interval_has_no_interval() -> None:
    """H3's share (noop's tax over mooncake_both's): when only the numerator has an interval, the
    share is a point without one (it raised TypeError, dividing by the missing interval)."""
    from connector_tax.analysis.estimates import h3_share, h4_rel_dev

    safe = {
        "variants": {
            "noop_connector": {"ttft_p90": {"value": 0.05, "ci": [0.01, 0.09]}},
            "mooncake_both": {"ttft_p90": {"value": 0.2, "ci": None}},
            "lmcache_only": {"ttft_p90": {"value": 0.1, "ci": None}},
            "multi_mooncake_lmcache": {"ttft_p90": {"value": 0.4, "ci": None}},
        }
    }
    t = Taxes({"phase_a": {"ref_safe": safe}})
    share = h3_share(t)
    assert share is not None and share["value"] == 0.25 and share["ci"] is None
    dev = h4_rel_dev(t)
    assert dev is not None and dev["ci"] is None


def test_h4_interval_counts_multi_once() -> None:
    """H4's rel_dev is 1 - sum / multi; its interval is the box image of the sum's and multi's
    intervals. The taxes are seed 4 of the real-clock default study (docs/simulator.md: paired
    per request, launch_intervals' method), whose truth is +0.67: dividing the deviation (which
    contains multi) by multi gave [+0.24, +1.35], reaching the 0.30 threshold; counting multi
    once keeps the interval clear of it, and the box still holds whenever both intervals hold."""
    from connector_tax.analysis.estimates import ci_of, div_interval, h4_rel_dev
    from connector_tax.analysis.quantiles import tax_combination

    def tax(value: float, lo: float, hi: float) -> dict:
        return {"value": value, "ci": [lo, hi], "method": "launch"}

    mb, lmc, multi = tax(0.6050, 0.4994, 0.7179), tax(0.3065, 0.2056, 0.4159), tax(2.5655, 1.8423, 3.4728)
    variants = {"mooncake_both": mb, "lmcache_only": lmc, "multi_mooncake_lmcache": multi}
    t = Taxes({"phase_a": {"ref_safe": {"variants": {n: {"ttft_p90": e} for n, e in variants.items()}}}})
    h4 = h4_rel_dev(t)
    assert h4 is not None and h4["value"] == (multi["value"] - mb["value"] - lmc["value"]) / multi["value"]
    total = ci_of(tax_combination([(1.0, mb), (1.0, lmc)]))
    assert total is not None
    assert h4["ci"] == [1 - total[1] / multi["ci"][0], 1 - total[0] / multi["ci"][1]]
    # Every corner of the two intervals lands inside it: the box holds whenever both hold.
    for s in total:
        for m in multi["ci"]:
            assert h4["ci"][0] <= 1 - s / m <= h4["ci"][1]
    # The deviation-over-multi box from the same taxes is wider and reaches the threshold.
    dev = ci_of(tax_combination([(1.0, multi), (-1.0, mb), (-1.0, lmc)]))
    assert dev is not None
    old = div_interval(dev, multi["ci"])
    assert old is not None and old[0] < 0.30 < h4["ci"][0] and h4["ci"][1] < old[1]
    hyp = evaluate(t.doc, {}, ["plain", *variants], "plain", {"ok": True}, {}, True)
    assert next(h for h in hyp["hypotheses"] if h["id"] == "H4")["confidence"] == "confident"


def _normal_tax(value: float, se: float) -> dict:
    from connector_tax.analysis.quantiles import Z95

    return {"value": value, "ci": [value - Z95 * se, value + Z95 * se]}


def test_h3_share_interval_holds_at_every_non_negative_correlation_and_is_narrower_than_the_box() -> None:
    """H3's share a / b (noop's tax over mooncake_both's, both over plain): its interval covers the
    true share in >= 95% of draws whatever the correlation rho >= 0 between the two taxes (the
    shared baseline makes it positive, of unknown size), the true share below 0 included (where
    Fieller's set at rho = 0 would be too narrow), and from 0 up is narrower than the box, which
    divides by the end of the denominator's interval (and covers 95-100 % there). Normal taxes of
    known standard error, mooncake_both's 5 standard errors from 0 (the default study's is 4-6)."""
    import numpy as np

    from connector_tax.analysis.estimates import div_interval, share_interval

    rng = np.random.default_rng(20261202)
    sa, sb, tax = 0.09, 0.12, 0.6
    for share in (-0.6, -0.2, 0.0, 0.3, 0.5, 1.0):
        for rho in (0.0, 0.5, 0.95):
            cov = [[sa * sa, rho * sa * sb], [rho * sa * sb, sb * sb]]
            hits, ours, box = 0, [], []
            for a, b in rng.multivariate_normal([share * tax, tax], cov, size=4000):
                wide = div_interval(_normal_tax(a, sa)["ci"], _normal_tax(b, sb)["ci"])
                if wide is None:  # mooncake_both's interval reaches 0: no call (`unresolved`)
                    continue
                ci = share_interval(_normal_tax(a, sa), _normal_tax(b, sb))
                assert ci is not None and ci[0] <= a / b <= ci[1]
                hits += ci[0] <= share <= ci[1]
                ours.append(ci[1] - ci[0])
                box.append(wide[1] - wide[0])
            assert len(ours) > 3900 and hits / len(ours) >= 0.94, (share, rho, hits, len(ours))
            # below 0 the set is the rho = 1 one, the box's own corners; from 0 up it is narrower
            assert np.median(ours) < np.median(box) if share >= 0 else np.median(ours) <= np.median(box), (share, rho)


def test_h3_is_confident_on_the_taxes_the_box_left_within_noise() -> None:
    """A real-clock default study's taxes at ref_safe (2026-12-02, a fresh clone of 2de0fe4, no cell
    busy or measured again): noop's TTFT p90 tax -0.6 % [-17.0, +19.0], mooncake_both's +60.1 %
    [+36.4, +87.9]. The box put the share at [-0.47, +0.52], across H3's 0.5; the share's own
    interval stays below it."""
    from connector_tax.analysis.estimates import div_interval, share_interval

    noop = {"value": -0.005888, "ci": [-0.169528, 0.189997]}
    mb = {"value": 0.600723, "ci": [0.363959, 0.878585]}
    box = div_interval(noop["ci"], mb["ci"])
    assert box is not None and box[1] > 0.5
    ci = share_interval(noop, mb)
    assert ci is not None and ci[0] < noop["value"] / mb["value"] < ci[1] < 0.4
    safe = {"variants": {"noop_connector": {"ttft_p90": noop}, "mooncake_both": {"ttft_p90": mb}}}
    hyp = evaluate(
        {"phase_a": {"ref_safe": safe}},
        {},
        ["plain", "noop_connector", "mooncake_both"],
        "plain",
        {"ok": True},
        {},
        True,
    )
    h3 = next(h for h in hyp["hypotheses"] if h["id"] == "H3")
    assert h3["verdict"] == "supported" and h3["confidence"] == "confident" and h3["ci"] == ci


def test_a_share_over_a_negative_tax_mirrors_and_over_an_unclear_one_falls_back_to_the_box() -> None:
    from connector_tax.analysis.estimates import div_interval, share_interval

    a, b = _normal_tax(0.1, 0.05), _normal_tax(0.5, 0.1)
    neg_a, neg_b = _normal_tax(-0.1, 0.05), _normal_tax(-0.5, 0.1)
    assert share_interval(neg_a, neg_b) == share_interval(a, b)
    # 1.86 standard errors from 0: its (skewed) interval is clear of 0 by a hair, Fieller's set is not
    near = {"value": 0.18, "ci": [0.001, 0.38]}
    assert share_interval(a, near) == div_interval(a["ci"], near["ci"])
    assert share_interval({"value": 0.1, "ci": None}, b) is None
