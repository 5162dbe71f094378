"""The step-duration model: compute cost of a batch plus the configured connector's hooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector_tax.sim.profiles import HOOKS, ConnectorCosts, HardwareProfile, HookCost


@dataclass(frozen=True)
class BatchShape:
    """What one engine step computes."""

    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    running: int
    blocks_in_use: int


@dataclass(frozen=True)
class StepCost:
    # The whole engine step (forward + connector hooks): how long the step takes.
    duration_us: float
    forward_us: float
    # None when no connector is configured: plain vLLM never calls these hooks.
    build_meta_us: float | None
    get_finished_us: float | None
    start_load_kv_us: float | None
    # The scheduler's share of the step, Scheduler.schedule() entry to exit as the study
    # defines step_duration_us: its own work (part of step_base_us, so it adds no time to the
    # step) plus build_connector_meta, which runs inside schedule().
    schedule_us: float = 0.0
    # The engine loop's time after the step before the next one starts (HardwareProfile.step_gap_us).
    gap_us: float = 0.0

    @property
    def period_us(self) -> float:
        """How far the clock moves for this step: the step, then the loop's gap."""
        return self.duration_us + self.gap_us


@dataclass(frozen=True)
class FittedCosts:
    """A variant's connector costs as a calibrated profile fitted them (config/profile.py): the
    summed coefficients of each hook, the step time the hooks do not explain, as
    forward x forward_scale + extra_us, and the scheduler's own work x schedule_scale."""

    hooks: dict[str, tuple[float, float, float]]  # hook -> (fixed_us, per_request_us, per_block_us)
    forward_scale: float = 1.0
    extra_us: float = 0.0
    schedule_scale: float = 1.0  # the scheduler's own work, against the hardware profile's


@dataclass(frozen=True)
class ConnectorTerm:
    costs: ConnectorCosts
    scale: float


def connector_terms(
    connector: dict[str, Any] | None,
    table: dict[str, ConnectorCosts],
    role_scale: dict[str, float],
) -> list[ConnectorTerm] | None:
    """The cost terms a connector configuration pays each step; None for no connector.

    Every connector pays vLLM's framework dispatch once; an implementation adds its own
    work scaled by role; a MultiConnector adds each child's work plus an interaction term.
    A custom (or noop) connector is modelled as the framework alone; LMCache's multi-process mode
    (lmcache_mp) with LMCache's hand-set costs (no model of its own: its server is a process beside
    the engine, which the simulator does not model).
    """
    if not connector:
        return None
    terms = [ConnectorTerm(table["framework"], 1.0)]
    kind = _KIND_COSTS.get(connector["type"], connector["type"])
    if kind == "multi":
        for child in connector["children"]:
            child_kind = _KIND_COSTS.get(child["type"], child["type"])
            if child_kind in table:
                terms.append(ConnectorTerm(table[child_kind], role_scale[child["role"]]))
        terms.append(ConnectorTerm(table["multi_interaction"], 1.0))
    elif kind in table and kind != "framework":
        terms.append(ConnectorTerm(table[kind], role_scale[connector["role"]]))
    return terms


# Connector types costed as another's.
_KIND_COSTS = {"lmcache_mp": "lmcache"}


class CostModel:
    """`fitted`: a calibrated profile's costs of this variant instead of the hand-set `terms` (its
    hooks replace the terms'). `speed`: this launch's speed factor (sim.launch_bias_sd): every step
    of the launch takes `speed` times its modelled time, as a GPU that runs a little hot or cold for
    a whole launch."""

    def __init__(
        self,
        hardware: HardwareProfile,
        terms: list[ConnectorTerm] | None,
        fitted: FittedCosts | None = None,
        speed: float = 1.0,
    ) -> None:
        self.hardware = hardware
        self.terms = terms
        self.scale = fitted.forward_scale if fitted else 1.0
        self.extra_us = fitted.extra_us if fitted else 0.0
        self.schedule_scale = fitted.schedule_scale if fitted else 1.0
        self.speed = speed
        # Each hook is linear in (running, blocks): sum the terms' coefficients once, so a step
        # costs three multiply-adds per hook however many connectors a MultiConnector holds.
        self._coef: dict[str, tuple[float, float, float]] | None = None
        if terms is not None:
            self._coef = {}
            for hook in HOOKS:
                parts: list[HookCost] = [getattr(t.costs, hook) for t in terms]
                self._coef[hook] = (
                    sum(t.scale * c.fixed_us for t, c in zip(terms, parts)),
                    sum(t.scale * c.per_request_us for t, c in zip(terms, parts)),
                    sum(t.scale * c.per_block_us for t, c in zip(terms, parts)),
                )
        if fitted is not None:
            self._coef = {hook: fitted.hooks.get(hook, (0.0, 0.0, 0.0)) for hook in HOOKS} if fitted.hooks else None

    def _hook(self, hook: str, batch: BatchShape) -> float | None:
        if self._coef is None:
            return None
        fixed, per_request, per_block = self._coef[hook]
        return fixed + per_request * batch.running + per_block * batch.blocks_in_use

    def step(self, batch: BatchShape) -> StepCost:
        hw = self.hardware
        forward = (
            hw.step_base_us
            + hw.prefill_token_us * batch.prefill_tokens
            + hw.decode_seq_us * batch.decode_seqs
            + hw.context_token_us * batch.context_tokens
        ) * self.scale + self.extra_us
        build = self._hook("build_meta", batch)
        finished = self._hook("get_finished", batch)
        load = self._hook("start_load_kv", batch)
        hooks = (build or 0.0) + (finished or 0.0) + (load or 0.0)
        schedule = (hw.schedule_base_us + hw.schedule_request_us * batch.running) * self.schedule_scale + (build or 0.0)
        if self.speed != 1.0:
            k = self.speed
            forward, hooks, schedule = forward * k, hooks * k, schedule * k
            build, finished, load = (None if h is None else h * k for h in (build, finished, load))
        return StepCost(forward + hooks, forward, build, finished, load, schedule_us=schedule, gap_us=hw.step_gap_us)
