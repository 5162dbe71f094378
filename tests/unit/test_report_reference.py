"""The report says why ref_safe is the rate it is: a rate above it whose saturation no criterion
could settle shows as "unknown", not as an unsaturated "–"."""

from __future__ import annotations

from connector_tax.analysis.report import _phase_a


def test_the_report_names_what_kept_ref_safe_below_the_next_rate():
    why = "multi r32: the ratio's interval [1.96, 3.24] straddles 2: growth neither shown nor ruled out"
    agg = {
        "rows": [],
        "reference": {
            "ref_safe": 16.0,
            "ref_safe_basis": {"blocked_above": {"r32": [why]}},
            "per_variant": {
                "plain": {"saturation_rate": None, "fired_at_saturation": [], "unknown_rates": []},
                "multi": {"saturation_rate": None, "fired_at_saturation": [], "unknown_rates": [32.0]},
            },
        },
    }
    text = "\n".join(_phase_a(agg))
    assert "| `multi` | – | – | 32 |" in text
    assert f"ref_safe = 16 req/s, not higher: r32: {why}" in text
