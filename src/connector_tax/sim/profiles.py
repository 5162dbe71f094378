"""Named hardware profiles and connector cost defaults of the simulated engine.

Every number here is a model parameter, not a measurement: outputs made with them are
"simulated". The step-duration model is

    step_us = step_base_us
            + prefill_token_us * prefill tokens scheduled this step
            + decode_seq_us    * decode sequences scheduled this step
            + context_token_us * context tokens attended by every scheduled sequence
            + connector hooks  (build_meta + get_finished + start_load_kv, see HookCost)

and a connector hook costs `fixed_us + per_request_us * running + per_block_us * blocks`.
The step log's step_duration_us is the scheduler's share of a step, as the study defines it
(Scheduler.schedule(): schedule_base_us + schedule_request_us * running, part of step_base_us,
plus build_meta, which runs inside it); engine_step_us is the whole step_us above.
`blocks` is the number of KV blocks held by running requests, so a connector's tax grows with
input length (H5) and is paid on every decode step too (H6).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

HOOKS = ("build_meta", "get_finished", "start_load_kv")
CONNECTOR_KINDS = ("framework", "mooncake", "nixl", "lmcache", "multi_interaction")
ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class HardwareProfile:
    """Cost of one engine step on a simulated GPU, and the size of its KV cache."""

    step_base_us: float
    prefill_token_us: float
    decode_seq_us: float
    context_token_us: float
    kv_cache_blocks: int
    block_size: int = 16
    # The scheduler's own work per step (Scheduler.schedule() without the connector): counted
    # inside step_base_us, reported as the scheduler's share of the step (step_duration_us).
    schedule_base_us: float = 150.0
    schedule_request_us: float = 1.5
    # The engine loop's time between one step's end and the next step's start (output handling,
    # input polling): not part of a step record's engine_step_us, but of every token's time.
    step_gap_us: float = 0.0


# Both are HAND-SET: numbers chosen for a purpose, not fitted to any engine (a calibrated profile is
# a file `ctax calibrate` writes from a real study, named by `sim.profile`: config/profile.py).
# tiny-fast: a small, fast "GPU" whose knee falls at tens of req/s with short prompts, so
# the default study sweeps every stage in minutes. h20-qwen3-30b-a3b: the real
# study's H20 at its own scale (decode step ~10 ms, prefill ~18k tokens/s, ~260k tokens of KV cache:
# 96 GB x 0.9 minus 61 GB of weights at 96 KiB of KV per token).
HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    "tiny-fast": HardwareProfile(
        step_base_us=4000.0,
        prefill_token_us=25.0,
        decode_seq_us=150.0,
        context_token_us=0.05,
        kv_cache_blocks=16384,
    ),
    "h20-qwen3-30b-a3b": HardwareProfile(
        step_base_us=9000.0,
        prefill_token_us=55.0,
        decode_seq_us=120.0,
        context_token_us=0.025,
        kv_cache_blocks=16384,
    ),
}


@dataclass(frozen=True)
class HookCost:
    """Modelled host time of one connector hook in one step, in microseconds."""

    fixed_us: float = 0.0
    per_request_us: float = 0.0
    per_block_us: float = 0.0

    def cost_us(self, running: int, blocks: int) -> float:
        return self.fixed_us + self.per_request_us * running + self.per_block_us * blocks


@dataclass(frozen=True)
class ConnectorCosts:
    """Per-hook costs of one connector kind."""

    build_meta: HookCost = field(default_factory=HookCost)
    get_finished: HookCost = field(default_factory=HookCost)
    start_load_kv: HookCost = field(default_factory=HookCost)


# Sized so the simulated study shows taxes of a plausible order: framework dispatch alone
# (noop_connector) ~1% of a step, mooncake_both up to ~10-15% of a loaded step, NIXL a few
# points below Mooncake (H2), LMCache smaller, and a MultiConnector paying its children plus
# an interaction term (H4).
DEFAULT_CONNECTOR_COSTS: dict[str, dict[str, dict[str, float]]] = {
    "framework": {
        "build_meta": {"fixed_us": 25.0, "per_request_us": 2.0, "per_block_us": 0.0},
        "get_finished": {"fixed_us": 15.0, "per_request_us": 1.0, "per_block_us": 0.0},
        "start_load_kv": {"fixed_us": 10.0, "per_request_us": 0.5, "per_block_us": 0.0},
    },
    "mooncake": {
        "build_meta": {"fixed_us": 150.0, "per_request_us": 25.0, "per_block_us": 0.25},
        "get_finished": {"fixed_us": 100.0, "per_request_us": 15.0, "per_block_us": 0.1},
        "start_load_kv": {"fixed_us": 60.0, "per_request_us": 10.0, "per_block_us": 0.05},
    },
    "nixl": {
        "build_meta": {"fixed_us": 110.0, "per_request_us": 18.0, "per_block_us": 0.18},
        "get_finished": {"fixed_us": 80.0, "per_request_us": 10.0, "per_block_us": 0.08},
        "start_load_kv": {"fixed_us": 50.0, "per_request_us": 8.0, "per_block_us": 0.04},
    },
    "lmcache": {
        "build_meta": {"fixed_us": 80.0, "per_request_us": 12.0, "per_block_us": 0.12},
        "get_finished": {"fixed_us": 40.0, "per_request_us": 5.0, "per_block_us": 0.0},
        "start_load_kv": {"fixed_us": 60.0, "per_request_us": 8.0, "per_block_us": 0.08},
    },
    "multi_interaction": {
        "build_meta": {"fixed_us": 30.0, "per_request_us": 4.0, "per_block_us": 0.02},
        "get_finished": {"fixed_us": 20.0, "per_request_us": 2.0, "per_block_us": 0.0},
        "start_load_kv": {"fixed_us": 10.0, "per_request_us": 1.0, "per_block_us": 0.0},
    },
}

# A producer or a consumer runs about half of kv_both's bookkeeping each.
DEFAULT_ROLE_SCALE: dict[str, float] = {"kv_producer": 0.6, "kv_consumer": 0.7, "kv_both": 1.0}


def hardware_profile(name: str, overrides: dict[str, Any] | None = None) -> HardwareProfile:
    if name not in HARDWARE_PROFILES:
        known = ", ".join(sorted(HARDWARE_PROFILES))
        raise ValueError(f"sim.hardware_profile: unknown profile {name!r} (known: {known})")
    base = HARDWARE_PROFILES[name]
    values = {f.name: getattr(base, f.name) for f in fields(HardwareProfile)}
    values.update(overrides or {})
    return HardwareProfile(**values)


def connector_cost_table(
    overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, ConnectorCosts], dict[str, float]]:
    """The cost of every connector kind and the role scale, with config overrides applied."""
    table = copy.deepcopy(DEFAULT_CONNECTOR_COSTS)
    role_scale = dict(DEFAULT_ROLE_SCALE)
    for kind, hooks in (overrides or {}).items():
        if kind == "role_scale":
            role_scale.update(hooks)
            continue
        for hook, parts in hooks.items():
            table[kind][hook].update(parts)
    costs = {
        kind: ConnectorCosts(**{hook: HookCost(**parts) for hook, parts in hooks.items()})
        for kind, hooks in table.items()
    }
    return costs, role_scale
