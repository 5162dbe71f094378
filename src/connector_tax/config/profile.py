"""An engine profile as plain data: the file a config names with `sim: {profile: FILE}`.

The simulator's hand-set profiles are Python (sim/profiles.py, named by `sim.hardware_profile`);
a calibrated one is a YAML file `ctax calibrate` writes from a real study's records, with the
provenance of every number in it. This module reads and writes that file and checks it against
the study that names it; it knows nothing of the simulator (sim/settings.py turns the numbers
into the engine's cost model) nor of the fitting (calibrate/).

    schema: connector-tax/sim-profile/1
    name: vllm-cpu-tiny                  # what outputs call it
    kind: calibrated                     # calibrated | hand-set
    model: [tiny-llama, results/models/tiny-llama]   # the model(s) it was fitted on
    hardware: {step_base_us, prefill_token_us, decode_seq_us, context_token_us,
               kv_cache_blocks, block_size, schedule_base_us, schedule_request_us, step_gap_us}
    api: {ingress_us: [27 quantiles], egress_us: [27 quantiles]}   # what the API server adds (QUANTILES)
    variants:                            # per server variant of the fitted study
      nixl_both:
        connector: {type: nixl, role: kv_both}
        hooks: {build_meta: {fixed_us, per_request_us, per_block_us}, get_finished: ..., start_load_kv: ...}
        forward_scale: 3.1               # the step-time difference the hooks do not explain:
        extra_us: 0.0                    #   forward x scale + extra
        schedule_scale: 1.4              # schedule()'s own work against the baseline's
        api: {...}                       # this variant's own, where its data differ
    provenance: {...}                    # study, server versions, host, date, cells and fingerprints
    fit: {...}                           # every term's fit quality (informational)

A term the data could not identify is 0 in the numbers (and 1 for a scale) and says so in `fit`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from connector_tax import resources
from connector_tax.config.errors import ConfigError

SCHEMA = "connector-tax/sim-profile/1"
KINDS = ("calibrated", "hand-set")
HARDWARE_KEYS = (
    "step_base_us",
    "prefill_token_us",
    "decode_seq_us",
    "context_token_us",
    "kv_cache_blocks",
    "block_size",
    "schedule_base_us",
    "schedule_request_us",
    "step_gap_us",
)
HOOK_NAMES = ("build_meta", "get_finished", "start_load_kv")
HOOK_TERMS = ("fixed_us", "per_request_us", "per_block_us")
API_KEYS = ("ingress_us", "egress_us")
# The probabilities an api distribution is stored at: every 5 %, and the tail finer. On the 5 %
# grid alone a draw above the 95th percentile fell uniformly between it and the sample's maximum,
# often one outlier ten times the median: the simulated server's real-clock ingress and egress
# (q95 0.7 ms, max 7.7 and 17 ms) put a 64-token cell's TTFT p90 at 9.2 ms, where draws from the
# samples themselves give 7.2 and this grid 7.2 (docs/calibration.md, "The API path's tail").
QUANTILES = tuple(i / 20 for i in range(20)) + (0.96, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
LEGACY_QUANTILES = tuple(i / 20 for i in range(21))  # profiles fitted before 2026-12-02 (21 values)


def grid_for(values: tuple[float, ...]) -> tuple[float, ...]:
    """The probabilities `values` (a stored api distribution) are quantiles at, by their count."""
    return LEGACY_QUANTILES if len(values) == len(LEGACY_QUANTILES) else QUANTILES


@dataclass(frozen=True)
class ApiProfile:
    """What the API server and streaming add beyond the engine: the delay from a request's send
    to the engine seeing it (ingress), and from the step that made a token to the client
    receiving it (egress), each as quantiles on QUANTILES (empty: none)."""

    ingress_us: tuple[float, ...] = ()
    egress_us: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, list[float]]:
        return {"ingress_us": list(self.ingress_us), "egress_us": list(self.egress_us)}


@dataclass(frozen=True)
class VariantProfile:
    """One server variant's connector costs: per hook {fixed_us, per_request_us, per_block_us},
    and the step time the hooks do not explain as forward x forward_scale + extra_us."""

    connector: dict[str, Any] | None
    hooks: dict[str, dict[str, float]] = field(default_factory=dict)
    forward_scale: float = 1.0
    extra_us: float = 0.0
    schedule_scale: float = 1.0  # the scheduler's own work (schedule() without build_meta), x the baseline's
    api: ApiProfile | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"connector": self.connector}
        if self.hooks:
            out["hooks"] = {h: dict(v) for h, v in self.hooks.items()}
        out["forward_scale"] = self.forward_scale
        out["extra_us"] = self.extra_us
        out["schedule_scale"] = self.schedule_scale
        if self.api is not None:
            out["api"] = self.api.as_dict()
        return out


@dataclass(frozen=True)
class EngineProfile:
    name: str
    kind: str
    models: tuple[str, ...]
    hardware: dict[str, float]
    api: ApiProfile
    variants: dict[str, VariantProfile]
    provenance: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # the file it was read from

    def describe(self) -> str:
        """How outputs name it: `vllm-cpu-tiny (calibrated from vLLM 0.32.0 on CPU, study vllm-cpu-tiny)`."""
        origin = self.provenance.get("served_by")
        study = self.provenance.get("study")
        detail = ", ".join(x for x in (f"from {origin}" if origin else None, f"study {study}" if study else None) if x)
        return f"{self.name} ({self.kind}{' ' + detail if detail else ''})"

    def variant_for(self, name: str, connector: Mapping[str, Any] | None) -> VariantProfile | None:
        """The costs fitted for variant `name`, else for a variant with the same connector."""
        if name in self.variants:
            return self.variants[name]
        if connector:
            for fitted in self.variants.values():
                if fitted.connector == connector:
                    return fitted
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "kind": self.kind,
            "model": list(self.models),
            "hardware": dict(self.hardware),
            "api": self.api.as_dict(),
            "variants": {k: v.as_dict() for k, v in self.variants.items()},
            "provenance": self.provenance,
            "fit": self.fit,
        }


def profile_path(name: str | Path) -> Path:
    """Where `sim.profile` points: an absolute path, else relative to the checkout (or, for an
    installed package, the current directory), else a profile shipped under the package's root."""
    path = Path(name)
    if path.is_absolute():
        return path
    first = resources.workdir() / path
    if first.exists():
        return first
    try:
        shipped = resources.root() / path
    except ValueError:
        return first
    return shipped if shipped.exists() else first


def _number(value: Any, where: str, integer: bool = False, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(where, f"expected a finite number, got {value!r}")
    if value < 0 or (positive and value <= 0):
        raise ConfigError(where, f"must be {'positive' if positive else 'non-negative'}, got {value!r}")
    if integer and float(value) != int(value):
        raise ConfigError(where, f"expected an integer, got {value!r}")
    return int(value) if integer else float(value)


def _signed(value: Any, where: str) -> float:
    """A number that may be negative (an offset that goes with a scale above 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(where, f"expected a finite number, got {value!r}")
    return float(value)


def _grid(value: Any, where: str) -> tuple[float, ...]:
    if value in (None, []):
        return ()
    if not isinstance(value, list) or len(value) not in (len(QUANTILES), len(LEGACY_QUANTILES)):
        raise ConfigError(
            where,
            f"expected {len(QUANTILES)} quantiles (0, 5, ..., 95, 96, 97, 98, 99, 99.5, 99.9, 100 %) "
            f"or, fitted before 2026-12-02, {len(LEGACY_QUANTILES)} (0, 5, ..., 100 %)",
        )
    grid = tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(value))
    if any(b < a for a, b in zip(grid, grid[1:])):
        raise ConfigError(where, "quantiles must not decrease")
    return grid


def _api(value: Any, where: str) -> ApiProfile:
    if value is None:
        return ApiProfile()
    if not isinstance(value, dict):
        raise ConfigError(where, "expected a mapping with ingress_us and egress_us")
    unknown = sorted(set(value) - set(API_KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key (known: {', '.join(API_KEYS)})")
    return ApiProfile(*(_grid(value.get(k), f"{where}.{k}") for k in API_KEYS))


def _variant(value: Any, where: str) -> VariantProfile:
    if not isinstance(value, dict):
        raise ConfigError(where, "expected a mapping")
    hooks: dict[str, dict[str, float]] = {}
    for hook, terms in (value.get("hooks") or {}).items():
        if hook not in HOOK_NAMES:
            raise ConfigError(f"{where}.hooks.{hook}", f"unknown hook (known: {', '.join(HOOK_NAMES)})")
        if not isinstance(terms, dict) or set(terms) - set(HOOK_TERMS):
            raise ConfigError(f"{where}.hooks.{hook}", f"expected a mapping of {', '.join(HOOK_TERMS)}")
        hooks[hook] = {t: _number(terms.get(t, 0.0), f"{where}.hooks.{hook}.{t}") for t in HOOK_TERMS}
    connector = value.get("connector")
    if connector is not None and not isinstance(connector, dict):
        raise ConfigError(f"{where}.connector", "expected a connector mapping or null")
    return VariantProfile(
        connector=connector,
        hooks=hooks,
        forward_scale=_number(value.get("forward_scale", 1.0), f"{where}.forward_scale", positive=True),
        extra_us=_signed(value.get("extra_us", 0.0), f"{where}.extra_us"),
        schedule_scale=_number(value.get("schedule_scale", 1.0), f"{where}.schedule_scale", positive=True),
        api=_api(value["api"], f"{where}.api") if "api" in value else None,
    )


def parse_profile(data: Any, source: str | None = None) -> EngineProfile:
    """The profile in `data` (a mapping read from YAML); raises ConfigError (one line)."""
    if not isinstance(data, dict):
        raise ConfigError("(top level)", "expected a mapping (an engine profile)")
    if data.get("schema") != SCHEMA:
        raise ConfigError("schema", f"expected {SCHEMA!r}, got {data.get('schema')!r}: not an engine profile")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ConfigError("kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    models = data.get("model")
    models = [models] if isinstance(models, str) else models
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        raise ConfigError("model", "expected the model name(s) the profile was fitted on")
    hardware_in = data.get("hardware")
    if not isinstance(hardware_in, dict):
        raise ConfigError("hardware", "expected a mapping of the engine's step costs")
    unknown = sorted(set(hardware_in) - set(HARDWARE_KEYS))
    if unknown:
        raise ConfigError(f"hardware.{unknown[0]}", f"unknown key (known: {', '.join(HARDWARE_KEYS)})")
    hardware: dict[str, float] = {}
    for key in HARDWARE_KEYS:
        if key not in hardware_in:
            if key == "step_gap_us":
                continue
            raise ConfigError(f"hardware.{key}", "missing")
        integer = key in ("kv_cache_blocks", "block_size")
        hardware[key] = _number(hardware_in[key], f"hardware.{key}", integer=integer, positive=integer)
    variants_in = data.get("variants") or {}
    if not isinstance(variants_in, dict):
        raise ConfigError("variants", "expected a mapping of variant name to its costs")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("name", "expected the profile's name")
    return EngineProfile(
        name=name,
        kind=kind,
        models=tuple(models),
        hardware=hardware,
        api=_api(data.get("api"), "api"),
        variants={str(k): _variant(v, f"variants.{k}") for k, v in variants_in.items()},
        provenance=data.get("provenance") or {},
        fit=data.get("fit") or {},
        source=source,
    )


def read_profile(name: str | Path) -> EngineProfile:
    """Read and check the profile file `name` (see profile_path); ConfigError names the file."""
    path = profile_path(name)
    label = str(name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(None, "no such file", file=label) from None
    except OSError as exc:
        raise ConfigError(None, f"cannot read: {exc.strerror or exc}", file=label) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(None, f"YAML syntax error: {' '.join(str(exc).split())}", file=label) from None
    try:
        return parse_profile(data, source=str(path))
    except ConfigError as exc:
        raise exc.in_file(label) from None


def dump_profile(profile: EngineProfile) -> str:
    return yaml.safe_dump(profile.as_dict(), sort_keys=False, default_flow_style=None, width=120)


def model_names(config: Mapping[str, Any]) -> set[str]:
    """The names a study's model goes by (its path or id, and the served name)."""
    model = config.get("model") or {}
    return {n for n in (model.get("name"), model.get("served_name")) if n}


def check_model(profile: EngineProfile, config: Mapping[str, Any], where: str = "sim.profile") -> None:
    """A profile fitted on one model says nothing about another: ConfigError if the study's
    model is not among the profile's."""
    if not model_names(config) & set(profile.models):
        fitted = ", ".join(profile.models)
        serves = config.get("model", {}).get("served_name") or config.get("model", {}).get("name")
        raise ConfigError(
            where, f"{profile.source or profile.name} was fitted on model {fitted}, the study serves {serves}"
        )


def check_study_profile(config: Mapping[str, Any]) -> EngineProfile | None:
    """For a config naming `sim.profile`: the profile, read and matched to the study's model."""
    name = (config.get("sim") or {}).get("profile")
    if not name:
        return None
    try:
        profile = read_profile(name)
    except ConfigError as exc:
        raise ConfigError("sim.profile", str(exc)) from None
    check_model(profile, config)
    return profile
