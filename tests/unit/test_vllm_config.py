"""The config's vLLM-backend settings: the top-level `vllm:` section and the connector rules
the launch relies on (schema in workflow/schemas/config.schema.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_errors import config_error, raw_config

from connector_tax.config import ConfigError, load_config, validate_config

REPO = Path(__file__).resolve().parents[2]


_raw = raw_config
_error = config_error


def test_vllm_defaults_are_filled() -> None:
    config = validate_config(_raw())
    assert config["vllm"] == {
        "executable": "vllm",
        "device": "cuda",
        "preflight_launch": "all",
        "hybrid_kv_cache_manager": "disabled",
        "step_timing": True,
        "mooncake": {"protocol": "rdma"},
        "lmcache": {
            "env": {
                "LMCACHE_CHUNK_SIZE": "256",
                "LMCACHE_LOCAL_CPU": "True",
                "LMCACHE_MAX_LOCAL_CPU_SIZE": "5.0",
            }
        },
        "lmcache_mp": {
            "chunk_size": 256,
            "l1_size_gb": 1,
            "eviction_policy": "LRU",
            "transfer_mode": "auto",
            "ready_timeout_s": 60,
            "extra_args": [],
            "env": {},
        },
        "env": {},
    }


def test_vllm_settings_are_kept() -> None:
    config = _raw()
    config["vllm"] = {
        "executable": "/opt/vllm/bin/vllm",
        "device": "cpu",
        "cpu": {"kvcache_space_gib": 2, "omp_threads_bind": "0-1", "cache_root": "/tmp/vc"},
        "preflight_launch": "gated",
        "hybrid_kv_cache_manager": "auto",
        "step_timing": False,
        "mooncake": {"protocol": "tcp", "device_name": "mlx5_0"},
        "lmcache": {"env": {"LMCACHE_CHUNK_SIZE": "512"}},
        "lmcache_mp": {
            "executable": "/opt/vllm/bin/lmcache",
            "chunk_size": 512,
            "l1_size_gb": 2.5,
            "eviction_policy": "ARC",
            "transfer_mode": "lmcache_driven",
            "ready_timeout_s": 30,
            "extra_args": ["--max-workers", "2"],
            "env": {"LMCACHE_LOG_LEVEL": "WARNING"},
        },
        "env": {"VLLM_HOST_IP": "127.0.0.1"},
    }
    filled = validate_config(config)
    assert filled["vllm"] == config["vllm"]


def _mp_config(**lmcache_mp) -> dict:
    config = _raw()
    config.update(backend="vllm", vllm={"device": "cpu", "lmcache_mp": lmcache_mp})
    config["server"] = {**config.get("server", {}), "block_size": 32}
    config["variants"] = [
        {"name": "plain"},
        {"name": "lmcache_only", "connector": {"type": "lmcache_mp", "role": "kv_both"}},
    ]
    config["workload"].pop("phase_b_prime", None)
    return config


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"chunk_size": 16},
            "vllm.lmcache_mp.chunk_size: 16: LMCache's chunk size must be a multiple of vLLM's block size "
            "(server.block_size 32)",
        ),
        ({"chunk_size": 0}, "vllm.lmcache_mp.chunk_size: 0 is less than the minimum of 1"),
        (
            {"eviction_policy": "FIFO"},
            "vllm.lmcache_mp.eviction_policy: 'FIFO' is not one of LRU, ARC, IsolatedLRU, noop",
        ),
        (
            {"extra_args": ["--port", "9"]},
            "vllm.lmcache_mp.extra_args: --port is set by the launch from the launch's own port for it",
        ),
    ],
    ids=["chunk not a multiple of the block", "chunk zero", "eviction policy", "managed flag"],
)
def test_bad_lmcache_mp_settings_are_one_line_naming_the_key(settings: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(_mp_config(**settings))
    assert str(err.value) == expected


def test_the_chunk_rule_holds_only_where_an_lmcache_mp_connector_runs() -> None:
    config = _mp_config(chunk_size=16)
    config["variants"] = config["variants"][:1]
    assert validate_config(config)["vllm"]["lmcache_mp"]["chunk_size"] == 16  # nothing reads it: no error
    ok = validate_config(_mp_config(chunk_size=64))
    assert ok["vllm"]["lmcache_mp"]["chunk_size"] == 64


def test_shipped_configs_still_validate() -> None:
    for name in ("default", "h20-qwen3-coder", "test-tiny"):
        assert load_config(REPO / "configs" / f"{name}.yaml")["vllm"]["step_timing"] is True


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda c: c.update(vllm={"step_timming": True}),
            "vllm: unknown key 'step_timming' (did you mean 'step_timing'?)",
        ),
        (
            lambda c: c.update(vllm={"hybrid_kv_cache_manager": "on"}),
            "vllm.hybrid_kv_cache_manager: 'on' is not one of disabled, auto",
        ),
        (
            lambda c: c.update(vllm={"mooncake": {"protocol": "udp"}}),
            "vllm.mooncake.protocol: 'udp' is not one of rdma, tcp",
        ),
        (
            lambda c: c.update(vllm={"mooncake": {"protocl": "tcp"}}),
            "vllm.mooncake: unknown key 'protocl' (did you mean 'protocol'?)",
        ),
        (
            lambda c: c.update(vllm={"lmcache": {"env": {"1BAD": "x"}}}),
            "vllm.lmcache.env: key '1BAD' is not a valid environment variable name",
        ),
        (lambda c: c.update(vllm={"lmcache": {"chunk": 1}}), "vllm.lmcache: unknown key 'chunk'"),
        (lambda c: c.update(vllm={"env": {"A": 1}}), "vllm.env.A: expected a string, got an integer 1"),
        (lambda c: c.update(vllm={"executable": ""}), "vllm.executable: must not be empty"),
        (
            lambda c: c.update(vllm={"step_timing": "yes"}),
            "vllm.step_timing: expected true or false, got a string 'yes'",
        ),
    ],
)
def test_bad_vllm_settings_are_one_line(mutate, expected) -> None:
    assert _error(mutate) == expected


def test_multi_connectors_list_is_built_from_children() -> None:
    def mutate(config: dict) -> None:
        config["variants"].append(
            {
                "name": "multi",
                "connector": {
                    "type": "multi",
                    "role": "kv_both",
                    "extra_config": {"connectors": []},
                    "children": [{"type": "mooncake", "role": "kv_both"}, {"type": "lmcache", "role": "kv_both"}],
                },
            }
        )

    assert _error(mutate) == "variants[3].connector.extra_config.connectors: is built from children; remove it"
