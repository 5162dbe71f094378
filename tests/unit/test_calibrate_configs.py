"""The calibration's shipped files: the profile fitted on the CPU study, the simulated config that
uses it, the held-out CPU study, the GPU calibration config; and `ctax plan` with a profile's
measured job times."""

from __future__ import annotations

import copy

import pytest
from study_runner import REPO

from connector_tax.config import load_config, load_study
from connector_tax.config.profile import check_model, read_profile
from connector_tax.metrics.threads import IDLE_WINDOW_S
from connector_tax.planning.time_estimate import (
    OVERHEADS,
    Timing,
    as_dict,
    default_launch_s,
    gpu_seconds,
    plan_study,
    render,
)

CONFIGS = REPO / "configs"


def test_the_cpu_profile_is_a_calibrated_profile_of_the_cpu_studys_model():
    profile = read_profile(CONFIGS / "profiles" / "vllm-cpu-tiny.yaml")
    assert profile.kind == "calibrated" and profile.provenance["study"] == "vllm-cpu-tiny"
    assert profile.provenance["served_by"] == "vLLM 0.32.0 on CPU, dummy weights"
    assert profile.provenance["cells"] and all(c["fingerprint"] for c in profile.provenance["cells"])
    check_model(profile, load_config(CONFIGS / "vllm-cpu-tiny.yaml"))  # raises if not
    for term in ("step_base_us", "prefill_token_us"):  # what the CPU study's steps always identify
        assert profile.hardware[term] > 0 and profile.fit["engine_step"]["terms"][term]["identified"], term
    for term, fit in profile.fit["engine_step"]["terms"].items():  # the others: a value, or why not
        assert (fit["identified"] and profile.hardware[term] > 0) or (not fit["identified"] and fit["why"]), term


def test_the_simulated_cpu_study_runs_on_the_calibrated_profile_with_the_cpu_studys_workload():
    sim = load_config(CONFIGS / "sim-vllm-cpu-tiny.yaml")
    real = load_config(CONFIGS / "vllm-cpu-tiny.yaml")
    assert sim["backend"] == "sim" and sim["sim"]["clock"] == "virtual"
    assert sim["sim"]["profile"] == "configs/profiles/vllm-cpu-tiny.yaml"
    assert sim["workload"] == real["workload"] and sim["seed"] == real["seed"]
    profile = read_profile(sim["sim"]["profile"])
    for variant in sim["variants"]:  # every variant on fitted costs, none on the hand-set model
        if variant.get("connector"):
            assert profile.variant_for(variant["name"], variant["connector"]) is not None, variant["name"]


def test_the_held_out_study_is_the_cpu_study_but_for_its_name_seed_and_rates():
    held = load_config(CONFIGS / "vllm-cpu-tiny-heldout.yaml")
    real = load_config(CONFIGS / "vllm-cpu-tiny.yaml")
    assert held["study"] != real["study"] and held["seed"] != real["seed"]
    assert set(held["workload"]["phase_a"]["rates"]).isdisjoint(real["workload"]["phase_a"]["rates"])
    same = copy.deepcopy(held)
    same.update(study=real["study"], seed=real["seed"])
    same["workload"]["phase_a"]["rates"] = real["workload"]["phase_a"]["rates"]
    assert same == real


def test_the_gpu_calibration_config_is_small_and_shares_the_full_studys_model_and_server():
    small = load_study(CONFIGS / "h20-calibrate.yaml")
    full = load_config(CONFIGS / "h20-qwen3-coder.yaml")
    assert small.names == ["plain", "mooncake_both"]
    assert small.raw["model"] == full["model"] and small.raw["server"] == full["server"]
    assert small.raw["workload"]["phase_a"]["shape"] == full["workload"]["phase_a"]["shape"]
    estimates, _ = plan_study(small)
    assert sum(e.seconds for e in estimates) < 30 * 60  # about 20 GPU-minutes by the rules


def test_a_plan_with_measured_job_times_uses_them_and_the_calibrations_skips():
    study = load_study(CONFIGS / "vllm-cpu-tiny.yaml")
    timing = Timing(
        preflight_s=60.0,
        preflight_skip_s=4.0,
        phase_overhead_s=50.0,
        phase_skip_s=1.0,
        other_s=40.0,
        skipped=frozenset({"lmcache_only"}),
        source="a test",
    )
    estimates, notes = plan_study(study, timing=timing)
    by = {(e.stage, e.variant): e for e in estimates}
    assert by[("preflight", "lmcache_only")].seconds == 4.0
    # vllm.preflight_launch: gated: only a verify script's variant launches in the preflight
    assert by[("preflight", "noop_connector")].seconds == 60.0 and by[("preflight", "plain")].seconds == 4.0
    assert by[("phase_a", "lmcache_only")].seconds == 1.0 and by[("phase_a", "lmcache_only")].cells == 0
    without, _ = plan_study(study)
    plain_a = next(e for e in without if (e.stage, e.variant) == ("phase_a", "plain"))
    # LAUNCH_S and the generic job time replaced by the measured phase overhead
    generic = default_launch_s(study) + OVERHEADS[study.backend].job_s + IDLE_WINDOW_S
    assert by[("phase_a", "plain")].seconds == pytest.approx(plain_a.seconds - generic + 50.0)
    assert by[("other", "(study)")].seconds == 40.0
    assert any("measured by the calibration study (a test)" in n and "lmcache_only assumed SKIP" in n for n in notes)


def test_a_cpu_study_plan_holds_no_gpu_and_says_what_start_up_it_assumed():
    study = load_study(CONFIGS / "vllm-cpu-tiny.yaml")
    estimates, notes = plan_study(study)
    assert gpu_seconds(study, estimates) == 0.0 and as_dict(study, estimates, notes)["gpu_hours"] is None
    assert "no GPU held (vLLM on CPU)" in render(study, estimates, notes, gpus=8)
    # the tiny model's measured ~24 s a launch, not a GPU's 150 s of model load
    assert any("start-up assumed 24 s (vLLM's CPU build" in n for n in notes)


def test_a_simulated_study_plan_takes_the_simulators_overheads_and_counts_its_analysis(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/ here: the plan from the rules alone
    study = load_study(CONFIGS / "default.yaml")
    estimates, notes = plan_study(study)
    sim, vllm = OVERHEADS["sim"], OVERHEADS["vllm"]
    assert sim.launch_s < 1 < vllm.launch_s and sim.job_s < vllm.job_s and sim.cell_s < vllm.cell_s
    pre = [e for e in estimates if e.stage == "preflight"]
    assert all(e.seconds == pytest.approx(sim.launch_s + sim.checks_s + sim.job_s) for e in pre)
    assert [e.seconds for e in estimates if e.stage == "other"] == [sim.other_s]
    text = render(study, estimates, notes, gpus=1)
    # minutes, not "preflight 0.00 h", for a study of minutes
    assert "per stage, one job at a time: preflight 0.2 min, phase_a" in text, text
    assert any("start-up assumed 0.45 s (the simulator's" in n for n in notes)
