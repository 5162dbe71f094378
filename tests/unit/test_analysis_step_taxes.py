"""The per-step decomposition: the step is Scheduler.schedule(), and of the connector's three
hooks only build_meta runs inside it, so the unattributed rest subtracts build_meta alone. And the
queueing amplification is no number where its ref_safe tax cannot be told from 0."""

from __future__ import annotations

import pytest

from connector_tax.analysis.taxes import amplification, step_taxes


def _row(step: float, build_meta: float | None, total: float | None) -> dict:
    # step_other_us: the step less its build_meta, step by step (here every step alike)
    other = step - (build_meta or 0.0)
    row: dict = {}
    for field, value in (
        ("step_duration_us", step),
        ("step_other_us", other),
        ("build_meta_us", build_meta),
        ("connector_total_us", total),
    ):
        row[f"{field}_p50"] = value
        row[f"{field}_p50_ci_lo"] = None if value is None else value - 1
        row[f"{field}_p50_ci_hi"] = None if value is None else value + 1
    return row


def test_unattributed_is_the_step_less_the_hook_inside_it():
    # A connector whose hooks take 300 us a step, 100 of them in build_meta, and whose schedule()
    # grew by 150 us: 50 us of it no hook explains. The seed's step - callback would say -150.
    t = step_taxes(_row(250.0, 100.0, 300.0), _row(100.0, None, None))
    assert t["step_p50_us"]["value"] == pytest.approx(150.0)
    assert t["callback_p50_us"]["value"] == pytest.approx(300.0)
    assert t["build_meta_p50_us"]["value"] == pytest.approx(100.0)
    assert t["unattributed_p50_us"]["value"] == pytest.approx(50.0)
    # its interval is the two steps' own (±1 each here), not also build_meta's
    lo, hi = t["unattributed_p50_us"]["ci"]
    assert lo < 50.0 < hi and hi - lo < (t["step_p50_us"]["ci"][1] - t["step_p50_us"]["ci"][0]) * 1.01


def test_a_variant_without_hooks_leaves_the_whole_step_unattributed():
    t = step_taxes(_row(130.0, None, None), _row(100.0, None, None))
    assert t["build_meta_p50_us"]["value"] == 0.0 and t["callback_p50_us"]["value"] == 0.0
    assert t["unattributed_p50_us"]["value"] == pytest.approx(30.0)


def test_no_amplification_over_a_ref_safe_tax_that_covers_0():
    # +2 % [-1, +5] at ref_safe: 0.04 / 0.02 would print as a 2x amplification of nothing.
    none = amplification({"value": 0.02, "ci": [-0.01, 0.05]}, {"value": 0.04, "ci": [0.01, 0.07]})
    assert none["value"] is None and none["unresolved"]["denominator"] == "ref_safe"
    amp = amplification({"value": 0.2, "ci": [0.1, 0.3]}, {"value": 0.5, "ci": [0.4, 0.6]})
    assert amp["value"] == pytest.approx(2.5) and amp["ci"] == pytest.approx([0.4 / 0.3, 0.6 / 0.1])
