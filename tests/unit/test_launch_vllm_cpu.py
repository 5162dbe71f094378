"""The `vllm serve` launch on a CPU host (vllm.device: cpu) and the installed-version checks,
without running vLLM: a fake `vllm` console script whose interpreter reports a version."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typed import study_of, typed

from connector_tax.config import ConfigError, StudyConfig, load_config, load_study
from connector_tax.config.vllm_rules import device
from connector_tax.launch import vllm as launch
from connector_tax.launch import vllm_cpu, vllm_install
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.server_process import ServerStartError, root_cause

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"


def fake_vllm(tmp_path: Path, distributions: dict[str, str], serve: str = "print('fake')\n") -> Path:
    """A `vllm` script (body `serve`) whose Python has the given distributions' metadata (no vLLM
    at all) in tmp_path/site, ahead of the caller's PYTHONPATH."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    for name, version in distributions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    script = tmp_path / "vllm"
    script.write_text(f"#!{python}\n{serve}")
    script.chmod(0o755)
    return script


@pytest.fixture()
def cpu(tmp_path) -> dict:
    config = copy.deepcopy(load_config(CPU))
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(fake_vllm(tmp_path / "env", {"vllm-cpu": "0.32.0"}))
    return config


def spec(config: dict, name: str = "plain", step_log: str | None = None):
    return launch.vllm_command(*typed(config, name), 18000, step_log)


def test_cpu_launch_argv_and_env(cpu, tmp_path):
    s = spec(cpu, "noop_connector", str(tmp_path / "steps.jsonl"))
    argv = s.argv
    assert argv[:3] == [cpu["vllm"]["executable"], "serve", cpu["model"]["name"]]
    assert "--gpu-memory-utilization" not in argv  # VLLM_CPU_KVCACHE_SPACE sizes the cache
    assert argv[argv.index("--block-size") + 1] == "32"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert "--enforce-eager" in argv and launch.HMA_FLAG in argv
    assert argv[argv.index("--served-model-name") + 1] == "tiny-llama"
    env = s.env
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_CACHE_ROOT"] == str(launch.repo_root() / "results" / ".vllm-cache")
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_a_gpu_launch_gets_none_of_the_cpu_settings(cpu):
    config = copy.deepcopy(cpu)
    config["vllm"]["device"] = "cuda"
    s = spec(config)
    assert "--gpu-memory-utilization" in s.argv
    assert not any(k.startswith(("VLLM_CPU_", "VLLM_TARGET")) for k in s.env)


def test_no_gpu_lease_on_cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: a cuda lease would fail
    with gpu_lease("vllm", device="cpu") as gpu:
        assert gpu is None
    with pytest.raises(RuntimeError, match="needs a GPU"):
        with gpu_lease("vllm", device="cuda"):
            pass
    assert device(load_config(CPU)) == "cpu"
    assert device(load_config(REPO / "configs" / "h20-qwen3-coder.yaml")) == "cuda"


def test_the_cpu_block_size_rule_is_checked_before_a_launch(cpu):
    config = copy.deepcopy(cpu)
    config["server"]["block_size"] = 16
    with pytest.raises(ConfigError, match=r"^server\.block_size: 16: vLLM on CPU needs a multiple of 32"):
        spec(config)


def test_a_missing_local_model_is_one_line_naming_the_key(cpu, tmp_path):
    config = copy.deepcopy(cpu)
    config["model"]["name"] = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError) as err:
        spec(config)
    assert str(err.value).startswith("model.name: ") and "tools/tiny_model.py" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_relative_local_model_is_resolved_from_the_repository_root(cpu):
    config = copy.deepcopy(cpu)
    config["model"]["name"] = "tools"  # any existing folder with a config.json would do
    with pytest.raises(ConfigError, match=str(REPO / "tools")):
        spec(config)


def test_installed_version_is_read_from_both_distribution_names(tmp_path):
    cpu_build = vllm_install.installed_vllm(str(fake_vllm(tmp_path / "a", {"vllm-cpu": "0.32.0"})))
    assert (cpu_build.version, cpu_build.cpu_build, cpu_build.release) == ("0.32.0", True, (0, 32, 0))
    shim = vllm_install.installed_vllm(str(fake_vllm(tmp_path / "b", {"vllm": "0.32.0+cpu"})))
    assert (shim.version, shim.cpu_build) == ("0.32.0", True)
    gpu = vllm_install.installed_vllm(str(fake_vllm(tmp_path / "c", {"vllm": "0.33.0"})))
    assert (gpu.version, gpu.cpu_build) == ("0.33.0", False)
    with pytest.raises(ValueError, match="has no vllm installed"):
        vllm_install.installed_vllm(str(fake_vllm(tmp_path / "d", {})))
    with pytest.raises(ValueError, match="not found"):
        vllm_install.installed_vllm(str(tmp_path / "missing" / "vllm"))


def test_a_flag_the_installed_vllm_lacks_is_refused_with_its_key(cpu):
    config = copy.deepcopy(cpu)
    config["server"]["extra_args"] = ["--watchdog-config", "{}"]
    with pytest.raises(
        ConfigError, match=r"^server\.extra_args: --watchdog-config needs vLLM >= 0\.33; .* is vLLM 0\.32\.0"
    ):
        spec(config)


def test_a_flag_of_0_33_passes_on_0_33(cpu, tmp_path):
    config = copy.deepcopy(cpu)
    config["vllm"]["executable"] = str(fake_vllm(tmp_path / "new", {"vllm": "0.33.0"}))
    config["server"]["extra_args"] = ["--watchdog-config", "{}"]
    assert "--watchdog-config" in spec(config).argv


def test_launch_command_prints_the_cpu_launch(cpu, tmp_path):
    path = tmp_path / "cpu.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cpu))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "connector_tax.cli",
            "launch-command",
            "--config",
            str(path),
            "--variant",
            "plain",
            "--script",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert "export VLLM_TARGET_DEVICE=cpu" in done.stdout and "--load-format dummy" in done.stdout


def test_describe_says_cpu_and_dummy_weights(cpu):
    assert vllm_cpu.describe(study_of(cpu), "0.32.0") == "vLLM 0.32.0 on CPU, dummy weights"
    h20 = load_config(REPO / "configs" / "h20-qwen3-coder.yaml")
    assert vllm_cpu.describe(study_of(h20), None) == "vLLM 0.33.0 (configured) on GPU"


def test_runs_record_what_served_them_and_the_mooncake_transport(cpu):
    from connector_tax.launch.provenance import mooncake_transport, served_by

    study = StudyConfig.from_mapping(cpu)
    assert served_by(study, {"vllm-cpu": "0.32.0"}) == "vLLM 0.32.0 on CPU, dummy weights"
    assert served_by(study, {"vllm": "0.32.0+cpu"}) == "vLLM 0.32.0 on CPU, dummy weights"
    assert served_by(load_study(REPO / "configs" / "default.yaml"), {}) == "simulated vLLM (ctax sim)"
    assert mooncake_transport(study, study.variant("mooncake_both")) == "tcp"
    assert mooncake_transport(study, study.variant("multi_mooncake_lmcache")) == "tcp"
    assert mooncake_transport(study, study.variant("plain")) is None
    rdma = copy.deepcopy(cpu)
    rdma["vllm"]["mooncake"] = {"protocol": "rdma", "device_name": "mlx5_0"}
    rdma_study = StudyConfig.from_mapping(rdma)
    assert mooncake_transport(rdma_study, rdma_study.variant("mooncake_both")) == "rdma (mlx5_0)"


@pytest.mark.parametrize(
    "log, cause",
    [
        (
            "x\nImportError: NIXL is not available\nRuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
            "NIXL is not available",
        ),
        ("(EngineCore pid=1) RuntimeError: Mooncake is not available\nmore\n", "Mooncake is not available"),
        ("ModuleNotFoundError: No module named 'lmcache'\nlast line\n", "No module named 'lmcache'"),
        ("Traceback\n  File x\nValueError: bad block size\nshutting down\n", "ValueError: bad block size"),
        ("just a last line\n", "just a last line"),
        (  # vLLM 0.32 on CPU, MooncakeConnector without the CPU guard (stderr, as it printed it)
            "(APIServer pid=9) WARNING [system_utils.py:255] Found ulimit of 20000 and failed to automatically "
            "increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
            "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n\n"
            "Exception ignored in: <function MooncakeConnectorWorker.__del__ at 0x7f6912742fc0>\n"
            'Traceback (most recent call last):\n  File "mooncake_connector.py", line 1400, in __del__\n'
            "AttributeError: 'MooncakeConnectorWorker' object has no attribute 'async_zmq_ctx'\n"
            'Traceback (most recent call last):\n  File "core.py", line 1500, in run_engine_core\n'
            "RuntimeError: Worker failed with error 'Cannot access accelerator device when none is available.', "
            "please check the stack trace above for the root cause\n"
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
            "Cannot access accelerator device when none is available.",
        ),
        (  # a __del__ report alone is never the cause: the exception after it is
            "Exception ignored in: <function W.__del__>\nTraceback\nAttributeError: no attribute 'x'\n"
            "ValueError: the real one\n",
            "ValueError: the real one",
        ),
    ],
)
def test_a_failed_start_reports_the_root_cause_not_the_last_line(log, cause):
    assert root_cause(log) == cause
    assert str(ServerStartError("server exited with code 1", log)) == f"server exited with code 1: {cause}"


def test_a_connector_that_comes_up_degraded_is_named_with_its_cause():
    from connector_tax.serving.server_process import degraded

    log = (
        "[LMCache ERROR] Failed to initialize LMCacheManager components: Traceback (most recent call last):\n"
        '  File "gpu_connector/__init__.py", line 247, in CreateGPUConnector\n'
        "RuntimeError: No supported cpu connector found.\n"
        ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)\n"
        "INFO:     Application startup complete.\n"
    )
    assert (
        degraded(log) == "No supported cpu connector found. (LMCache: System will operate in degraded mode (recompute))"
    )
    assert degraded("INFO:     Application startup complete.\n") is None


def test_the_cpu_config_is_valid_and_names_every_study_variant():
    config = load_config(CPU)
    names = [v["name"] for v in config["variants"]]
    h20 = [v["name"] for v in load_config(REPO / "configs" / "h20-qwen3-coder.yaml")["variants"]]
    assert names == h20[:8]  # the study's eight (the H20 study adds LMCache's MP mode apart)
    assert config["backend"] == "vllm" and config["vllm"]["device"] == "cpu"
    assert json.dumps(config)  # plain data
