"""Saturation criteria and the reference rates (the pipeline's reference stage)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from synthetic_study import SyntheticSpec, expected_reference, write_study

from connector_tax.analysis.reference_rates import reference_rates
from connector_tax.analysis.saturation import cell_criteria
from connector_tax.config import default_saturation

SAT = default_saturation()  # the schema's thresholds

SMALL = dict(n_requests=120, n_steps=50, step_logs=False, phase_b=False, phase_b_prime=False, write_reference=False)


def _study(tmp_path, **kw):
    spec = SyntheticSpec(**{**SMALL, **kw})
    root = write_study(tmp_path / spec.study, spec)
    return spec, root


def test_knee_and_reference_rates_exact(tmp_path):
    spec, root = _study(
        tmp_path, variants=["plain", "noop_connector", "mooncake_both"], knee={"plain": 16.0, "mooncake_both": 8.0}
    )
    ref = reference_rates(root)
    json.dumps(ref)  # JSON-serializable
    assert (ref["ref_safe"], ref["ref_load"]) == expected_reference(spec) == (4.0, 8.0)
    assert not ref["ref_safe_flagged"] and not ref["ref_load_flagged"]
    assert ref["per_variant"]["mooncake_both"]["saturation_rate"] == 8.0
    assert ref["per_variant"]["plain"]["saturation_rate"] == 16.0
    assert ref["per_variant"]["noop_connector"]["saturation_rate"] is None
    at_knee = ref["cells"]["mooncake_both"]["r8"]
    assert at_knee["saturated"] and set(at_knee["fired"]) == {"throughput", "waiting", "ttft_growth"}
    below = ref["cells"]["mooncake_both"]["r4"]
    assert below["saturated"] is False and below["fired"] == []
    # the numbers behind each decision are there
    c1 = at_knee["criteria"]["throughput"]
    assert c1["value"] == pytest.approx(0.8) and c1["threshold"] == 0.95 and c1["basis"] == "offered"
    # warm-up metrics samples (waiting = 10) are outside the window: waiting p50 below the knee is 0
    assert below["criteria"]["waiting"]["value"] == 0.0
    c3 = at_knee["criteria"]["ttft_growth"]
    assert c3["vs_rate"] == 4.0 and c3["exact_half"] is True and c3["value"] > 1.5
    assert ref["ref_safe_basis"]["blocked_above"]["r8"]


def test_reads_study_config_yaml_when_no_config_given(tmp_path):
    _, root = _study(tmp_path, variants=["plain", "mooncake_both"])
    assert reference_rates(root)["ref_safe"] == 4.0


def test_nearest_lower_rate_when_halves_are_missing(tmp_path):
    spec, root = _study(
        tmp_path,
        variants=["plain", "mooncake_both"],
        rates=[1.0, 3.0, 4.0, 7.0],
        knee={"plain": 7.0, "mooncake_both": 7.0},
    )
    ref = reference_rates(root)
    c = ref["cells"]["plain"]
    assert c["r7"]["criteria"]["ttft_growth"]["vs_rate"] == 3.0
    assert c["r7"]["criteria"]["ttft_growth"]["exact_half"] is False
    assert "nearest lower rate 3" in c["r7"]["criteria"]["ttft_growth"]["note"]
    assert c["r4"]["criteria"]["ttft_growth"]["vs_rate"] == 1.0
    assert c["r1"]["criteria"]["ttft_growth"]["fired"] is None  # nothing <= 0.5 to compare with
    assert ref["ref_safe"] == 4.0


def test_no_rate_qualifies_is_flagged_with_a_reason(tmp_path):
    spec, root = _study(tmp_path, variants=["plain", "mooncake_both"], knee={"plain": 16.0, "mooncake_both": 1.0})
    ref = reference_rates(root)
    assert ref["ref_safe"] == 1.0 and ref["ref_safe_flagged"] is True
    assert "mooncake_both" in ref["ref_safe_reason"] and "\n" not in ref["ref_safe_reason"]
    assert ref["ref_load"] == 8.0 and not ref["ref_load_flagged"]


def test_skipped_config_is_excluded_not_blocking(tmp_path):
    spec, root = _study(
        tmp_path,
        variants=["plain", "mooncake_consumer", "mooncake_both"],
        knee={"plain": 16.0, "mooncake_both": 8.0, "mooncake_consumer": 2.0},
        skipped={"mooncake_consumer": "dummy bootstrap refused"},
    )
    ref = reference_rates(root)
    assert "mooncake_consumer" in ref["variants_excluded"]
    assert "dummy bootstrap refused" in ref["variants_excluded"]["mooncake_consumer"]
    assert ref["ref_safe"] == 4.0


def test_study_without_plain_uses_first_config_for_ref_load(tmp_path):
    spec, root = _study(
        tmp_path,
        study="admission-ab",
        variants=["fifo", "pack"],
        rates=[4.0, 8.0, 16.0, 32.0],
        knee={"fifo": 16.0, "pack": 32.0},
    )
    ref = reference_rates(root)
    assert ref["baseline"] == "fifo"
    assert ref["ref_load"] == 8.0 and ref["ref_safe"] == 8.0
    assert any("first config" in n for n in ref["notes"])


def test_requested_basis_and_thresholds():
    row = {
        "phase": "phase_b",
        "throughput_ratio": 0.99,
        "throughput_ratio_requested": 0.9,
        "waiting_p50": 0.0,
        "effective_rps": 3.6,
        "offered_rps": 3.64,
        "requested_rps": 4.0,
    }
    assert cell_criteria(row, SAT, "offered")["saturated"] is False
    sat = cell_criteria(row, SAT, "requested")
    assert sat["saturated"] is True and sat["fired"] == ["throughput"]
    assert cell_criteria(row, replace(SAT, throughput_ratio_min=0.85), "requested")["saturated"] is False
    assert cell_criteria({"phase": "phase_b"}, SAT)["saturated"] is None  # nothing to evaluate


def test_a_criterion_on_too_few_requests_is_not_judged():
    """One late request of four reads as a throughput ratio of 0.75: that is noise, not a knee."""
    small = {"phase": "phase_a", "rate": 4.0, "throughput_ratio": 0.75, "n_post_warmup": 4, "metrics_n": 2}
    verdict = cell_criteria({**small, "waiting_p50": 5.0}, SAT)
    assert verdict["saturated"] is None and verdict["fired"] == []
    assert verdict["criteria"]["throughput"]["note"] == "too few to judge: 4 requests post warm-up < 20"
    assert verdict["criteria"]["waiting"]["note"] == "too few to judge: 2 /metrics scrapes < 3"
    assert cell_criteria({**small, "n_post_warmup": 20}, SAT)["fired"] == ["throughput"]
    # criterion 3 needs enough TTFTs in both cells
    lower = {"phase": "phase_a", "rate": 2.0, "ttft_ms_p90": 10.0, "ttft_ms_n": 8}
    row = {"phase": "phase_a", "rate": 4.0, "ttft_ms_p90": 30.0, "ttft_ms_n": 200}
    growth = cell_criteria(row, SAT, lower=lower)["criteria"]["ttft_growth"]
    assert growth["value"] == pytest.approx(3.0) and growth["fired"] is None and "8 TTFT samples" in growth["note"]
    assert cell_criteria(row, SAT, lower={**lower, "ttft_ms_n": 20})["fired"] == ["ttft_growth"]
