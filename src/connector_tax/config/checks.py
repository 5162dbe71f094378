"""The cross-field checks a JSON Schema cannot express (run after the schema layer)."""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from connector_tax.arguments import finite
from connector_tax.config.cells import check_labels
from connector_tax.config.errors import ConfigError, key_path, show
from connector_tax.config.interventions import check_interventions
from connector_tax.config.profile import check_study_profile
from connector_tax.config.vllm_rules import check_settings, device

# vLLM resolves kv_connector_module_path with importlib + getattr, so it must be exactly this.
_MODULE_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _check_connector(conn: dict[str, Any], where: str, inside_multi: bool = False) -> None:
    kind = conn["type"]
    if kind == "multi":
        if inside_multi:
            raise ConfigError(f"{where}.type", "multi cannot be nested inside multi")
        if "children" not in conn:
            raise ConfigError(where, "type multi requires children (a list of at least 2 connectors)")
        for j, child in enumerate(conn["children"]):
            _check_connector(child, f"{where}.children[{j}]", inside_multi=True)
        if "connectors" in conn.get("extra_config", {}):
            # vLLM's MultiConnector reads its children from extra_config.connectors; the
            # launch builds that list from `children`, so a second one would be ambiguous.
            raise ConfigError(f"{where}.extra_config.connectors", "is built from children; remove it")
    elif "children" in conn:
        raise ConfigError(f"{where}.children", f"only allowed when type is multi (type is {kind})")

    if kind == "custom":
        if "module_path" not in conn:
            raise ConfigError(where, "type custom requires module_path (dotted.module:ClassName)")
        if not _MODULE_PATH_RE.match(conn["module_path"]):
            raise ConfigError(
                f"{where}.module_path",
                f"{show(conn['module_path'])} must look like dotted.module:ClassName",
            )
    elif "module_path" in conn:
        raise ConfigError(f"{where}.module_path", f"only allowed when type is custom (type is {kind})")


def check_finite(value: Any, where: tuple[str | int, ...] = ()) -> None:
    """No NaN or infinity anywhere in a config (YAML's .nan and .inf are floats): JSON Schema's
    bounds cannot refuse them (every comparison with NaN is false; .inf passes any minimum), and
    a rate of .inf planned Phase B at inf req/s, a rate of .nan ended in a traceback."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_finite(item, (*where, i))
    elif not finite(value):
        raise ConfigError(key_path(where), f"{value} is not a finite number")


def _shape_requests(shape: dict[str, Any]) -> list[tuple[int, int]]:
    if "mix" in shape:
        return [(e["input"], e["output"]) for e in shape["mix"]]
    if "pattern" in shape:
        return [(e["input"], e["output"]) for e in shape["pattern"]]
    return [(shape["input"], shape["output"])]


def _check_lengths(config: dict[str, Any]) -> None:
    """Every request must fit the context window of every config that serves it; otherwise
    vLLM answers 400 to each one and a whole cell is silently empty."""
    limits = [("server.max_model_len", config["server"]["max_model_len"])]
    for i, variant in enumerate(config["variants"]):
        if "max_model_len" in variant.get("server", {}):
            limit = variant["server"]["max_model_len"]
            limits.append((f"variants[{i}].server.max_model_len", limit))

    workload = config["workload"]
    shapes = [("workload.phase_a.shape", workload["phase_a"]["shape"])]
    phase_b = workload["phase_b"]
    if "inputs" in phase_b:  # the largest cell of the cartesian sweep is the one to check
        largest = {"input": max(phase_b["inputs"]), "output": max(phase_b["outputs"])}
        shapes.append(("workload.phase_b", largest))
    for j, shape in enumerate(phase_b.get("shapes", [])):
        shapes.append((f"workload.phase_b.shapes[{j}]", shape))
    for j, shape in enumerate(workload.get("phase_b_prime", {}).get("shapes", [])):
        shapes.append((f"workload.phase_b_prime.shapes[{j}]", shape))
    requests = [(where, i, o) for where, shape in shapes for i, o in _shape_requests(shape)]

    for where, inp, out in requests:
        for limit_name, limit in limits:
            if inp + out > limit:
                raise ConfigError(where, f"a request of {inp} + {out} tokens exceeds {limit_name} {limit}")


AA_SUFFIX = "_aa"
_COPIED = ("connector", "server", "sim", "env", "interventions")


def add_aa_control(config: dict[str, Any]) -> None:
    """workload.aa_control: the baseline again as a variant of its own (`<baseline>_aa`), unless the
    study names an A/A control already; every A/A control gets its source's settings (copied, so
    that a re-validated config stays the same) and its place in Phase B' beside its source."""
    from connector_tax.config.study import baseline_name

    variants = config["variants"]
    if config["workload"].get("aa_control") and not any(v.get("aa_of") for v in variants):
        base = baseline_name(config)
        if any(v["name"] == base + AA_SUFFIX for v in variants):
            raise ConfigError(
                "workload.aa_control",
                f"would add the A/A control {base + AA_SUFFIX!r}, a name the study gives another variant "
                f"(give that one aa_of: {base} to make it the control)",
            )
        variants.append(
            {"name": base + AA_SUFFIX, "aa_of": base, "description": f"A/A control: {base} again, launched apart"}
        )
    by_name = {v["name"]: v for v in variants}
    prime = config["workload"].get("phase_b_prime") or {}
    for i, variant in enumerate(variants):
        source = variant.get("aa_of")
        if source is None:
            continue
        if source not in by_name or by_name[source].get("aa_of"):
            raise ConfigError(f"variants[{i}].aa_of", f"{source!r} is not a variant of this study (nor an A/A one)")
        for key in _COPIED:
            variant.pop(key, None)
            if key in by_name[source]:
                variant[key] = copy.deepcopy(by_name[source][key])
        if source in prime.get("variants", []) and variant["name"] not in prime["variants"]:
            prime["variants"].append(variant["name"])


TOKENIZER_MODES = ("auto", "server", "usage")  # how text prompts are sized; anything else is a file


def tokenizer_problem(tokenizer: str) -> str | None:
    """What is wrong with a `tokenizer` setting, or None (a file's content is the reader's to judge)."""
    if tokenizer in TOKENIZER_MODES or os.path.isfile(tokenizer):
        return None
    if os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        return None
    return f"{tokenizer!r} is not {', '.join(TOKENIZER_MODES)}, a tokenizer.json file or a folder holding one"


def check_semantics(config: dict[str, Any]) -> None:
    first_index: dict[str, int] = {}
    for i, variant in enumerate(config["variants"]):
        name = variant["name"]
        if name in first_index:
            raise ConfigError(
                "variants",
                f"duplicate variant name {name!r} (variants[{first_index[name]}] and variants[{i}])",
            )
        first_index[name] = i
        if "connector" in variant:
            _check_connector(variant["connector"], f"variants[{i}].connector")
        for key in ("clock", "launch_bias_sd", "profile"):
            if key in (variant.get("sim") or {}):
                raise ConfigError(f"variants[{i}].sim.{key}", f"is the study's (top-level sim.{key}), not a variant's")

    workload = config["workload"]
    for j, name in enumerate(workload.get("phase_b_prime", {}).get("variants", [])):
        if name not in first_index:
            raise ConfigError(f"workload.phase_b_prime.variants[{j}]", f"{name!r} is not a variant of this study")

    phase_b = workload["phase_b"]
    if ("inputs" in phase_b) != ("outputs" in phase_b):
        given, absent = ("inputs", "outputs") if "inputs" in phase_b else ("outputs", "inputs")
        raise ConfigError("workload.phase_b", f"{given} given without {absent} (the cells are inputs x outputs)")
    if "inputs" not in phase_b and "shapes" not in phase_b:
        raise ConfigError("workload.phase_b", "give inputs and outputs, or shapes")

    collision = check_labels(config)
    if collision:
        raise ConfigError(*collision)
    if workload["replicates"] > 1:
        for name in first_index:
            m = re.fullmatch(r"(.+)_rep(\d+)", name)
            if m and m.group(1) in first_index and 1 < int(m.group(2)) <= workload["replicates"]:
                raise ConfigError(
                    "workload.replicates",
                    f"variant {name!r} would share its jobs' names with replicate {m.group(2)} of {m.group(1)!r}",
                )

    problem = tokenizer_problem(workload["tokenizer"])
    if problem:
        raise ConfigError("workload.tokenizer", problem)

    if config["backend"] == "openai" and "url" not in config.get("openai", {}):
        raise ConfigError("openai.url", "required when backend is openai")

    if config["backend"] != "openai":  # an external server's context window is its own business
        _check_lengths(config)
    check_study_profile(config)  # the file is there, an engine profile, fitted on the study's model
    check_interventions(config, on_cpu=config["backend"] == "vllm" and device(config) == "cpu")
    if config["backend"] == "vllm":
        check_settings(config)
