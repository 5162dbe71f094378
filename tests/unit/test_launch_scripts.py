"""launch_scripts/launch_<variant>.sh are the real study's launches, current and exact: regenerated from
configs/h20-qwen3-coder.yaml they are byte for byte what is checked in, and run with a stand-in
`vllm` they exec the argv and environment the pipeline itself would launch with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typed import typed

from connector_tax.config import load_config
from connector_tax.launch.command import launch_spec
from connector_tax.launch.scripts import script, write_scripts

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "configs" / "h20-qwen3-coder.yaml"
NAMES = [v["name"] for v in load_config(STUDY)["variants"]]


def test_the_checked_in_scripts_are_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the scripts name the config as the command does: relative to the checkout
    written = write_scripts("configs/h20-qwen3-coder.yaml", tmp_path)
    shipped = sorted(p.name for p in (REPO / "launch_scripts").glob("launch_*.sh"))
    assert sorted(p.name for p in written) == shipped == sorted(f"launch_{n}.sh" for n in NAMES)
    stale = [p.name for p in written if p.read_text() != (REPO / "launch_scripts" / p.name).read_text()]
    assert not stale, (
        f"regenerate: ctax launch-command --config configs/h20-qwen3-coder.yaml --write-scripts launch_scripts/ ({stale})"
    )


@pytest.mark.parametrize("name", NAMES)
def test_a_script_execs_the_pipelines_own_launch(name: str, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}))\n"
    )
    fake.chmod(0o755)
    step_log = tmp_path / "steps.jsonl"
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "PORT": "9100", "STEP_LOG": str(step_log)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", str(REPO / "launch_scripts" / f"launch_{name}.sh")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout)
    config = load_config(STUDY)
    spec = launch_spec(STUDY, *typed(config, name), 9100, str(step_log))
    assert ["vllm", *ran["argv"]] == spec.argv
    for key, value in spec.env.items():
        assert ran["env"][key] == value, key
    assert ran["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # as the pipeline's GPU lease sets it


def test_a_script_names_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    text = script("configs/h20-qwen3-coder.yaml", "plain")
    assert "--write-scripts launch_scripts/" in text and 'PORT="${PORT:-8000}"' in text
