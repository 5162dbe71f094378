"""The per-step decomposition: the step is Scheduler.schedule(), and of the connector's three
hooks only build_meta runs inside it, so the unattributed rest subtracts build_meta alone."""

from __future__ import annotations

import pytest

from connector_tax.analysis.taxes import step_taxes


def _row(step: float, build_meta: float | None, total: float | None) -> dict:
    row = {"step_duration_us_p50": step, "step_duration_us_p50_ci_lo": step - 2, "step_duration_us_p50_ci_hi": step + 2}
    for field, value in (("build_meta_us", build_meta), ("connector_total_us", total)):
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
    lo, hi = t["unattributed_p50_us"]["ci"]
    assert lo < 50.0 < hi


def test_a_variant_without_hooks_leaves_the_whole_step_unattributed():
    t = step_taxes(_row(130.0, None, None), _row(100.0, None, None))
    assert t["build_meta_p50_us"]["value"] == 0.0 and t["callback_p50_us"]["value"] == 0.0
    assert t["unattributed_p50_us"]["value"] == pytest.approx(30.0)
