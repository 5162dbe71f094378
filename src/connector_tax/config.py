"""Load and validate a study config (configs/*.yaml) before anything runs.

Validation has two layers: the JSON Schema in workflow/schemas/config.schema.yaml (types,
ranges, unknown keys, defaults) and the cross-field checks below that a schema cannot
express. Either way the user gets ONE line naming the key path, e.g.
`configs[2].name: 'Mooncake Both' does not match ^[a-z0-9][a-z0-9_-]*$`, because a config
error is fixed by editing one key and a jsonschema dump buries that key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, relevance

from connector_tax.contract.cells import check_labels

_REPO = Path(__file__).resolve().parents[2]

# vLLM resolves kv_connector_module_path with importlib + getattr, so it must be exactly this.
_MODULE_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")

# Patterns whose regex says less to a config author than a few words do. The config-name
# pattern is deliberately absent: that regex is the clearest statement of the rule.
_PATTERN_HINTS = {
    "^https?://[^\\s/]+": "is not an http:// or https:// URL",
    "^[A-Za-z_][A-Za-z0-9_]*$": "is not a valid environment variable name",
}

# How a JSON Schema type reads in a message about a YAML file.
_TYPE_WORDS = {
    "array": "a list",
    "object": "a mapping",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


class ConfigError(ValueError):
    """A study config is unusable; str() is one line: `[file: ]<key path>: <what was wrong>`."""

    def __init__(self, where: str | None, problem: str, file: str | None = None) -> None:
        self.where = where
        # A multi-line problem (a YAML parser message, a value's repr) would break the one-line
        # promise that callers and the Snakefile's error output rely on.
        self.problem = " ".join(problem.split())
        self.file = file
        super().__init__(str(self))

    def __str__(self) -> str:
        return ": ".join(part for part in (self.file, self.where, self.problem) if part)

    def in_file(self, file: str) -> ConfigError:
        return ConfigError(self.where, self.problem, file=file)


def schema_path() -> Path:
    return _REPO / "workflow" / "schemas" / "config.schema.yaml"


def default_config_path() -> Path:
    return _REPO / "configs" / "default.yaml"


# --------------------------------------------------------------------------- schema layer


def _extend_with_default(cls: type) -> type:
    """A validator that fills `default:` values in as it validates, like Snakemake's
    validate(set_default=True), except that it copies each default (a shared `{}` default
    would otherwise be aliased between configs) and never touches a non-mapping."""
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: dict, instance: Any, schema: dict) -> Iterator:
        if validator.is_type(instance, "object"):
            for key, subschema in properties.items():
                if isinstance(subschema, dict) and "default" in subschema and key not in instance:
                    instance[key] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_default(Draft202012Validator)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    with schema_path().open(encoding="utf-8") as fh:
        schema = yaml.safe_load(fh)
    return _DefaultFillingValidator(schema)


def _key_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _show(value: Any, limit: int = 60) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _keys(keys: Iterable[Any]) -> str:
    return ", ".join(_show(k) for k in keys)


_VALUE_WORDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def _type_word(value: Any) -> str:
    return _VALUE_WORDS.get(type(value), type(value).__name__)


def _branch_score(errors: list[ValidationError], depth: int) -> tuple[int, int]:
    """How badly one oneOf/anyOf alternative failed: the count of distinct kinds of structural
    failure at the alternative's own level (wrong type, missing keys, unknown keys), then how
    deep its deepest error goes (deeper = it got further). Lower is a closer match."""
    structural = {
        e.validator
        for e in errors
        if len(e.absolute_path) == depth
        and e.validator in ("type", "required", "additionalProperties")
    }
    deepest = max((len(e.absolute_path) for e in errors), default=depth)
    return (len(structural), -deepest)


def _most_specific(errors: Iterable[ValidationError]) -> ValidationError:
    """jsonschema's best_match at the top, but for oneOf/anyOf descend into the alternative
    the instance was evidently meant to be (e.g. a shape with `mix:` is a mix), so the line
    names the deepest key instead of 'is not valid under any of the given schemas'."""
    best = max(errors, key=relevance)
    while best.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in best.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        depth = len(best.absolute_path)
        # Ties go to the first alternative the schema lists (dict keeps insertion order).
        chosen = min(branches.values(), key=lambda errs: _branch_score(errs, depth))
        best = max(chosen, key=relevance)
    return best


def _describe(error: ValidationError) -> tuple[str, str]:
    """(key path, problem) for one jsonschema error, in words a config author uses."""
    where = _key_path(error.absolute_path)
    kind, expected, value = error.validator, error.validator_value, error.instance

    if "propertyNames" in error.relative_schema_path:
        if kind == "pattern" and expected in _PATTERN_HINTS:
            return where, f"key {_show(value)} {_PATTERN_HINTS[expected]}"
        return where, f"key {_show(value)} is not allowed here"
    if kind == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        extra = [k for k in value if k not in known]
        noun = "key" if len(extra) == 1 else "keys"
        problem = f"unknown {noun} {_keys(extra)}"
        if len(extra) == 1:
            near = difflib.get_close_matches(str(extra[0]), [str(k) for k in known], n=1)
            if near:
                problem += f" (did you mean {near[0]!r}?)"
        return where, problem
    if kind == "required":
        missing = [k for k in expected if k not in value]
        noun = "key" if len(missing) == 1 else "keys"
        return where, f"missing required {noun} {_keys(missing)}"
    if kind == "type":
        wanted = [expected] if isinstance(expected, str) else list(expected)
        words = " or ".join(_TYPE_WORDS.get(t, t) for t in wanted)
        got = "null" if value is None else f"{_type_word(value)} {_show(value)}"
        return where, f"expected {words}, got {got}"
    if kind == "enum":
        return where, f"{_show(value)} is not one of {', '.join(str(v) for v in expected)}"
    if kind == "pattern":
        if expected in _PATTERN_HINTS:
            return where, f"{_show(value)} {_PATTERN_HINTS[expected]}"
        return where, f"{_show(value)} does not match {expected}"
    if kind == "minimum":
        return where, f"{_show(value)} is less than the minimum of {expected}"
    if kind == "exclusiveMinimum":
        return where, f"{_show(value)} must be greater than {expected}"
    if kind == "maximum":
        return where, f"{_show(value)} is greater than the maximum of {expected}"
    if kind == "exclusiveMaximum":
        return where, f"{_show(value)} must be less than {expected}"
    if kind in ("minItems", "minLength"):
        if expected == 1:
            return where, "must not be empty"
        return where, f"must have at least {expected} items (has {len(value)})"
    if kind == "uniqueItems":
        for i, item in enumerate(value):
            if item in value[:i]:
                return where, f"duplicate value {_show(item)}"
        return where, "values must be unique"
    if kind == "oneOf":
        return where, "matches more than one of the allowed forms"
    return where, error.message


# --------------------------------------------------------------------------- semantic layer


def _check_connector(conn: dict, where: str, inside_multi: bool = False) -> None:
    kind = conn["type"]
    if kind == "multi":
        if inside_multi:
            raise ConfigError(f"{where}.type", "multi cannot be nested inside multi")
        if "children" not in conn:
            raise ConfigError(
                where, "type multi requires children (a list of at least 2 connectors)"
            )
        for j, child in enumerate(conn["children"]):
            _check_connector(child, f"{where}.children[{j}]", inside_multi=True)
        if "connectors" in conn.get("extra_config", {}):
            # vLLM's MultiConnector reads its children from extra_config.connectors; the
            # launch builds that list from `children`, so a second one would be ambiguous.
            raise ConfigError(
                f"{where}.extra_config.connectors", "is built from children; remove it"
            )
    elif "children" in conn:
        raise ConfigError(f"{where}.children", f"only allowed when type is multi (type is {kind})")

    if kind == "custom":
        if "module_path" not in conn:
            raise ConfigError(where, "type custom requires module_path (dotted.module:ClassName)")
        if not _MODULE_PATH_RE.match(conn["module_path"]):
            raise ConfigError(
                f"{where}.module_path",
                f"{_show(conn['module_path'])} must look like dotted.module:ClassName",
            )
    elif "module_path" in conn:
        raise ConfigError(
            f"{where}.module_path", f"only allowed when type is custom (type is {kind})"
        )


def _shape_requests(shape: dict) -> list[tuple[int, int]]:
    if "mix" in shape:
        return [(e["input"], e["output"]) for e in shape["mix"]]
    if "pattern" in shape:
        return [(e["input"], e["output"]) for e in shape["pattern"]]
    return [(shape["input"], shape["output"])]


def _check_lengths(config: dict) -> None:
    """Every request must fit the context window of every config that serves it; otherwise
    vLLM answers 400 to each one and a whole cell is silently empty."""
    limits = [("server.max_model_len", config["server"]["max_model_len"])]
    for i, variant in enumerate(config["configs"]):
        if "max_model_len" in variant.get("server", {}):
            limit = variant["server"]["max_model_len"]
            limits.append((f"configs[{i}].server.max_model_len", limit))

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
                raise ConfigError(
                    where, f"a request of {inp} + {out} tokens exceeds {limit_name} {limit}"
                )


def _check_semantics(config: dict) -> None:
    first_index: dict[str, int] = {}
    for i, variant in enumerate(config["configs"]):
        name = variant["name"]
        if name in first_index:
            raise ConfigError(
                "configs",
                f"duplicate config name {name!r} (configs[{first_index[name]}] and configs[{i}])",
            )
        first_index[name] = i
        if "connector" in variant:
            _check_connector(variant["connector"], f"configs[{i}].connector")

    workload = config["workload"]
    for j, name in enumerate(workload.get("phase_b_prime", {}).get("configs", [])):
        if name not in first_index:
            raise ConfigError(
                f"workload.phase_b_prime.configs[{j}]", f"{name!r} is not a config of this study"
            )

    phase_b = workload["phase_b"]
    if ("inputs" in phase_b) != ("outputs" in phase_b):
        given, absent = ("inputs", "outputs") if "inputs" in phase_b else ("outputs", "inputs")
        raise ConfigError(
            "workload.phase_b", f"{given} given without {absent} (the cells are inputs x outputs)"
        )
    if "inputs" not in phase_b and "shapes" not in phase_b:
        raise ConfigError("workload.phase_b", "give inputs and outputs, or shapes")

    collision = check_labels(config)
    if collision:
        raise ConfigError(*collision)

    if config["backend"] == "openai" and "url" not in config.get("openai", {}):
        raise ConfigError("openai.url", "required when backend is openai")

    if config["backend"] != "openai":  # an external server's context window is its own business
        _check_lengths(config)
    if config["backend"] == "vllm":
        from connector_tax.launch.vllm import check_settings

        check_settings(config)


# --------------------------------------------------------------------------- public API


def validate_config(config: dict) -> dict:
    """A validated copy of `config` with the schema's defaults filled in; raises ConfigError."""
    if not isinstance(config, dict):
        raise ConfigError(
            "(top level)", f"expected a mapping of study settings, got {_type_word(config)}"
        )
    filled = copy.deepcopy(config)
    errors = list(_validator().iter_errors(filled))
    if errors:
        raise ConfigError(*_describe(_most_specific(errors)))
    _check_semantics(filled)
    return filled


class _StrictLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error: PyYAML keeps the
    last one silently, so a second `phase_a:` would quietly replace the first."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue  # `<<:` merges may legitimately be overridden; complex keys fail later
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first given on line {seen[key] + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path, label: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(None, "no such file", file=label) from None
    except IsADirectoryError:
        raise ConfigError(None, "is a directory, not a config file", file=label) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(None, f"not UTF-8 text (byte {exc.start})", file=label) from None
    except OSError as exc:
        raise ConfigError(None, f"cannot read: {exc.strerror or exc}", file=label) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = exc.problem or exc.context or "unreadable"
        raise ConfigError(where, f"YAML syntax error: {problem}", file=label) from None
    except yaml.YAMLError as exc:
        raise ConfigError(None, f"YAML syntax error: {exc}", file=label) from None


def load_config(path: str | Path) -> dict:
    """Read, validate and default-fill a study config file; raises ConfigError (one line,
    prefixed with the file name as given)."""
    label = str(path)
    data = _read_yaml(Path(path), label)
    if data is None:
        raise ConfigError(
            "(top level)", "the file is empty; expected a mapping of study settings", file=label
        )
    try:
        return validate_config(data)
    except ConfigError as exc:
        raise exc.in_file(label) from None


def find_variant(config: dict, name: str) -> dict:
    """The `configs` entry called `name`."""
    for variant in config["configs"]:
        if variant["name"] == name:
            return variant
    known = ", ".join(v["name"] for v in config["configs"])
    raise ConfigError("configs", f"no config named {name!r} (known: {known})")


def check_file(path: str | Path) -> int:
    """`ctax config check FILE`: 0 and an ok line on stdout, or 2 and the error on stderr."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        f"ok: {path}: study '{config['study']}', {len(config['configs'])} configs, "
        f"backend {config['backend']}"
    )
    return 0
