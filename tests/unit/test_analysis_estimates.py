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
