"""Replicated, interleaved launches and the A/A control: the config, the order, the layout."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from typed import typed

from connector_tax.config import (
    PHASE_A,
    PHASE_B,
    ConfigError,
    StudyConfig,
    launch_order,
    load_config,
    run_order,
    validate_config,
)
from connector_tax.config.cells import launch_seed
from connector_tax.contract import StudyLayout
from connector_tax.sim.costs import BatchShape
from connector_tax.sim.settings import resolve

REPO = Path(__file__).resolve().parents[2]


def _config(**workload) -> dict:
    config = copy.deepcopy(load_config(REPO / "configs" / "default.yaml"))
    config["workload"].update(workload)
    return validate_config(config)


def test_one_replicate_keeps_the_run_order_and_the_layout():
    study = StudyConfig.from_mapping(_config())
    assert study.workload.replicates == 1 and not study.workload.aa_control
    for phase in (PHASE_A, PHASE_B):
        assert launch_order(study, phase) == [(n, 1) for n in run_order(study, phase)]
    layout = StudyLayout(Path("results/default"))
    assert layout.phase("plain", PHASE_A).folder == Path("results/default/plain/phase_a")
    assert layout.index("plain", PHASE_B) == Path("results/default/plain/phase_b/run.json")
    assert layout.phase("plain", "phase_b_prime").index == Path("results/default/plain/phase_b/run.json")


def test_replicates_run_in_interleaved_rounds_every_variant_once_per_round():
    study = StudyConfig.from_mapping(_config(replicates=3))
    for phase in (PHASE_A, PHASE_B):
        order = launch_order(study, phase)
        n = len(study.names)
        assert len(order) == 3 * n
        for k in range(3):
            round_ = order[k * n : (k + 1) * n]
            assert sorted(name for name, _ in round_) == sorted(study.names)  # the baseline too
            assert {r for _, r in round_} == {k + 1}
        assert all(a[0] != b[0] for a, b in zip(order, order[1:]))  # never twice in a row
        assert [name for name, _ in order[:n]] == run_order(study, phase)  # round 1 as without replicates
    assert launch_order(study, PHASE_A) != launch_order(study, PHASE_B)
    assert launch_order(study, PHASE_A) == launch_order(StudyConfig.from_mapping(_config(replicates=3)), PHASE_A)


def test_replicate_folders_and_launch_seeds():
    layout = StudyLayout(Path("results/s"))
    two = layout.phase("plain", "phase_b_prime", 2)
    assert two.folder == Path("results/s/plain/phase_b_prime.r2")
    assert two.index == Path("results/s/plain/phase_b.r2/run.json")
    seeds = {launch_seed(1, v, p, r) for v in ("plain", "plain_aa") for p in (PHASE_A, PHASE_B) for r in (1, 2)}
    assert len(seeds) == 8  # every launch draws its own
    assert launch_seed(1, "plain", PHASE_A, 2) == launch_seed(1, "plain", PHASE_A, 2)


def test_the_aa_control_is_the_baseline_again_and_stays_one():
    config = _config(aa_control=True)
    names = [v["name"] for v in config["variants"]]
    assert names[-1] == "plain_aa" and names.count("plain_aa") == 1
    aa = config["variants"][-1]
    assert aa["aa_of"] == "plain" and "connector" not in aa
    assert "plain_aa" in config["workload"]["phase_b_prime"]["variants"]  # beside plain in Phase B'
    assert validate_config(copy.deepcopy(config)) == config  # the staged copy validates to itself
    assert StudyConfig.from_mapping(config).aa_controls == {"plain_aa": "plain"}
    same = [resolve(*typed(config, name), {}) for name in ("plain", "plain_aa")]
    assert same[0].cost_model.terms == same[1].cost_model.terms is None and same[0].engine == same[1].engine


def test_an_aa_control_of_a_connector_variant_copies_its_settings():
    config = copy.deepcopy(load_config(REPO / "configs" / "default.yaml"))
    config["variants"].append({"name": "nixl_again", "aa_of": "nixl_both"})
    config = validate_config(config)
    again = next(v for v in config["variants"] if v["name"] == "nixl_again")
    assert again["connector"] == next(v for v in config["variants"] if v["name"] == "nixl_both")["connector"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda c: c["variants"].append({"name": "x", "aa_of": "nope"}), "variants[8].aa_of"),
        (lambda c: c["workload"].update(replicates=0), "workload.replicates"),
        (lambda c: c["workload"].update(aa_control=True) or c["variants"].append({"name": "plain_aa"}), "aa_control"),
        (
            lambda c: c["workload"].update(replicates=2) or c["variants"].append({"name": "plain_rep2"}),
            "workload.replicates",
        ),
        (lambda c: c["variants"][1].update(sim={"launch_bias_sd": 0.1}), "variants[1].sim.launch_bias_sd"),
    ],
)
def test_bad_replicate_settings_are_one_line_naming_the_key(change, key):
    config = copy.deepcopy(load_config(REPO / "configs" / "default.yaml"))
    change(config)
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_the_launch_bias_is_a_seeded_speed_factor_off_by_default():
    config = _config()
    plain = config["variants"][0]["name"]
    assert resolve(*typed(config, plain), {}, launch_seed=123).speed_factor == 1.0  # off by default
    config["sim"]["launch_bias_sd"] = 0.05
    factors = [resolve(*typed(config, plain), {}, launch_seed=s).speed_factor for s in range(200)]
    assert factors == [resolve(*typed(config, plain), {}, launch_seed=s).speed_factor for s in range(200)]
    logs = [math.log(f) for f in factors]
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) ** 0.5
    assert abs(mean) < 0.01 and 0.04 < sd < 0.06
    assert resolve(*typed(config, plain), {}).speed_factor == 1.0  # no launch seed: the nominal engine
    mooncake = typed(config, "mooncake_both")
    fast, slow = (resolve(*mooncake, {}, launch_seed=s) for s in (factors.index(min(factors)), 0))
    batch = BatchShape(prefill_tokens=512, decode_seqs=4, context_tokens=2048, running=5, blocks_in_use=64)
    unbiased = {**config, "sim": {**config["sim"], "launch_bias_sd": 0}}
    nominal = resolve(*typed(unbiased, "mooncake_both"), {}).cost_model.step(batch)
    for s in (fast, slow):
        cost = s.cost_model.step(batch)
        assert cost.duration_us == pytest.approx(nominal.duration_us * s.speed_factor)
        assert cost.build_meta_us == pytest.approx(nominal.build_meta_us * s.speed_factor)
