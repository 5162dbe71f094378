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


def test_a_phase_with_no_cell_planned_says_so_and_a_failed_one_its_status():
    from connector_tax.analysis.report import _variants

    def phase(status: str, cells: int) -> dict:
        return {"status": status, "cells": ["c"] * cells, "step_timing_available": True}

    agg = {
        "variants": ["noop_connector"],
        "variant_status": {
            "noop_connector": {
                "preflight": "ok",
                "phases": {
                    "phase_a": phase("ok", 3),
                    "phase_b": phase("failed", 0),
                    "phase_b_prime": phase("ok", 0),
                },
            }
        },
    }
    row = next(line for line in _variants(agg) if line.startswith("| `noop_connector`"))
    assert "| ok (3 cells) | failed (0 cells) | – (no cell planned) |" in row
