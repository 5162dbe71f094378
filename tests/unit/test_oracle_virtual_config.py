"""A virtual-time study's refusals before anything runs: a variant cannot set the clock of its own, and
`ctax plan --predict` needs a profile of the server. The studies themselves:
tests/e2e/test_oracle_virtual_study.py."""

from __future__ import annotations

import copy
import subprocess
import sys

from study_runner import REPO, TINY, snakemake, write_config


def virtual(study: str) -> dict:
    config = copy.deepcopy(TINY)
    config["study"] = study
    config["sim"]["clock"] = "virtual"
    config["workload"]["min_completed"] = 20  # in virtual time a bigger cell costs nothing here
    return config


def test_a_config_cannot_set_the_clock_of_its_own(tmp_path):
    config = virtual("own-clock")
    config["variants"][1]["sim"] = {"clock": "real"}
    result = snakemake(tmp_path, write_config(tmp_path, config), "all")
    assert result.returncode != 0
    assert "variants[1].sim.clock" in result.stderr and "top-level" in result.stderr


def _ctax(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "connector_tax.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_ctax_plan_predict_needs_a_profile_of_the_server(tmp_path):
    result = _ctax("plan", "--config", str(REPO / "configs" / "vllm-cpu-tiny.yaml"), "--predict", cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ctax plan: --predict: the config names no sim.hardware_profile or sim.profile for its server "
        "(or give --profile FILE)"
    )


def test_a_virtual_job_takes_one_core_and_the_prediction_runs_them_side_by_side(tmp_path, monkeypatch):
    """Virtual time launches no server and measures nothing on this host: a phase job computes its
    cells on one core, and `ctax plan --predict` gives snakemake every core it may use."""
    from connector_tax.config import load_study
    from connector_tax.planning import predict as predict_module
    from connector_tax.planning.time_estimate import job_threads

    config = virtual("cores")
    real = load_study(write_config(tmp_path, {**config, "sim": {**config["sim"], "clock": "real"}}))
    study = load_study(write_config(tmp_path, config))
    assert job_threads(real) == 2 + real.loadgen.workers  # the load generator and the simulator
    assert job_threads(study) == 1
    argvs: list[list[str]] = []

    def run(argv, **_):
        argvs.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(predict_module.subprocess, "run", run)
    monkeypatch.setattr(predict_module.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    predict_module.predict(real, tmp_path / "work")
    assert argvs[0][argvs[0].index("--cores") + 1] == "4"


def test_a_cpu_study_s_virtual_twin_drops_what_acts_inside_vllm(tmp_path):
    """The CPU study declares Mooncake's CPU guard, an intervention loaded into vLLM's processes;
    its virtual twin (what `ctax plan --predict` and `ctax calibrate --check` run) has no vLLM, so
    it drops them, and the twin passes the config check (it was refused: backend vllm only)."""
    from connector_tax.config import load_study

    study = load_study(REPO / "configs" / "vllm-cpu-tiny.yaml")
    assert any(v.get("interventions") for v in study.raw["variants"])
    twin = study.virtual(str(REPO / "configs" / "profiles" / "vllm-cpu-tiny.yaml"))
    assert twin["backend"] == "sim" and not any("interventions" in v for v in twin["variants"])
    assert [v["name"] for v in twin["variants"]] == [v["name"] for v in study.raw["variants"]]
    assert load_study(write_config(tmp_path, twin)).backend == "sim"
    assert any(v.get("interventions") for v in study.raw["variants"])  # the study's own config untouched
