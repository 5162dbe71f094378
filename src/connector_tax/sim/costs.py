"""The step-duration model: compute cost of a batch plus the configured connector's hooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector_tax.sim.profiles import ConnectorCosts, HardwareProfile, HookCost


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
    # The scheduler's share of the step, Scheduler.schedule() entry to exit as the design
    # defines step_duration_us: its own work (part of step_base_us, so it adds no time to the
    # step) plus build_connector_meta, which runs inside schedule().
    schedule_us: float = 0.0


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
    A custom (or noop) connector is modelled as the framework alone.
    """
    if not connector:
        return None
    terms = [ConnectorTerm(table["framework"], 1.0)]
    kind = connector["type"]
    if kind == "multi":
        for child in connector["children"]:
            if child["type"] in table:
                terms.append(ConnectorTerm(table[child["type"]], role_scale[child["role"]]))
        terms.append(ConnectorTerm(table["multi_interaction"], 1.0))
    elif kind in table and kind != "framework":
        terms.append(ConnectorTerm(table[kind], role_scale[connector["role"]]))
    return terms


class CostModel:
    def __init__(self, hardware: HardwareProfile, terms: list[ConnectorTerm] | None) -> None:
        self.hardware = hardware
        self.terms = terms

    def _hook(self, hook: str, batch: BatchShape) -> float | None:
        if self.terms is None:
            return None
        total = 0.0
        for term in self.terms:
            cost: HookCost = getattr(term.costs, hook)
            total += term.scale * cost.cost_us(batch.running, batch.blocks_in_use)
        return total

    def step(self, batch: BatchShape) -> StepCost:
        hw = self.hardware
        forward = (
            hw.step_base_us
            + hw.prefill_token_us * batch.prefill_tokens
            + hw.decode_seq_us * batch.decode_seqs
            + hw.context_token_us * batch.context_tokens
        )
        build = self._hook("build_meta", batch)
        finished = self._hook("get_finished", batch)
        load = self._hook("start_load_kv", batch)
        hooks = (build or 0.0) + (finished or 0.0) + (load or 0.0)
        schedule = hw.schedule_base_us + hw.schedule_request_us * batch.running + (build or 0.0)
        return StepCost(forward + hooks, forward, build, finished, load, schedule_us=schedule)
