"""Resolve one server variant of a study config into what the simulated server runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from connector_tax.config import StudyConfig, Variant
from connector_tax.config.merge import deep_merge
from connector_tax.config.profile import ApiProfile, EngineProfile, check_study_profile
from connector_tax.sim.admission import AdmissionSettings
from connector_tax.sim.costs import CostModel, FittedCosts, connector_terms
from connector_tax.sim.engine import EngineSettings
from connector_tax.sim.faults import FaultSettings
from connector_tax.sim.profiles import HardwareProfile, connector_cost_table, hardware_profile


@dataclass(frozen=True)
class SimSettings:
    variant: str
    model: str
    host: str
    vllm_version: str
    engine: EngineSettings
    cost_model: CostModel
    faults: FaultSettings
    connector: dict[str, Any] | None
    speed_factor: float = 1.0  # this launch's (sim.launch_bias_sd; 1 without a launch seed)
    # The engine profile, as outputs name it: "tiny-fast (hand-set)", or a calibrated file's.
    profile: str = "tiny-fast (hand-set)"
    # Where the variant's connector costs come from: "calibrated", "hand-set" or "none" (no connector).
    costs_source: str = "none"
    # What the API server adds beyond the engine (virtual clocks only; None: nothing).
    api: ApiProfile | None = None


def _calibrated(
    profile: EngineProfile, sim: dict[str, Any], variant: Variant
) -> tuple[HardwareProfile, FittedCosts | None, ApiProfile, str]:
    """The hardware, this variant's fitted costs (None: none fitted) and API delays of a
    calibrated profile, with the config's `sim.hardware` overrides on top."""
    hardware = HardwareProfile(**{**profile.hardware, **(sim.get("hardware") or {})})
    fitted = profile.variant_for(variant.name, variant.connector)
    if fitted is None:
        return hardware, None, profile.api, "hand-set"
    hooks = {h: (t["fixed_us"], t["per_request_us"], t["per_block_us"]) for h, t in fitted.hooks.items()}
    costs = FittedCosts(
        hooks=hooks,
        forward_scale=fitted.forward_scale,
        extra_us=fitted.extra_us,
        schedule_scale=fitted.schedule_scale,
    )
    return hardware, costs, fitted.api or profile.api, "calibrated"


def speed_factor(bias_sd: float, launch_seed: int | None) -> float:
    """A launch's speed factor: exp(N(0, bias_sd^2)) drawn from its launch seed (median 1: the
    nominal engine is the typical launch, which is what the truth oracle computes); 1 when the
    bias is off or the launch has no seed."""
    if not bias_sd or launch_seed is None:
        return 1.0
    return math.exp(bias_sd * float(np.random.default_rng(launch_seed).standard_normal()))


def resolve(
    study: StudyConfig, variant: Variant, faults: dict[str, Any], launch_seed: int | None = None
) -> SimSettings:
    """`variant` is one of the `study`'s; `faults` (from the command line) override the config's
    own; `launch_seed` draws this launch's speed factor when the study turns the per-launch bias on
    (sim.launch_bias_sd). The `server` and `sim` sections are the simulator's to read: the
    engine's settings and the simulator's own, a variant's on top of the study's."""
    server = deep_merge(dict(study.server), dict(variant.server))
    sim = deep_merge(dict(study.sim), dict(variant.sim))
    admission = AdmissionSettings(**sim.get("admission", {}))
    table, role_scale = connector_cost_table(sim.get("connector_costs"))
    connector = dict(variant.connector) if variant.connector else None
    profile = check_study_profile({**study.raw, "sim": sim})
    fitted: FittedCosts | None = None
    api: ApiProfile | None = None
    if profile is not None:
        hardware, fitted, api, source = _calibrated(profile, sim, variant)
        label = profile.describe()
    else:
        name = sim.get("hardware_profile", "tiny-fast")
        hardware, source, label = hardware_profile(name, sim.get("hardware")), "hand-set", f"{name} (hand-set)"
    # A variant without a connector has no connector costs; one the profile did not fit keeps the
    # hand-set model of its connector kind (and says so: costs_source).
    terms = None if fitted is not None else connector_terms(connector, table, role_scale)
    source = source if connector else "none"
    engine = EngineSettings(
        max_num_batched_tokens=server.get("max_num_batched_tokens", 8192),
        max_num_seqs=server.get("max_num_seqs", 256),
        max_model_len=server.get("max_model_len", 200000),
        enable_chunked_prefill=server.get("enable_chunked_prefill", True),
        enable_prefix_caching=server.get("enable_prefix_caching", True),
        admission=admission,
    )
    speed = speed_factor(float(sim.get("launch_bias_sd") or 0.0), launch_seed)
    capacity = hardware.kv_cache_blocks * hardware.block_size
    if engine.max_model_len > capacity:
        # vLLM refuses to start in the same situation rather than hang on a long prompt.
        raise ValueError(
            f"server.max_model_len: {engine.max_model_len} exceeds the KV cache of the "
            f"{label} profile ({capacity} tokens)"
        )
    return SimSettings(
        variant=variant.name,
        model=study.model.served,
        host=server.get("host", "127.0.0.1"),
        vllm_version=study.vllm_version or "0.33.0",
        engine=engine,
        cost_model=CostModel(hardware, terms, fitted, speed),
        faults=FaultSettings.from_dict({**sim.get("faults", {}), **faults}),
        connector=connector,
        speed_factor=speed,
        profile=label,
        costs_source=source,
        api=api,
    )
