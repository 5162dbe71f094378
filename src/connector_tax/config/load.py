"""Read, validate and default-fill a study config (configs/*.yaml) before anything runs.

Two layers: the JSON Schema in workflow/schemas/config.schema.yaml (types, ranges, unknown
keys, defaults) and the cross-field checks of config.checks. Either way the user gets ONE
line naming the key path (config.errors).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from jsonschema import Draft202012Validator, validators

from connector_tax import resources
from connector_tax.config.checks import add_aa_control, check_finite, check_semantics
from connector_tax.config.errors import ConfigError, describe, most_specific, type_word
from connector_tax.config.gate_settings import Saturation, Validity
from connector_tax.config.study import Request, StudyConfig


def schema_path() -> Path:
    return resources.path("workflow/schemas/config.schema.yaml")


def default_config_path() -> Path:
    return resources.path("configs/default.yaml")


def _extend_with_default(cls: Any) -> Any:  # jsonschema's validator classes carry no types
    """A validator that fills `default:` values in as it validates, like Snakemake's
    validate(set_default=True), except that it copies each default (a shared `{}` default
    would otherwise be aliased between configs) and never touches a non-mapping."""
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(
        validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]
    ) -> Iterator[Any]:
        if validator.is_type(instance, "object"):
            for key, subschema in properties.items():
                if isinstance(subschema, dict) and "default" in subschema and key not in instance:
                    instance[key] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_default(Draft202012Validator)


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    """The config schema, parsed once per process (read only: callers never change it)."""
    with schema_path().open(encoding="utf-8") as fh:
        schema: dict[str, Any] = yaml.load(fh, Loader=_SafeLoader)  # noqa: S506 - a safe loader
    return schema


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    return _DefaultFillingValidator(_schema())


def _renamed(config: Mapping[str, Any]) -> None:
    """Keys an earlier version of this tool read, named for what replaced them."""
    prime = (config.get("workload") or {}).get("phase_b_prime")
    for where, section in (("configs", config), ("workload.phase_b_prime.configs", prime)):
        if isinstance(section, dict) and "configs" in section and "variants" not in section:
            raise ConfigError(where, "is now called variants (each a server variant: a connector plus its overrides)")


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A validated copy of `config` with the schema's defaults filled in; raises ConfigError."""
    if not isinstance(config, dict):
        raise ConfigError("(top level)", f"expected a mapping of study settings, got {type_word(config)}")
    _renamed(config)
    check_finite(config)
    filled = copy.deepcopy(config)
    errors = list(_validator().iter_errors(filled))
    if errors:
        raise ConfigError(*describe(most_specific(errors)))
    add_aa_control(filled)
    check_semantics(filled)
    return filled


# libyaml's parser where PyYAML has it: the pure-Python one takes ~50 ms over the schema and a
# config, paid by every `ctax` process and simulated server of a study (~50 in the default one).
if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error: PyYAML keeps the
    last one silently, so a second `phase_a:` would quietly replace the first."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
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
    # A config's keys are strings (the schema's properties); yaml types them as any hashable.
    return cast(dict[str, Any], loader.construct_mapping(node, deep=deep))


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


def _load(path: str | Path) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """The config file as written, and validated with the schema's defaults filled in."""
    label = str(path)
    data = _read_yaml(Path(path), label)
    if data is None:
        raise ConfigError("(top level)", "the file is empty; expected a mapping of study settings", file=label)
    try:
        return data, validate_config(data)
    except ConfigError as exc:
        raise exc.in_file(label) from None


def load_config(path: str | Path) -> dict[str, Any]:
    """Read, validate and default-fill a study config file; raises ConfigError (one line,
    prefixed with the file name as given)."""
    return _load(path)[1]


def section_defaults(section: str) -> dict[str, Any]:
    """A top-level section of the config with only the schema's defaults (e.g. `saturation`)."""
    filled: dict[str, Any] = {}
    _DefaultFillingValidator({"type": "object", "properties": {section: _schema()["properties"][section]}}).validate(
        filled
    )
    section_filled: dict[str, Any] = filled[section]
    return section_filled


@functools.lru_cache(maxsize=1)
def default_request() -> Request:
    """The request settings as the schema sets them when a config leaves them out: the load
    generator's own defaults (loadgen.schedule.options, `ctax bench`), written once, in the schema."""
    keys = _schema()["$defs"]["workload"]["properties"]
    return Request.from_mapping({k: keys[k]["default"] for k in Request.KEYS})


def default_saturation() -> Saturation:
    """The saturation criteria as the schema sets them when a config leaves them out."""
    return Saturation(**section_defaults("saturation"))


@functools.lru_cache(maxsize=1)
def default_validity() -> Validity:
    """The validity gate as the schema sets it when a config leaves it out (`ctax bench`)."""
    return Validity.from_mapping(section_defaults("validity"))


def load_study(path: str | Path) -> StudyConfig:
    """`load_config`, as the typed objects of config.study (which remember `path`, and whether
    the file itself names sim.hardware_profile: the schema fills one in when it does not)."""
    written, config = _load(path)
    named = isinstance(written.get("sim"), Mapping) and "hardware_profile" in written["sim"]
    return dataclasses.replace(StudyConfig.from_mapping(config), source=Path(path), hardware_profile_named=named)


def find_variant(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The `configs` entry called `name`."""
    for variant in config["variants"]:
        if variant["name"] == name:
            found: dict[str, Any] = variant
            return found
    known = ", ".join(v["name"] for v in config["variants"])
    raise ConfigError("variants", f"no variant named {name!r} (known: {known})")


def ok_line(path: str | Path, config: Mapping[str, Any]) -> str:
    """What `ctax config check` prints once every check passed."""
    return f"ok: {path}: study '{config['study']}', {len(config['variants'])} variants, backend {config['backend']}"
