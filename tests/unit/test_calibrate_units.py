"""Calibration's pieces, each against a hand-computed answer: the profile file (plain data, its
errors one line each), the simulator's cost of a step under a fitted profile, the API delays'
quantile draws, the least squares' identification rule, and the check's arithmetic."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml
from typed import typed

from connector_tax.calibrate.anchors import request_means
from connector_tax.calibrate.anchors import summarize as anchor_summary
from connector_tax.calibrate.check import compare_row, compare_taxes, summarize
from connector_tax.calibrate.regress import fit_terms
from connector_tax.config import ConfigError, validate_config
from connector_tax.config.profile import LEGACY_QUANTILES, QUANTILES, grid_for, parse_profile, read_profile
from connector_tax.sim.apidelay import ApiDelays, quantile
from connector_tax.sim.costs import BatchShape
from connector_tax.sim.settings import resolve

GRID = [1000.0 + 100.0 * i for i in range(21)]  # uniform on [1000, 3000] µs
PROFILE = {
    "schema": "connector-tax/sim-profile/1",
    "name": "known",
    "kind": "calibrated",
    "model": ["tiny-llama"],
    "hardware": {
        "step_base_us": 3000,
        "prefill_token_us": 40,
        "decode_seq_us": 400,
        "context_token_us": 0.5,
        "kv_cache_blocks": 4096,
        "block_size": 32,
        "schedule_base_us": 150,
        "schedule_request_us": 6,
        "step_gap_us": 120,
    },
    "api": {"ingress_us": GRID, "egress_us": GRID},
    "variants": {
        "plain": {"connector": None},
        "nixl_both": {
            "connector": {"type": "nixl", "role": "kv_both"},
            "hooks": {
                "build_meta": {"fixed_us": 8, "per_request_us": 0.5, "per_block_us": 0},
                "get_finished": {"fixed_us": 40, "per_request_us": 3, "per_block_us": 0.25},
            },
            "forward_scale": 2.0,
            "extra_us": 300,
            "schedule_scale": 1.5,
        },
    },
}
STUDY = {
    "study": "units",
    "backend": "sim",
    "model": {"name": "results/models/tiny-llama", "served_name": "tiny-llama"},
    "server": {"max_model_len": 2048},
    "variants": [{"name": "plain"}, {"name": "nixl_both", "connector": {"type": "nixl", "role": "kv_both"}}],
    "workload": {
        "phase_a": {"rates": [1], "shape": {"input": 64, "output": 8}},
        "phase_b": {"shapes": [{"input": 64, "output": 8}]},
    },
}


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return path


def study_with(profile_path, **changes):
    config = copy.deepcopy(STUDY)
    config["sim"] = {"profile": str(profile_path)}
    config.update(changes)
    return validate_config(config)


# -- the profile file ----------------------------------------------------------------------


def test_a_profile_reads_back_what_was_written(profile_file):
    profile = read_profile(profile_file)
    assert profile.kind == "calibrated" and profile.models == ("tiny-llama",)
    assert profile.hardware["step_gap_us"] == 120 and profile.hardware["block_size"] == 32
    nixl = profile.variant_for("nixl_both", None)
    assert nixl.forward_scale == 2.0 and nixl.schedule_scale == 1.5
    assert nixl.hooks["get_finished"] == {"fixed_us": 40, "per_request_us": 3, "per_block_us": 0.25}
    # a variant of another name with the same connector takes the fitted costs
    assert profile.variant_for("my_nixl", {"type": "nixl", "role": "kv_both"}) is nixl
    assert profile.variant_for("mooncake_both", {"type": "mooncake", "role": "kv_both"}) is None
    again = parse_profile(profile.as_dict())
    assert again.as_dict() == profile.as_dict()


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda p: p.update(schema="something/else"), "schema"),
        (lambda p: p["hardware"].pop("decode_seq_us"), "hardware.decode_seq_us: missing"),
        (lambda p: p["hardware"].update(decode_seq_us=-1), "hardware.decode_seq_us: must be non-negative"),
        (lambda p: p["hardware"].update(warp_speed=9), "hardware.warp_speed: unknown key"),
        (lambda p: p["api"].update(ingress_us=[1, 2, 3]), "api.ingress_us: expected 27 quantiles"),
        (lambda p: p["api"].update(egress_us=list(reversed(GRID))), "api.egress_us: quantiles must not decrease"),
        (lambda p: p["variants"]["nixl_both"]["hooks"].update(on_the_moon={}), "variants.nixl_both.hooks.on_the_moon"),
        (lambda p: p["variants"]["nixl_both"].update(forward_scale=0), "variants.nixl_both.forward_scale"),
        (lambda p: p.update(model=[]), "model"),
    ],
)
def test_a_bad_profile_is_one_line_naming_its_key(tmp_path, change, where):
    data = copy.deepcopy(PROFILE)
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        read_profile(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path)) and where in message, message


def test_a_missing_profile_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^sim.profile: .*nowhere.yaml: no such file$"):
        study_with(tmp_path / "nowhere.yaml")


def test_a_profile_fitted_on_another_model_is_refused_before_anything_runs(profile_file):
    with pytest.raises(ConfigError) as err:
        study_with(profile_file, model={"name": "Qwen/Qwen3-Coder-30B-A3B-Instruct"})
    assert "sim.profile" in str(err.value) and "fitted on model tiny-llama" in str(err.value)
    assert "Qwen/Qwen3-Coder-30B-A3B-Instruct" in str(err.value)


def test_the_profile_is_the_studys_not_a_variants(profile_file):
    config = copy.deepcopy(STUDY)
    config["variants"][1]["sim"] = {"profile": str(profile_file)}
    with pytest.raises(ConfigError, match=r"variants\[1\].sim.profile: is the study's"):
        validate_config(config)


# -- the simulator under a fitted profile --------------------------------------------------


def test_a_step_costs_what_the_fitted_terms_say(profile_file):
    config = study_with(profile_file)
    batch = BatchShape(prefill_tokens=100, decode_seqs=3, context_tokens=500, running=4, blocks_in_use=20)
    plain = resolve(*typed(config, config["variants"][0]["name"]), {})
    nixl = resolve(*typed(config, config["variants"][1]["name"]), {})
    assert plain.costs_source == "none" and nixl.costs_source == "calibrated"
    assert "known (calibrated" in nixl.profile
    forward = 3000 + 40 * 100 + 400 * 3 + 0.5 * 500  # 8450
    cost = plain.cost_model.step(batch)
    assert cost.duration_us == pytest.approx(forward) and cost.build_meta_us is None
    assert cost.period_us == pytest.approx(forward + 120)
    assert cost.schedule_us == pytest.approx(150 + 6 * 4)
    cost = nixl.cost_model.step(batch)
    build, finished = 8 + 0.5 * 4, 40 + 3 * 4 + 0.25 * 20
    assert cost.build_meta_us == pytest.approx(build) and cost.get_finished_us == pytest.approx(finished)
    assert cost.start_load_kv_us == pytest.approx(0.0)  # a hook the profile does not list costs nothing
    assert cost.forward_us == pytest.approx(2.0 * forward + 300)
    assert cost.duration_us == pytest.approx(2.0 * forward + 300 + build + finished)
    assert cost.schedule_us == pytest.approx(1.5 * (150 + 6 * 4) + build)


def test_a_variant_the_profile_did_not_fit_keeps_the_hand_set_model_and_says_so(profile_file):
    config = study_with(
        profile_file,
        variants=[{"name": "plain"}, {"name": "mooncake_both", "connector": {"type": "mooncake", "role": "kv_both"}}],
    )
    settings = resolve(*typed(config, config["variants"][1]["name"]), {})
    assert settings.costs_source == "hand-set"
    assert settings.cost_model.step(BatchShape(0, 1, 64, 1, 2)).build_meta_us > 0


def test_hand_set_profiles_are_named_hand_set():
    config = validate_config({**copy.deepcopy(STUDY), "model": {"name": "Qwen/Qwen3-Coder-30B-A3B-Instruct"}})
    settings = resolve(*typed(config, config["variants"][0]["name"]), {})
    assert settings.profile == "tiny-fast (hand-set)" and settings.api is None


def test_api_delays_are_quantile_draws_the_same_for_every_variant():
    assert quantile(tuple(GRID), 0.0) == 1000 and quantile(tuple(GRID), 1.0) == 3000
    assert quantile(tuple(GRID), 0.5) == pytest.approx(2000) and quantile(tuple(GRID), 0.525) == pytest.approx(2050)
    assert quantile((), 0.3) == 0.0
    assert len(QUANTILES) == 27  # GRID is a profile fitted before 2026-12-02: 21 values, every 5 %
    from connector_tax.config.profile import ApiProfile

    api = ApiProfile(tuple(GRID), tuple(GRID))
    a, b = ApiDelays(api, seed=5), ApiDelays(api, seed=5)
    assert [a.draw(i) for i in range(50)] == [b.draw(i) for i in reversed(range(50))][::-1]
    draws = np.array([a.draw(i)[0] for i in range(4000)])
    assert 1000 <= draws.min() and draws.max() <= 3000 and abs(np.median(draws) - 2000) < 60
    assert ApiDelays(None, 5).draw(3) == (0.0, 0.0, 0.0)


def test_api_tail_is_stored_finely_so_one_outlier_does_not_fatten_the_tail():
    """A sample whose top 1 % lies ten times above the rest (the real clock's ingress: q95 0.7 ms,
    max 7.7 ms): the fit's grid keeps draws above q95 near q95; the 5 % grid drew them uniformly up
    to the maximum."""
    rng = np.random.default_rng(3)
    sample = np.concatenate([rng.uniform(400, 700, 990), rng.uniform(2000, 8000, 10)])
    fine = tuple(float(v) for v in np.quantile(sample, QUANTILES))
    coarse = tuple(float(v) for v in np.quantile(sample, LEGACY_QUANTILES))
    assert grid_for(fine) == QUANTILES and grid_for(coarse) == LEGACY_QUANTILES

    u = np.random.default_rng(4).random(20000)
    for q in (97.5, 99.0):
        want = float(np.percentile(sample, q))
        fine_q = float(np.percentile([quantile(fine, x) for x in u], q))
        coarse_q = float(np.percentile([quantile(coarse, x) for x in u], q))
        assert abs(fine_q - want) < 0.05 * want, (q, fine_q, want)
        assert coarse_q > 3 * want, (q, coarse_q, want)  # the old grid's fault, kept readable for old profiles


# -- least squares: what the data identify -------------------------------------------------


def test_least_squares_keeps_the_terms_the_data_identify_and_says_why_it_drops_the_rest():
    rng = np.random.default_rng(0)
    n = 400
    a, b = rng.uniform(0, 10, n), rng.uniform(0, 10, n)
    constant = np.full(n, 7.0)
    y = 50 + 3 * a + rng.normal(0, 0.5, n)  # b plays no part; constant cannot be told from the intercept
    fit = fit_terms("y", y, {"a": a, "b": b, "constant": constant}, intercept="base")
    assert fit.terms["base"].identified and fit.terms["base"].value == pytest.approx(50, abs=0.5)
    assert fit.terms["a"].identified and fit.terms["a"].value == pytest.approx(3, abs=0.05)
    lo, hi = fit.terms["a"].ci
    assert lo < 3 < hi
    assert not fit.terms["b"].identified and fit.terms["b"].value == 0.0 and fit.terms["b"].why
    assert not fit.terms["constant"].identified and "do not vary" in fit.terms["constant"].why
    assert fit.r2 > 0.95 and fit.residual_sd == pytest.approx(0.5, rel=0.15)
    few = fit_terms("y", y[:3], {"a": a[:3]}, intercept="base")
    assert not few.terms["a"].identified and "too few" in few.note


# -- the check's arithmetic ----------------------------------------------------------------


def _row(ttft, ttft_ci, tpot, tpot_ci, step=200.0, engine=10_000.0, rps=2.0):
    return {
        "ttft_ms_p90": ttft,
        "ttft_ms_p90_ci_lo": ttft_ci[0] if ttft_ci else None,
        "ttft_ms_p90_ci_hi": ttft_ci[1] if ttft_ci else None,
        "tpot_ms_p90": tpot,
        "tpot_ms_p90_ci_lo": tpot_ci[0] if tpot_ci else None,
        "tpot_ms_p90_ci_hi": tpot_ci[1] if tpot_ci else None,
        "step_duration_us_p50": step,
        "engine_step_us_p50": engine,
        "effective_rps": rps,
    }


def test_the_checks_arithmetic_against_a_hand_computed_case():
    measured = _row(100.0, (90.0, 110.0), 20.0, (19.0, 21.0))
    predicted = _row(108.0, None, 21.5, None, step=180.0, engine=11_000.0, rps=1.9)
    comp = compare_row(measured, predicted)
    assert comp["ttft_p90_ms"].error == pytest.approx(0.08) and comp["ttft_p90_ms"].inside is True
    assert comp["tpot_p90_ms"].error == pytest.approx(0.075) and comp["tpot_p90_ms"].inside is False
    assert comp["step_p50_us"].error == pytest.approx(-0.1) and comp["step_p50_us"].inside is None
    assert comp["engine_step_p50_us"].error == pytest.approx(0.1)
    assert comp["throughput_rps"].error == pytest.approx(-0.05)
    no_ci = compare_row(_row(50.0, None, 10.0, None), _row(40.0, None, 10.4, None))
    assert no_ci["ttft_p90_ms"].inside is None and no_ci["ttft_p90_ms"].error == pytest.approx(-0.2)

    cells = [
        {"variant": "plain", **{k: c.as_dict() for k, c in comp.items()}},
        {"variant": "x", **{k: c.as_dict() for k, c in no_ci.items()}},
    ]
    taxes_measured = {
        "phase_a": {
            "ref_safe": {"cell": "r2", "variants": {"x": {"ttft_p90": {"value": 0.30, "ci": [0.10, 0.50]}}}},
            "ref_load": {"cell": "r2", "variants": {"x": {"ttft_p90": {"value": 0.30, "ci": [0.10, 0.50]}}}},
        },
        "phase_b": {"cells": {"64x16": {"variants": {"x": {"tpot_p90": {"value": 0.05, "ci": None}}}}}},
    }
    taxes_predicted = {
        "phase_a": {"ref_safe": {"variants": {"x": {"ttft_p90": {"value": 0.55}}}}},
        "phase_b": {"cells": {"64x16": {"variants": {"x": {"tpot_p90": {"value": 0.04}}}}}},
    }
    taxes = compare_taxes(taxes_measured, taxes_predicted)
    assert len(taxes) == 2  # ref_load is the ref_safe cell: counted once
    assert taxes[0]["inside"] is False and taxes[0]["difference"] == pytest.approx(0.25)
    assert taxes[1]["inside"] is None and taxes[1]["difference"] == pytest.approx(-0.01)
    summary = summarize(cells, taxes)
    assert summary["ttft_p90_within_10pct"] == [1, 2]  # +8 % yes, -20 % no
    assert summary["tpot_p90_within_5pct"] == [1, 2]  # +7.5 % no, +4 % yes
    assert summary["ttft_p90_inside_ci"] == [1, 1] and summary["tpot_p90_inside_ci"] == [0, 1]
    assert summary["taxes_inside_ci"] == [0, 1] and summary["taxes_without_ci"] == 1
    assert summary["median_abs_error"]["ttft_p90_ms"] == pytest.approx(0.14)
    assert summary["goals_met"] == {"ttft_p90": False, "tpot_p90": False, "taxes": False}
    assert summary["median_abs_error"]["throughput_rps"] == pytest.approx(0.025)  # |-5 %| and 0


def test_the_anchors_means_and_goals_against_a_hand_computed_case(tmp_path):
    """Means over completed post-warm-up requests (TPOT over the tokens after the first); the
    summary's shares and goals by hand."""
    ms = 1_000_000
    rows = [
        {"t_send_ns": 0, "t_first_token_ns": 10 * ms, "t_last_token_ns": 40 * ms, "completion_tokens": 4},
        {"t_send_ns": 0, "t_first_token_ns": 30 * ms, "t_last_token_ns": 30 * ms, "completion_tokens": 1},
        {
            "t_send_ns": 0,
            "t_first_token_ns": 99 * ms,
            "t_last_token_ns": 999 * ms,
            "completion_tokens": 2,
            "warmup": True,
        },
        {"t_send_ns": 0, "t_first_token_ns": None, "t_last_token_ns": None, "completion_tokens": 0, "status": "error"},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"warmup": False, "status": "ok", **r}) + "\n" for r in rows))
    means = request_means(path)
    assert means["ttft_mean_ms"] == pytest.approx(20.0)  # (10 + 30) / 2
    assert means["tpot_mean_ms"] == pytest.approx(10.0)  # 30 ms over 3 tokens; the one-token request has none
    assert means["e2e_mean_ms"] == pytest.approx(35.0)  # (40 + 30) / 2
    assert request_means(tmp_path / "absent.jsonl") == {k: None for k in means}

    def cell(ttft, tpot, inside):
        m = {"ttft_mean_ms": {"error": ttft}, "tpot_mean_ms": {"error": tpot}, "e2e_mean_ms": {"error": None}}
        return {"means": m, "ttft_p90_ms": {"inside": inside}, "tpot_p90_ms": {"inside": None}}

    comps = [
        {"judged": True, "error": 0.04, "steps": 300},
        {"judged": True, "error": -0.06, "steps": 500},
        {"judged": False, "error": 0.5, "steps": 10},
    ]
    summary = anchor_summary([cell(0.05, 0.049, True), cell(-0.2, 0.06, False)], comps)
    assert summary["ttft_mean_within_10pct"] == [1, 2] and summary["tpot_mean_within_5pct"] == [1, 2]
    assert summary["step_compositions_within_5pct"] == [1, 2] and summary["step_compositions_not_judged"] == 1
    assert summary["steps_judged"] == 800 and summary["ttft_p90_inside_ci"] == [1, 2]
    assert summary["median_abs_error"]["ttft_mean_ms"] == pytest.approx(0.125)
    assert summary["goals_met"] == {
        "ttft_mean": False,
        "tpot_mean": False,
        "step": False,
        "ttft_p90_inside": False,
        "tpot_p90_inside": False,  # nothing to judge is not met
    }
