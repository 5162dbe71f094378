"""The `vllm serve` launch of each connector configuration (src/connector_tax/launch/vllm.py)."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typed import study_of, typed

from connector_tax.config import ConfigError, find_variant, load_config, validate_config
from connector_tax.launch import vllm as launch
from connector_tax.launch.command import launch_spec

REPO = Path(__file__).resolve().parents[2]
H20 = REPO / "configs" / "h20-qwen3-coder.yaml"


@pytest.fixture(scope="module")
def h20() -> dict:
    return load_config(H20)


def spec_of(config: dict, name: str, port: int = 8000, step_log: str | None = None):
    return launch.vllm_command(*typed(config, name), port, step_log)


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def ktc_of(config: dict, name: str) -> dict | None:
    argv = spec_of(config, name).argv
    if "--kv-transfer-config" not in argv:
        return None
    return json.loads(flag_value(argv, "--kv-transfer-config"))


def test_plain_argv_is_exactly_the_study_design_launch(h20):
    argv = spec_of(h20, "plain", port=8123).argv
    assert argv == [
        "vllm",
        "serve",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "200000",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens",
        "8192",
        "--max-num-seqs",
        "256",
        "--gpu-memory-utilization",
        "0.9",
        "--disable-hybrid-kv-cache-manager",
    ]


def test_every_connector_config_of_the_study_design(h20):
    assert ktc_of(h20, "plain") is None
    assert ktc_of(h20, "noop_connector") == {
        "kv_connector": "NoOpConnector",
        "kv_connector_module_path": "tools.noop_connector",
        "kv_role": "kv_both",
    }
    for name, role in [
        ("mooncake_producer", "kv_producer"),
        ("mooncake_consumer", "kv_consumer"),
        ("mooncake_both", "kv_both"),
    ]:
        assert ktc_of(h20, name) == {
            "kv_connector": "MooncakeConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"mooncake_protocol": "tcp"},  # named in the config
        }
    assert ktc_of(h20, "nixl_both") == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert ktc_of(h20, "lmcache_only") == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    multi = ktc_of(h20, "multi_mooncake_lmcache")
    assert multi["kv_connector"] == "MultiConnector" and multi["kv_role"] == "kv_both"
    children = multi["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in children] == ["MooncakeConnector", "LMCacheConnectorV1"]
    for child in children:  # vLLM 0.33: a kv_role on every child, no engine_id in any
        assert child["kv_role"] == "kv_both"
        assert "engine_id" not in child


def test_hma_is_disabled_on_every_launch_by_default(h20):
    assert launch.hma_policy(study_of(h20)) == "disabled"
    for variant in h20["variants"]:
        assert launch.HMA_FLAG in spec_of(h20, variant["name"]).argv


def test_hma_auto_leaves_it_to_vllm(h20):
    config = copy.deepcopy(h20)
    config["vllm"]["hybrid_kv_cache_manager"] = "auto"
    assert launch.hma_policy(study_of(config)) == "auto"
    assert launch.HMA_FLAG not in spec_of(config, "noop_connector").argv


def test_mooncake_protocol_is_selectable(h20):
    config = copy.deepcopy(h20)
    config["vllm"]["mooncake"] = {"protocol": "tcp", "device_name": "mlx5_0"}
    extra = ktc_of(config, "mooncake_both")["kv_connector_extra_config"]
    assert extra == {"mooncake_protocol": "tcp", "device_name": "mlx5_0"}
    child = ktc_of(config, "multi_mooncake_lmcache")["kv_connector_extra_config"]["connectors"][0]
    assert child["kv_connector_extra_config"]["mooncake_protocol"] == "tcp"
    # a connector's own extra_config wins
    variant = find_variant(config, "mooncake_producer")
    variant["connector"]["extra_config"] = {"mooncake_protocol": "rdma", "num_workers": 4}
    extra = ktc_of(config, "mooncake_producer")["kv_connector_extra_config"]
    assert extra == {"mooncake_protocol": "rdma", "device_name": "mlx5_0", "num_workers": 4}


def test_custom_module_path_is_split_into_module_and_class(h20):
    config = copy.deepcopy(h20)
    config["variants"].append(
        {
            "name": "mine",
            "connector": {"type": "custom", "role": "kv_producer", "module_path": "my.pkg.conn:MyConnector"},
        }
    )
    config = validate_config(config)
    assert ktc_of(config, "mine") == {
        "kv_connector": "MyConnector",
        "kv_connector_module_path": "my.pkg.conn",
        "kv_role": "kv_producer",
    }


def test_mooncake_over_rdma_needs_a_device_and_the_transport_is_recorded(h20):
    config = copy.deepcopy(h20)
    assert launch.mooncake_transport(*typed(config, "mooncake_both")) == "tcp"
    assert launch.mooncake_transport(*typed(config, "plain")) is None
    config["vllm"]["mooncake"] = {"protocol": "rdma"}
    with pytest.raises(ConfigError, match=r"^vllm\.mooncake\.device_name: .*rdma"):
        spec_of(config, "mooncake_both")
    spec_of(config, "nixl_both")  # no Mooncake: no transport to name
    config["vllm"]["mooncake"]["device_name"] = "mlx5_0"
    assert launch.mooncake_transport(*typed(config, "multi_mooncake_lmcache")) == "rdma (mlx5_0)"


def test_pythonpath_is_prepended_to_the_callers(h20, monkeypatch):
    root = str(launch.repo_root())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site-extra", root]))
    env = spec_of(h20, "plain", 9000, "/tmp/s.jsonl").env
    assert env["PYTHONPATH"].split(os.pathsep) == [root, os.path.join(root, "patches", "site"), "/opt/site-extra"]


def test_environment_of_each_kind(h20, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    root = str(launch.repo_root())
    env = spec_of(h20, "plain", 9000, str(tmp_path / "rel.jsonl")).env
    assert env["PYTHONPATH"] == os.pathsep.join([root, os.path.join(root, "patches", "site")])
    assert env[launch.STEP_LOG_ENV] == str(tmp_path / "rel.jsonl")
    assert not any(k.startswith(("LMCACHE_", "VLLM_MOONCAKE", "VLLM_NIXL")) for k in env)
    assert spec_of(h20, "mooncake_both", 9000).env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "9001"
    assert spec_of(h20, "nixl_both", 9000).env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "9002"
    lm = spec_of(h20, "lmcache_only").env
    assert lm["LMCACHE_CHUNK_SIZE"] == "256" and lm["LMCACHE_LOCAL_CPU"] == "True"
    multi = spec_of(h20, "multi_mooncake_lmcache", 9000).env
    assert "LMCACHE_CHUNK_SIZE" in multi and multi["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "9001"
    assert launch.STEP_LOG_ENV not in spec_of(h20, "plain").env


def test_relative_step_log_is_made_absolute(h20, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = spec_of(h20, "plain", step_log="logs/steps.jsonl").env
    assert env[launch.STEP_LOG_ENV] == str(tmp_path / "logs" / "steps.jsonl")


def test_step_timing_can_be_turned_off(h20, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = copy.deepcopy(h20)
    config["vllm"]["step_timing"] = False
    env = spec_of(config, "plain", step_log="/tmp/x.jsonl").env
    assert env["PYTHONPATH"] == str(launch.repo_root())
    assert launch.STEP_LOG_ENV not in env


def test_study_and_variant_env_and_server_overrides(h20):
    config = copy.deepcopy(h20)
    config["vllm"]["env"] = {"VLLM_HOST_IP": "127.0.0.1", "A": "study"}
    config["server"]["extra_args"] = ["--enforce-eager"]
    variant = find_variant(config, "nixl_both")
    variant["env"] = {"A": "variant"}
    variant["server"] = {"max_num_seqs": 64, "host": "0.0.0.0", "extra_args": ["--seed", "1"]}
    spec = spec_of(config, "nixl_both")
    assert spec.env["A"] == "variant" and spec.env["VLLM_HOST_IP"] == "127.0.0.1"
    assert flag_value(spec.argv, "--max-num-seqs") == "64"
    assert flag_value(spec.argv, "--host") == "0.0.0.0"
    assert spec.argv[-3:] == ["--enforce-eager", "--seed", "1"]
    assert flag_value(spec_of(config, "plain").argv, "--max-num-seqs") == "256"


def test_served_name_and_off_switches(h20):
    config = copy.deepcopy(h20)
    config["model"]["served_name"] = "coder"
    config["server"]["enable_prefix_caching"] = False
    config["server"]["enable_chunked_prefill"] = False
    argv = spec_of(config, "plain").argv
    assert flag_value(argv, "--served-model-name") == "coder"
    assert "--no-enable-prefix-caching" in argv and "--no-enable-chunked-prefill" in argv


@pytest.mark.parametrize("arg", ["--port", "--port=9", "--kv-transfer-config", "-tp", "--host"])
def test_extra_args_may_not_set_what_the_launch_sets(h20, arg):
    config = copy.deepcopy(h20)
    config["server"]["extra_args"] = [arg, "1"]
    with pytest.raises(ConfigError, match=r"^server\.extra_args: .* is set by the launch"):
        spec_of(config, "plain")
    config = copy.deepcopy(h20)
    find_variant(config, "lmcache_only")["server"] = {"extra_args": [arg]}
    with pytest.raises(ConfigError, match=r"^variants\[6\]\.server\.extra_args: "):
        spec_of(config, "lmcache_only")


@pytest.mark.parametrize("port", [0, -1, 65534, 70000, "80", True])
def test_bad_ports(h20, port):
    with pytest.raises(ValueError, match=r"^--port: "):
        spec_of(h20, "plain", port=port)


def test_side_ports():
    assert launch.side_ports(8000) == {"http": 8000, "mooncake_bootstrap": 8001, "nixl_side_channel": 8002}
    assert launch.PORTS_PER_LAUNCH == 3


def test_launch_script_round_trips_through_bash_and_shlex(h20, tmp_path):
    for variant in h20["variants"]:
        spec = spec_of(h20, variant["name"], 8200, str(tmp_path / "s.jsonl"))
        script = tmp_path / f"launch_{variant['name']}.sh"
        script.write_text(spec.script())
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        exports, argv = {}, None
        for line in spec.script().splitlines():
            if line.startswith("export "):
                name, _, value = line[len("export ") :].partition("=")
                (exports[name],) = shlex.split(value)
            elif line.startswith("exec "):
                argv = shlex.split(line[len("exec ") :])
        assert argv == spec.argv
        assert exports == spec.env


def test_launch_script_runs_with_the_exact_argv_and_env(h20, tmp_path):
    """Replace `vllm` with a script that records what it was given, then run launch.sh."""
    fake = tmp_path / "fake-vllm"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['OUT'], 'w'))\n"
    )
    fake.chmod(0o755)
    config = copy.deepcopy(h20)
    config["vllm"]["executable"] = str(fake)
    spec = spec_of(config, "multi_mooncake_lmcache", 8300, str(tmp_path / "s.jsonl"))
    script = tmp_path / "launch.sh"
    script.write_text(spec.script())
    out = tmp_path / "out.json"
    subprocess.run(["bash", str(script)], check=True, env={**os.environ, "OUT": str(out)})
    seen = json.loads(out.read_text())
    assert seen["argv"] == spec.argv[1:]
    assert {k: seen["env"].get(k) for k in spec.env} == spec.env


def run_ctax(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "launch-command", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ctax_launch_command_prints_the_argv(h20):
    done = run_ctax("--config", str(H20), "--variant", "noop_connector", "--port", "8400")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == spec_of(h20, "noop_connector", 8400).argv
    done = run_ctax("--config", str(H20), "--variant", "noop_connector", "--script")
    assert done.stdout.startswith("#!/usr/bin/env bash") and "exec vllm serve" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variant", "nope"], "no variant named 'nope'"),
        (["--variant", "plain", "--port", "65535"], "--port: 65535 is out of range"),
    ],
)
def test_ctax_launch_command_bad_input_is_one_line_and_exit_2(args, message):
    done = run_ctax("--config", str(H20), *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_dispatcher_picks_vllm_for_backend_vllm(h20):
    spec = launch_spec(H20, *typed(h20, "plain"), 8000)
    assert spec.argv[:2] == ["vllm", "serve"]


def test_repo_root(monkeypatch, tmp_path):
    assert (launch.repo_root() / "tools" / "noop_connector.py").is_file()
    monkeypatch.setenv("CONNECTOR_TAX_ROOT", str(REPO))
    assert launch.repo_root() == REPO.resolve()


# --------------------------------------------------------------------------- pre-flight


def test_preflight_scripts_gate_the_study_design_variants(h20):
    plan = launch.preflight_plan(study_of(h20))
    assert {k: v.name for k, v in plan.items()} == {
        "noop_connector": "verify_noop_connector.sh",
        "mooncake_consumer": "verify_kv_consumer.sh",
        "multi_mooncake_lmcache": "verify_multi_connector.sh",
        "multi_mooncake_lmcache_mp": "verify_multi_connector.sh",
    }
    for script in plan.values():
        assert script.is_file() and os.access(script, os.X_OK)
    assert launch.preflight_script(study_of(h20), "plain") is None
    assert launch.preflight_script(study_of(h20), "mooncake_producer") is None
    with pytest.raises(ConfigError, match="no variant named"):
        launch.preflight_script(study_of(h20), "nope")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "connector_tax.commands.for_tools", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_for_tools_names_gated_and_plan():
    assert run_cli("names", str(H20)).stdout.split()[:2] == ["plain", "noop_connector"]
    assert run_cli("gated", str(H20), "kv_consumer").stdout.split() == ["mooncake_consumer"]
    assert run_cli("gated", str(H20), "multi_connector", "--only", "plain").stdout == ""
    done = run_cli("gated", str(H20), "noop_connector", "--only", "nope")
    assert done.returncode == 2 and "no variant named 'nope'" in done.stderr
    plan = json.loads(run_cli("plan", str(H20), "mooncake_consumer", "--port", "8500").stdout)
    assert plan["url"] == "http://127.0.0.1:8500" and plan["check"] == "kv_consumer"
    assert plan["requests"] == 1 and plan["max_tokens"] == 4 and plan["budget_s"] == 30
    assert plan["model"] == "Qwen/Qwen3-Coder-30B-A3B-Instruct" and plan["backend"] == "vllm"
    plan = json.loads(run_cli("plan", str(H20), "plain", "--port", "8500").stdout)
    assert plan["check"] == "smoke" and plan["has_connector"] is False


def test_for_tools_bad_config_is_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: x\n")
    done = run_cli("names", str(bad))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_smoke_config_is_a_valid_small_study(tmp_path):
    out = tmp_path / "smoke.yaml"
    done = run_cli("smoke-config", str(H20), str(out), "--model", "facebook/opt-125m")
    assert done.returncode == 0, done.stderr
    config = load_config(out)
    assert config["backend"] == "vllm" and config["model"]["name"] == "facebook/opt-125m"
    assert config["server"]["max_model_len"] == 4096
    assert config["vllm"]["mooncake"]["protocol"] == "tcp"
    assert [v["name"] for v in config["variants"]] == [v["name"] for v in load_config(H20)["variants"]]
    assert "--enforce-eager" in spec_of(config, "plain").argv
    assert yaml.safe_load(out.read_text())["study"] == "h20-qwen3-coder-gpu-smoke"


def test_for_tools_step_timing_exit_codes(tmp_path):
    done = run_cli("step-timing", str(tmp_path / "s.jsonl"), "--connector")
    assert done.returncode == 1
    assert json.loads(done.stdout)["step_timing_available"] is False
