"""Study-config schema and validator: the shipped configs validate, defaults are filled, and
every bad config is reported as exactly one line that names the offending key."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_errors import config_error, raw_config
from jsonschema import Draft202012Validator

from connector_tax.config import (
    ConfigError,
    default_config_path,
    find_variant,
    load_config,
    schema_path,
    validate_config,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["configs/default.yaml", "configs/h20-qwen3-coder.yaml", "configs/test-tiny.yaml"]


_raw = raw_config
_error = config_error


# --------------------------------------------------------------------------- valid configs


def test_schema_is_valid_draft_2020_12() -> None:
    schema = yaml.safe_load(schema_path().read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")


def test_paths_point_into_the_repo() -> None:
    assert schema_path() == REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert default_config_path() == REPO / "configs" / "default.yaml"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_validate(name: str) -> None:
    config = load_config(REPO / name)
    assert config["study"] == Path(name).stem
    assert config["variants"]


def test_every_object_level_rejects_unknown_keys() -> None:
    """additionalProperties: false everywhere but the declared free-form maps."""
    open_maps = {"env", "extra_config"}
    schema = yaml.safe_load(schema_path().read_text())
    missing: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and where.rsplit(".", 1)[-1] not in open_maps:
                if node.get("additionalProperties") is not False:
                    missing.append(where)
            for key, sub in node.items():
                walk(sub, f"{where}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}[{i}]")

    walk(schema, "schema")
    # the oneOf wrapper of a shape only states the type; each alternative is closed
    assert missing == ["schema.$defs.shape"], missing


def test_defaults_are_filled() -> None:
    config = load_config(REPO / "configs/test-tiny.yaml")
    assert config["backend"] == "sim"
    assert config["vllm_version"] == "0.33.0"
    assert config["server"] == {
        "host": "127.0.0.1",
        "tensor_parallel_size": 1,
        "max_model_len": 200000,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
        "gpu_memory_utilization": 0.9,
        "extra_args": [],
    }
    assert config["sim"]["admission"] == {"policy": "fifo", "lookahead": 64, "force_fifo_every": 0}
    assert config["saturation"] == {
        "throughput_ratio_min": 0.95,
        "waiting_p50_max": 1,
        "ttft_p90_ratio_max": 1.5,
        "min_requests": 20,
        "min_scrapes": 3,
    }
    assert config["loadgen"] == {"workers": 1, "affinity": True, "cpu_latency_us": 0, "rt_priority": None}
    workload = config["workload"]
    assert (workload["endpoint"], workload["prompt"], workload["temperature"]) == ("completions", "token_ids", 0)
    assert workload["ignore_eos"] is True
    assert workload["inflight_cap"] == 256
    assert workload["phase_b"]["rate"] == "ref_safe"
    assert workload["phase_b_prime"]["rate"] == "ref_load"
    # given values win over defaults
    assert (workload["warmup_s"], workload["duration_s"], workload["min_completed"]) == (0.2, 0.8, 5)


def test_no_defaults_inside_variants() -> None:
    config = _raw()
    config["variants"][0]["server"] = {"max_num_seqs": 8}
    config["variants"][0]["sim"] = {"admission": {"policy": "pack"}}
    filled = validate_config(config)
    assert filled["variants"][0]["server"] == {"max_num_seqs": 8}
    assert filled["variants"][0]["sim"] == {"admission": {"policy": "pack"}}


def test_mix_weight_default_and_pattern_shape() -> None:
    config = _raw()
    config["workload"]["phase_b"]["shapes"] = [
        {"mix": [{"input": 128, "output": 16}, {"input": 512, "output": 16, "weight": 3}]},
        {"pattern": [{"input": 512, "output": 16}, {"input": 128, "output": 16}]},
    ]
    shapes = validate_config(config)["workload"]["phase_b"]["shapes"]
    assert [e["weight"] for e in shapes[0]["mix"]] == [1, 3]
    assert "weight" not in shapes[1]["pattern"][0]


def test_validate_does_not_mutate_input() -> None:
    config = _raw()
    before = copy.deepcopy(config)
    filled = validate_config(config)
    assert config == before
    assert "saturation" in filled and "saturation" not in config


def test_defaults_are_not_shared_between_calls() -> None:
    first = validate_config(_raw())
    first["server"]["extra_args"].append("--enforce-eager")
    first["saturation"]["waiting_p50_max"] = 99
    second = validate_config(_raw())
    assert second["server"]["extra_args"] == []
    assert second["saturation"]["waiting_p50_max"] == 1


def test_h20_study_matches_the_study_design() -> None:
    config = load_config(REPO / "configs/h20-qwen3-coder.yaml")
    assert (config["backend"], config["vllm_version"], config["seed"]) == ("vllm", "0.33.0", 20260526)
    assert config["model"]["name"] == "Qwen/Qwen3-Coder-30B-A3B-Instruct"
    server = config["server"]
    assert (server["tensor_parallel_size"], server["max_model_len"], server["max_num_batched_tokens"]) == (
        1,
        200000,
        8192,
    )
    assert server["enable_prefix_caching"] and server["enable_chunked_prefill"]
    assert server["gpu_memory_utilization"] == 0.9
    assert config["sim"]["hardware_profile"] == "h20-qwen3-30b-a3b"
    default = load_config(default_config_path())
    # the study's eight, then LMCache's multi-process mode as variants of its own
    assert config["variants"][:8] == default["variants"]
    assert [(v["name"], v["connector"]["type"]) for v in config["variants"][8:]] == [
        ("lmcache_mp_only", "lmcache_mp"),
        ("multi_mooncake_lmcache_mp", "multi"),
    ]
    workload = config["workload"]
    assert workload["phase_a"] == {
        "rates": [0.5, 1, 2, 4, 8, 16, 32],
        "shape": {"input": 4096, "output": 256},
        "prune_after_knee": True,
    }
    # The fixed plan's warm-up and 200 requests; its 60 s floor raised to 210 s so the long-context
    # cells are bounded, and the tax-precision plan (the header says why)
    assert (workload["warmup_s"], workload["duration_s"], workload["min_completed"]) == (10, 210, 200)
    assert (workload["precision"]["of"], workload["precision"]["target"]) == ("tax", 0.05)
    assert workload["inflight_cap"] == 256
    assert (workload["temperature"], workload["ignore_eos"], workload["prompt"]) == (0, True, "token_ids")
    assert workload["phase_b"] == {
        "rate": "ref_safe",
        "overload_guard": True,
        "inputs": [512, 4096, 32768],
        "outputs": [64, 256, 1024],
    }
    prime = workload["phase_b_prime"]
    assert prime["variants"] == ["plain", "mooncake_both", "nixl_both", "lmcache_only"]
    assert prime["shapes"] == [{"input": n, "output": 256} for n in (512, 4096, 32768)]
    assert prime["rate"] == "ref_load"
    assert config["saturation"] == {
        "throughput_ratio_min": 0.95,
        "waiting_p50_max": 1,
        "ttft_p90_ratio_max": 1.5,
        "min_requests": 20,
        "min_scrapes": 3,
    }


def test_h20_study_runs_on_the_simulator_with_a_backend_override() -> None:
    config = _raw("configs/h20-qwen3-coder.yaml")
    config["backend"] = "sim"
    assert validate_config(config)["backend"] == "sim"


def test_find_variant() -> None:
    config = load_config(REPO / "configs/test-tiny.yaml")
    assert find_variant(config, "mooncake_both")["connector"] == {"type": "mooncake", "role": "kv_both"}
    with pytest.raises(ConfigError) as info:
        find_variant(config, "nixl_both")
    assert str(info.value) == "variants: no variant named 'nixl_both' (known: plain, noop_connector, mooncake_both)"


# --------------------------------------------------------------------------- bad configs


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutator that sets a dotted path (list indices as integers) to `value`."""

    def mutate(config: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = config
        for part in parents:
            if isinstance(part, str) and part not in node:
                node[part] = {}
            node = node[part]
        node[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(config: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = config
        for part in parents:
            node = node[part]
        del node[last]

    return mutate


BAD_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    # unknown keys, at every level
    ("unknown top-level key", _set("foo", 1), "(top level): unknown key 'foo'"),
    (
        "misspelt top-level key",
        _set("saturaton", {}),
        "(top level): unknown key 'saturaton' (did you mean 'saturation'?)",
    ),
    (
        "unknown key in sim.admission",
        _set("sim.admission", {"lookahed": 8}),
        "sim.admission: unknown key 'lookahed' (did you mean 'lookahead'?)",
    ),
    (
        "unknown key in a configs entry",
        _set("variants.1.conector", {}),
        "variants[1]: unknown key 'conector' (did you mean 'connector'?)",
    ),
    (
        "unknown key in a connector",
        _set("variants.2.connector.kv_role", "kv_both"),
        "variants[2].connector: unknown key 'kv_role' (did you mean 'role'?)",
    ),
    (
        "unknown key in a variant server",
        _set("variants.0.server", {"max_seqs": 4}),
        "variants[0].server: unknown key 'max_seqs' (did you mean 'max_num_seqs'?)",
    ),
    (
        "unknown key in a shape",
        _set("workload.phase_a.shape.weight", 2),
        "workload.phase_a.shape: unknown key 'weight'",
    ),
    (
        "unknown connector_costs kind",
        _set("sim.connector_costs", {"mooncak": {}}),
        "sim.connector_costs: unknown key 'mooncak' (did you mean 'mooncake'?)",
    ),
    (
        "unknown fault",
        _set("sim.faults", {"crash_after": 3}),
        "sim.faults: unknown key 'crash_after' (did you mean 'crash_after_s'?)",
    ),
    # wrong types
    (
        "rates a string",
        _set("workload.phase_a.rates", "fast"),
        "workload.phase_a.rates: expected a list, got a string 'fast'",
    ),
    (
        "max_num_seqs a string",
        _set("server.max_num_seqs", "8"),
        "server.max_num_seqs: expected an integer, got a string '8'",
    ),
    (
        "min_completed a float",
        _set("workload.min_completed", 2.5),
        "workload.min_completed: expected an integer, got a number 2.5",
    ),
    (
        "ignore_eos a string",
        _set("workload.ignore_eos", "yes"),
        "workload.ignore_eos: expected true or false, got a string 'yes'",
    ),
    (
        "variants a mapping",
        _set("variants", {"name": "plain"}),
        "variants: expected a list, got a mapping {'name': 'plain'}",
    ),
    (
        "shape a string",
        _set("workload.phase_a.shape", "256x16"),
        "workload.phase_a.shape: expected a mapping, got a string '256x16'",
    ),
    ("connector left empty", _set("variants.1.connector", None), "variants[1].connector: expected a mapping, got null"),
    (
        "env value not a string",
        _set("variants.0.env", {"UCX_TLS": 1}),
        "variants[0].env.UCX_TLS: expected a string, got an integer 1",
    ),
    (
        "env key not a variable name",
        _set("variants.0.env", {"UCX-TLS": "tcp"}),
        "variants[0].env: key 'UCX-TLS' is not a valid environment variable name",
    ),
    # values out of range
    ("negative rate", _set("workload.phase_a.rates", [4, -1]), "workload.phase_a.rates[1]: -1 must be greater than 0"),
    ("zero rate", _set("workload.phase_a.rates", [0]), "workload.phase_a.rates[0]: 0 must be greater than 0"),
    ("duplicate rate", _set("workload.phase_a.rates", [4, 8, 4]), "workload.phase_a.rates: duplicate value 4"),
    (
        "throughput ratio above 1",
        _set("saturation.throughput_ratio_min", 1.5),
        "saturation.throughput_ratio_min: 1.5 is greater than the maximum of 1",
    ),
    (
        "ttft ratio of 1",
        _set("saturation.ttft_p90_ratio_max", 1),
        "saturation.ttft_p90_ratio_max: 1 must be greater than 1",
    ),
    ("min_completed 0", _set("workload.min_completed", 0), "workload.min_completed: 0 is less than the minimum of 1"),
    ("negative duration", _set("workload.duration_s", -5), "workload.duration_s: -5 must be greater than 0"),
    ("negative warm-up", _set("workload.warmup_s", -1), "workload.warmup_s: -1 is less than the minimum of 0"),
    (
        "negative cpu latency",
        _set("loadgen.cpu_latency_us", -1),
        "loadgen.cpu_latency_us: -1 is less than the minimum of 0",
    ),
    (
        "cpu latency a float",
        _set("loadgen.cpu_latency_us", 1.5),
        "loadgen.cpu_latency_us: expected an integer or null, got a number 1.5",
    ),
    (
        "real-time priority past SCHED_FIFO's range",
        _set("loadgen.rt_priority", 100),
        "loadgen.rt_priority: 100 is greater than the maximum of 99",
    ),
    (
        "misspelt loadgen key",
        _set("loadgen.cpu_latncy_us", 0),
        "loadgen: unknown key 'cpu_latncy_us' (did you mean 'cpu_latency_us'?)",
    ),
    ("no load generator worker", _set("loadgen.workers", 0), "loadgen.workers: 0 is less than the minimum of 1"),
    (
        "misspelt validity key",
        _set("validity", {"max_lateness_p99": 500}),
        "validity: unknown key 'max_lateness_p99' (did you mean 'max_lateness_p99_us'?)",
    ),
    ("no attempt at all", _set("validity", {"attempts": 0}), "validity.attempts: 0 is less than the minimum of 1"),
    (
        "others' CPU share over 1",
        _set("validity", {"max_others_cpu_frac": 2}),
        "validity.max_others_cpu_frac: 2 is greater than the maximum of 1",
    ),
    ("max_num_seqs -1", _set("server.max_num_seqs", -1), "server.max_num_seqs: -1 is less than the minimum of 1"),
    (
        "gpu memory utilization 0",
        _set("server.gpu_memory_utilization", 0),
        "server.gpu_memory_utilization: 0 must be greater than 0",
    ),
    (
        "http_500_rate 2",
        _set("sim.faults", {"http_500_rate": 2}),
        "sim.faults.http_500_rate: 2 is greater than the maximum of 1",
    ),
    (
        "zero input length",
        _set("workload.phase_b.inputs", [0, 128]),
        "workload.phase_b.inputs[0]: 0 is less than the minimum of 1",
    ),
    (
        "negative mix weight",
        _set("workload.phase_b.shapes", [{"mix": [{"input": 8, "output": 8, "weight": -1}]}]),
        "workload.phase_b.shapes[0].mix[0].weight: -1 must be greater than 0",
    ),
    (
        "mix entry without output",
        _set("workload.phase_b.shapes", [{"mix": [{"input": 8}]}]),
        "workload.phase_b.shapes[0].mix[0]: missing required key 'output'",
    ),
    (
        "pattern entry negative",
        _set("workload.phase_b.shapes", [{"pattern": [{"input": 8, "output": -2}]}]),
        "workload.phase_b.shapes[0].pattern[0].output: -2 is less than the minimum of 1",
    ),
    (
        "shape with a string length",
        _set("workload.phase_a.shape.output", "16"),
        "workload.phase_a.shape.output: expected an integer, got a string '16'",
    ),
    (
        "shape missing output",
        _set("workload.phase_a.shape", {"input": 256}),
        "workload.phase_a.shape: missing required key 'output'",
    ),
    (
        "empty shape",
        _set("workload.phase_a.shape", {}),
        "workload.phase_a.shape: missing required keys 'input', 'output'",
    ),
    (
        "request beyond max_model_len",
        _set("server.max_model_len", 256),
        "workload.phase_a.shape: a request of 256 + 16 tokens exceeds server.max_model_len 256",
    ),
    (
        "request beyond a variant's max_model_len",
        _set("variants.0.server", {"max_model_len": 500}),
        "workload.phase_b: a request of 512 + 16 tokens exceeds variants[0].server.max_model_len 500",
    ),
    # names
    (
        "duplicate config name",
        lambda c: c["variants"].append({"name": "plain"}),
        "variants: duplicate variant name 'plain' (variants[0] and variants[3])",
    ),
    (
        "uppercase config name",
        _set("variants.2.name", "Mooncake_both"),
        "variants[2].name: 'Mooncake_both' does not match ^[a-z0-9][a-z0-9_-]*$",
    ),
    (
        "config name with a space",
        _set("variants.2.name", "Mooncake Both"),
        "variants[2].name: 'Mooncake Both' does not match ^[a-z0-9][a-z0-9_-]*$",
    ),
    (
        "config name with a leading underscore",
        _set("variants.0.name", "_plain"),
        "variants[0].name: '_plain' does not match ^[a-z0-9][a-z0-9_-]*$",
    ),
    ("config without a name", _delete("variants.1.name"), "variants[1]: missing required key 'name'"),
    ("bad study name", _set("study", "My Study"), "study: 'My Study' does not match ^[a-z0-9][a-z0-9_-]*$"),
    (
        "phase B' config not in the study",
        _set("workload.phase_b_prime.variants", ["plain", "nixl_both"]),
        "workload.phase_b_prime.variants[1]: 'nixl_both' is not a variant of this study",
    ),
    # empty lists and missing sections
    ("empty rate list", _set("workload.phase_a.rates", []), "workload.phase_a.rates: must not be empty"),
    ("empty variants list", _set("variants", []), "variants: must not be empty"),
    ("empty outputs", _set("workload.phase_b.outputs", []), "workload.phase_b.outputs: must not be empty"),
    ("missing workload", _delete("workload"), "(top level): missing required key 'workload'"),
    ("missing model name", _set("model", {}), "model: missing required key 'name'"),
    (
        "phase_b with neither",
        _set("workload.phase_b", {"rate": "ref_safe"}),
        "workload.phase_b: give inputs and outputs, or shapes",
    ),
    (
        "phase_b inputs without outputs",
        _delete("workload.phase_b.outputs"),
        "workload.phase_b: inputs given without outputs (the cells are inputs x outputs)",
    ),
    # enums
    ("invalid backend", _set("backend", "tgi"), "backend: 'tgi' is not one of sim, vllm, openai"),
    (
        "invalid hardware profile",
        _set("sim.hardware_profile", "a100"),
        "sim.hardware_profile: 'a100' is not one of tiny-fast, h20-qwen3-30b-a3b",
    ),
    (
        "invalid admission policy",
        _set("sim.admission", {"policy": "lifo"}),
        "sim.admission.policy: 'lifo' is not one of fifo, pack",
    ),
    (
        "invalid phase_b rate",
        _set("workload.phase_b.rate", "max"),
        "workload.phase_b.rate: 'max' is not one of ref_safe, ref_load",
    ),
    (
        "invalid connector type",
        _set("variants.2.connector.type", "mooncakes"),
        "variants[2].connector.type: 'mooncakes' is not one of noop, mooncake, nixl, lmcache, lmcache_mp, multi, custom",
    ),
    (
        "invalid connector role",
        _set("variants.2.connector.role", "both"),
        "variants[2].connector.role: 'both' is not one of kv_producer, kv_consumer, kv_both",
    ),
    (
        "connector without role",
        _delete("variants.2.connector.role"),
        "variants[2].connector: missing required key 'role'",
    ),
    # connector structure
    (
        "multi without children",
        _set("variants.2.connector", {"type": "multi", "role": "kv_both"}),
        "variants[2].connector: type multi requires children (a list of at least 2 connectors)",
    ),
    (
        "multi with one child",
        _set(
            "variants.2.connector",
            {"type": "multi", "role": "kv_both", "children": [{"type": "nixl", "role": "kv_both"}]},
        ),
        "variants[2].connector.children: must have at least 2 items (has 1)",
    ),
    (
        "children on non-multi",
        _set(
            "variants.2.connector.children",
            [{"type": "nixl", "role": "kv_both"}, {"type": "lmcache", "role": "kv_both"}],
        ),
        "variants[2].connector.children: only allowed when type is multi (type is mooncake)",
    ),
    (
        "nested multi",
        _set(
            "variants.2.connector",
            {
                "type": "multi",
                "role": "kv_both",
                "children": [{"type": "nixl", "role": "kv_both"}, {"type": "multi", "role": "kv_both", "children": []}],
            },
        ),
        "variants[2].connector.children[1].children: must have at least 2 items (has 0)",
    ),
    (
        "nested multi with children",
        _set(
            "variants.2.connector",
            {
                "type": "multi",
                "role": "kv_both",
                "children": [
                    {"type": "nixl", "role": "kv_both"},
                    {
                        "type": "multi",
                        "role": "kv_both",
                        "children": [{"type": "nixl", "role": "kv_both"}, {"type": "lmcache", "role": "kv_both"}],
                    },
                ],
            },
        ),
        "variants[2].connector.children[1].type: multi cannot be nested inside multi",
    ),
    (
        "unknown key in a child connector",
        _set(
            "variants.2.connector",
            {
                "type": "multi",
                "role": "kv_both",
                "children": [{"type": "nixl", "role": "kv_both"}, {"type": "lmcache", "rol": "kv_both"}],
            },
        ),
        "variants[2].connector.children[1]: unknown key 'rol' (did you mean 'role'?)",
    ),
    (
        "custom without module_path",
        _set("variants.1.connector", {"type": "custom", "role": "kv_both"}),
        "variants[1].connector: type custom requires module_path (dotted.module:ClassName)",
    ),
    (
        "custom with a bad module_path",
        _set("variants.1.connector", {"type": "custom", "role": "kv_both", "module_path": "tools/noop_connector.py"}),
        "variants[1].connector.module_path: 'tools/noop_connector.py' must look like dotted.module:ClassName",
    ),
    (
        "module_path on non-custom",
        _set("variants.1.connector.module_path", "tools.noop_connector:NoOpConnector"),
        "variants[1].connector.module_path: only allowed when type is custom (type is noop)",
    ),
    # backend openai
    ("openai backend without url", _set("backend", "openai"), "openai.url: required when backend is openai"),
    (
        "openai url not http",
        _set("openai", {"url": "localhost:8000"}),
        "openai.url: 'localhost:8000' is not an http:// or https:// URL",
    ),
    # what a vLLM launch would refuse, refused when the config loads
    (
        "extra_args repeats a launch flag",
        lambda c: (c.update(backend="vllm"), c["variants"][2].update(server={"extra_args": ["--port=9"]})),
        "variants[2].server.extra_args: --port is set by the launch from the launch's port; set that instead",
    ),
    (
        "study extra_args repeats a launch flag",
        lambda c: (c.update(backend="vllm"), c.update(server={"extra_args": ["--max-num-seqs", "8"]})),
        "server.extra_args: --max-num-seqs is set by the launch from server.max_num_seqs; set that instead",
    ),
    # cells that would share a label
    (
        "colliding rates",
        _set("workload.phase_a.rates", [8, 8.0000001]),
        "workload.phase_a.rates[1]: 8.0000001 gives the same cell label r8 as rates[0] (8); rates must differ in their first 6 significant digits",
    ),
    (
        "a Phase B shape given twice",
        _set("workload.phase_b.shapes", [{"input": 128, "output": 16}]),
        "workload.phase_b.shapes[0]: repeats the shape of workload.phase_b (inputs x outputs: 128x16) (cell 128x16): every cell of a phase needs its own shape",
    ),
    (
        "a ready timeout that is not positive",
        _set("server.ready_timeout_s", 0),
        "server.ready_timeout_s: 0 must be greater than 0",
    ),
    # NaN and infinity (YAML's .nan, .inf) pass every schema bound; refused wherever they are
    (
        "a rate of .nan",
        _set("workload.phase_a.rates", [4, float("nan")]),
        "workload.phase_a.rates[1]: nan is not a finite number",
    ),
    (
        "a rate of .inf",
        _set("workload.phase_a.rates", [float("inf")]),
        "workload.phase_a.rates[0]: inf is not a finite number",
    ),
    (
        "a duration of .inf",
        _set("workload.duration_s", float("inf")),
        "workload.duration_s: inf is not a finite number",
    ),
    ("a warm-up of -.inf", _set("workload.warmup_s", float("-inf")), "workload.warmup_s: -inf is not a finite number"),
    (
        "a variant's setting of .nan",
        lambda c: c["variants"][1].update(server={"max_num_seqs": float("nan")}),
        "variants[1].server.max_num_seqs: nan is not a finite number",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [(m, e) for _, m, e in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_config_is_one_line_naming_the_key(mutate: Callable[[dict[str, Any]], Any], expected: str) -> None:
    assert _error(mutate) == expected


def test_top_level_not_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(["study", "x"])  # type: ignore[arg-type]
    assert str(info.value) == "(top level): expected a mapping of study settings, got a list"


def test_custom_connector_with_module_path_is_valid() -> None:
    config = _raw()
    config["variants"][1]["connector"] = {
        "type": "custom",
        "role": "kv_both",
        "module_path": "tools.noop_connector:NoOpConnector",
        "extra_config": {"anything": [1, {"goes": True}]},
    }
    config["variants"][1]["env"] = {"PYTHONPATH": "."}
    assert validate_config(config)["variants"][1]["connector"]["module_path"].endswith(":NoOpConnector")


def test_openai_backend_with_url_is_valid() -> None:
    config = _raw()
    config["backend"] = "openai"
    config["openai"] = {"url": "http://10.0.0.5:8000/v1", "api_key_env": "OPENAI_API_KEY"}
    assert validate_config(config)["openai"]["url"] == "http://10.0.0.5:8000/v1"


def test_load_study_says_whether_the_file_names_a_hardware_profile() -> None:
    """`ctax plan --predict` models a vLLM study's server only by a profile its config chose: the
    schema's default (tiny-fast) is filled in for every config, so only the file can tell."""
    from connector_tax.config import load_study

    named = load_study(REPO / "configs/h20-qwen3-coder.yaml")
    assert named.hardware_profile_named and named.sim["hardware_profile"] == "h20-qwen3-30b-a3b"
    unnamed = load_study(REPO / "configs/vllm-cpu-tiny.yaml")
    assert not unnamed.hardware_profile_named and unnamed.sim["hardware_profile"] == "tiny-fast"


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")))
def test_every_shipped_config_loads_as_typed_objects(path: Path) -> None:
    """The typed view carries the schema's defaults (no reader has a default of its own) and is read-only."""
    import dataclasses

    from connector_tax.config import load_study

    study = load_study(path)
    raw = study.raw
    assert study.names == [v["name"] for v in raw["variants"]]
    assert study.workload.phase_a.prune_after_knee is raw["workload"]["phase_a"]["prune_after_knee"]
    assert study.workload.arrival.process in ("poisson", "gamma", "fixed")
    assert dataclasses.asdict(study.saturation) == raw["saturation"]
    assert study.loadgen.workers == raw["loadgen"]["workers"] >= 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        study.seed = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="no variant named 'nope'"):
        study.variant("nope")
