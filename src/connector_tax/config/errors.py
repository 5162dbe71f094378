"""How a config error reads: one line naming the key path, in words a config author uses.

`ConfigError` is what every layer raises; `describe_schema_error` turns a jsonschema error into
(key path, problem), e.g. `variants[2].name: 'Mooncake Both' does not match ^[a-z0-9][a-z0-9_-]*$`,
because a config error is fixed by editing one key and a jsonschema dump buries that key.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from jsonschema.exceptions import ValidationError, relevance

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


def key_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def show(value: Any, limit: int = 60) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _keys(keys: Iterable[Any]) -> str:
    return ", ".join(show(k) for k in keys)


_VALUE_WORDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def type_word(value: Any) -> str:
    return _VALUE_WORDS.get(type(value), type(value).__name__)


def _branch_score(errors: list[ValidationError], depth: int) -> tuple[int, int]:
    """How badly one oneOf/anyOf alternative failed: the count of distinct kinds of structural
    failure at the alternative's own level (wrong type, missing keys, unknown keys), then how
    deep its deepest error goes (deeper = it got further). Lower is a closer match."""
    structural = {
        e.validator
        for e in errors
        if len(e.absolute_path) == depth and e.validator in ("type", "required", "additionalProperties")
    }
    deepest = max((len(e.absolute_path) for e in errors), default=depth)
    return (len(structural), -deepest)


def most_specific(errors: Iterable[ValidationError]) -> ValidationError:
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


def describe(error: ValidationError) -> tuple[str, str]:
    """(key path, problem) for one jsonschema error, in words a config author uses."""
    where = key_path(error.absolute_path)
    kind, expected, value = error.validator, error.validator_value, error.instance

    if "propertyNames" in error.relative_schema_path:
        if kind == "pattern" and expected in _PATTERN_HINTS:
            return where, f"key {show(value)} {_PATTERN_HINTS[expected]}"
        return where, f"key {show(value)} is not allowed here"
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
        got = "null" if value is None else f"{type_word(value)} {show(value)}"
        return where, f"expected {words}, got {got}"
    if kind == "enum":
        return where, f"{show(value)} is not one of {', '.join(str(v) for v in expected)}"
    if kind == "pattern":
        if expected in _PATTERN_HINTS:
            return where, f"{show(value)} {_PATTERN_HINTS[expected]}"
        return where, f"{show(value)} does not match {expected}"
    if kind == "minimum":
        return where, f"{show(value)} is less than the minimum of {expected}"
    if kind == "exclusiveMinimum":
        return where, f"{show(value)} must be greater than {expected}"
    if kind == "maximum":
        return where, f"{show(value)} is greater than the maximum of {expected}"
    if kind == "exclusiveMaximum":
        return where, f"{show(value)} must be less than {expected}"
    if kind in ("minItems", "minLength"):
        if expected == 1:
            return where, "must not be empty"
        return where, f"must have at least {expected} items (has {len(value)})"
    if kind == "uniqueItems":
        for i, item in enumerate(value):
            if item in value[:i]:
                return where, f"duplicate value {show(item)}"
        return where, "values must be unique"
    if kind == "oneOf":
        return where, "matches more than one of the allowed forms"
    return where, error.message
