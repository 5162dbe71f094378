"""Interventions from the declaration alone (issue 65, item 1): connector-tax's own variables reach a
server only from its launch. One exported in the caller's shell (CONNECTOR_TAX_INTERVENTIONS, the
step log's, the evidence folder's) never reaches a variant that does not declare it, neither
through the phase job's launch nor through launch.sh run by bash (what tools/verify_*.sh do);
`env` may not set one; and two interventions that cannot both act are refused by the config
check. Through `snakemake`: tests/e2e/test_interventions_study.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typed import typed

from connector_tax.config import ConfigError, load_config, validate_config
from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV
from connector_tax.contract.records import STEP_LOG_ENV
from connector_tax.launch.command import launch_spec
from connector_tax.serving.server_process import ServerProcess
from connector_tax.serving.spec import LaunchSpec

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"
GPU = REPO / "configs" / "h20-qwen3-coder.yaml"
OWN = (INTERVENTIONS_ENV, STEP_LOG_ENV, EVIDENCE_ENV)
DUMP = [sys.executable, "-c", "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"]


def _cpu(step_timing: bool = True, model: Path | None = None) -> dict:
    config = copy.deepcopy(load_config(CPU))
    config["vllm"]["step_timing"] = step_timing
    if model is not None:  # a local model folder, as the launch checks it
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text("{}")
        config["model"]["name"] = str(model)
    config["variants"] = [
        {"name": "plain"},
        {"name": "nixl_both", "connector": {"type": "nixl", "role": "kv_both"}},
        {"name": "nixl_off", "connector": {"type": "nixl", "role": "kv_both"}, "interventions": ["nixl_progress_off"]},
    ]
    return validate_config(config)


def _seen_by(spec: LaunchSpec, out: Path, tmp: Path) -> tuple[dict, dict]:
    """The environment a process launched from `spec` gets: by the phase job's ServerProcess, and by
    bash running the launch.sh it wrote (with the caller's environment, as a verify script runs it)."""
    dump = LaunchSpec([*DUMP, str(out)], env=spec.env, unset=spec.unset)
    with ServerProcess(dump, "http://127.0.0.1:1", tmp) as server:
        assert server.proc is not None
        server.proc.wait(30)
    launched = json.loads(out.read_text())
    done = subprocess.run(["bash", str(tmp / "launch.sh")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return launched, json.loads(out.read_text())


@pytest.mark.parametrize("step_timing", [True, False])
def test_an_exported_variable_never_reaches_a_variant_that_does_not_declare_it(tmp_path, monkeypatch, step_timing):
    for name in OWN:
        monkeypatch.setenv(name, "nixl_progress_delay_1ms" if name == INTERVENTIONS_ENV else "/tmp/not-this-launch")
    config = _cpu(step_timing, tmp_path / "model")
    step_log, evidence = tmp_path / "steps.jsonl", tmp_path / "evidence"
    for name in ("plain", "nixl_both", "nixl_off"):
        spec = launch_spec(str(CPU), *typed(config, name), 8000, str(step_log), evidence=str(evidence))
        folder = tmp_path / name
        folder.mkdir()
        for how, env in zip(("ServerProcess", "launch.sh"), _seen_by(spec, folder / "env.json", folder)):
            got = {k: env.get(k) for k in OWN}
            assert got == {
                INTERVENTIONS_ENV: "nixl_progress_off" if name == "nixl_off" else None,
                STEP_LOG_ENV: str(step_log) if step_timing else None,
                EVIDENCE_ENV: str(evidence) if name == "nixl_off" else None,
            }, (name, how)
        script = (folder / "launch.sh").read_text()
        unset = next(line for line in script.splitlines() if line.startswith("unset "))
        assert (INTERVENTIONS_ENV in unset) is (name != "nixl_off"), script
        assert (STEP_LOG_ENV in unset) is not step_timing
        assert f"export {INTERVENTIONS_ENV}" not in script or name == "nixl_off"


@pytest.mark.parametrize(
    "where, set_it",
    [
        (
            "variants[1].env.CONNECTOR_TAX_INTERVENTIONS",
            lambda c: c["variants"][1].update(env={INTERVENTIONS_ENV: "x"}),
        ),
        ("vllm.env.CONNECTOR_TAX_INTERVENTIONS", lambda c: c["vllm"].update(env={INTERVENTIONS_ENV: "x"})),
        ("vllm.env.CONNECTOR_TAX_STEP_LOG", lambda c: c["vllm"].update(env={STEP_LOG_ENV: "/tmp/s.jsonl"})),
        ("variants[0].env.CONNECTOR_TAX_EVIDENCE", lambda c: c["variants"][0].update(env={EVIDENCE_ENV: "/tmp"})),
    ],
)
def test_env_may_not_set_connector_taxs_own_variables(where, set_it):
    config = copy.deepcopy(load_config(CPU))
    set_it(config)
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value).startswith(f"{where}: is connector-tax's own") and "\n" not in str(err.value)


def test_config_check_fails_and_no_launch_script_is_printed_for_one_set_in_env(tmp_path):
    """What a user sees: `ctax config check` and `ctax launch-command --script` refuse in one line."""
    config = copy.deepcopy(load_config(CPU))
    config["variants"][5]["env"] = {INTERVENTIONS_ENV: "nixl_progress_off"}
    where = "variants[5].env.CONNECTOR_TAX_INTERVENTIONS"
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    ctax = [sys.executable, "-m", "connector_tax.cli"]
    check = subprocess.run([*ctax, "config", "check", "--static", str(path)], capture_output=True, text=True)
    assert check.returncode == 2 and where in check.stderr and len(check.stderr.strip().splitlines()) == 1
    for name in ("plain", "nixl_both"):  # no launch.sh is printed, with or without the export
        printed = subprocess.run(
            [*ctax, "launch-command", "--config", str(path), "--variant", name, "--script"],
            capture_output=True,
            text=True,
        )
        assert printed.returncode == 2 and printed.stdout == "" and where in printed.stderr


def test_two_interventions_that_cannot_both_act_are_refused(tmp_path):
    config = _cpu()
    config["variants"][2]["interventions"] = ["nixl_progress_off", "nixl_progress_delay_1ms"]
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value) == (
        "variants[2].interventions[1]: nixl_progress_delay_1ms conflicts with nixl_progress_off: the delay is "
        "the progress thread's, which nixl_progress_off removes"
    )
    config["variants"][2]["interventions"] = ["nixl_progress_delay_1ms", "nixl_progress_off"]  # either order
    with pytest.raises(ConfigError, match=r"^variants\[2\]\.interventions\[1\]: nixl_progress_off conflicts"):
        validate_config(config)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "config", "check", "--static", str(path)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 2 and "conflicts with nixl_progress_delay_1ms" in check.stderr


def test_the_cpu_guard_is_refused_where_it_could_never_act():
    """On an accelerator the guard leaves the constructor alone, so it would never be seen acting:
    a GPU study may not declare it (a CPU one must, for Mooncake)."""
    config = copy.deepcopy(load_config(GPU))
    i = next(i for i, v in enumerate(config["variants"]) if v["name"] == "mooncake_both")
    config["variants"][i]["interventions"] = ["mooncake_cpu_guard"]
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value).startswith(f"variants[{i}].interventions[0]: mooncake_cpu_guard acts only on a host without")


def test_a_sidecar_gets_none_of_them_either(tmp_path, monkeypatch):
    """A sidecar (an LMCache server) is launched through the same LaunchSpec: nothing of ours."""
    for name in OWN:
        monkeypatch.setenv(name, "leaked")
    out = tmp_path / "env.json"
    with ServerProcess(LaunchSpec([*DUMP, str(out)], env={"X": "1"}), "http://127.0.0.1:1", tmp_path) as server:
        assert server.proc is not None
        server.proc.wait(30)
    env = json.loads(out.read_text())
    assert env["X"] == "1" and not any(name in env for name in OWN) and os.environ[INTERVENTIONS_ENV] == "leaked"
