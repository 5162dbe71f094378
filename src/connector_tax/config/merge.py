"""The merge rule: a variant's settings over the study's, one rule for every reader."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in, mapping by mapping (a copy: neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Server settings that change how long the pipeline waits, never what is measured.
_NOT_MEASURED = ("ready_timeout_s",)


def merged_server(config: Mapping[str, Any], variant: Mapping[str, Any]) -> dict[str, Any]:
    """The study's `server` with a variant's overrides; extra_args of both, in order; without
    the settings that cannot change a measurement."""
    overrides = variant.get("server") or {}
    merged = {**(config.get("server") or {}), **{k: v for k, v in overrides.items() if k != "extra_args"}}
    for key in _NOT_MEASURED:
        merged.pop(key, None)
    merged["extra_args"] = list((config.get("server") or {}).get("extra_args") or []) + list(
        overrides.get("extra_args") or []
    )
    return merged
