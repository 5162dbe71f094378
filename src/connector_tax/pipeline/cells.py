"""Which cells a configuration runs in each phase, from the study config and reference rates."""

from __future__ import annotations

import random
from typing import Any

from connector_tax.loadgen.session import CellSpec
from connector_tax.loadgen.shapes import ShapeSampler

PHASE_A, PHASE_B, PHASE_B_PRIME = "phase_a", "phase_b", "phase_b_prime"


def rate_label(rate: float) -> str:
    return f"r{rate:g}"


def shape_label(shape: dict[str, Any]) -> str:
    if "input" in shape:
        return f"{shape['input']}x{shape['output']}"
    return ShapeSampler(shape, 0).label()


def _common(workload: dict[str, Any]) -> dict[str, Any]:
    return {
        "warmup_s": workload["warmup_s"],
        "duration_s": workload["duration_s"],
        "min_completed": workload["min_completed"],
    }


def phase_a_cells(config: dict[str, Any]) -> list[CellSpec]:
    workload = config["workload"]
    shape = workload["phase_a"]["shape"]
    return [
        CellSpec(phase=PHASE_A, label=rate_label(rate), arrival="poisson", rate=rate, shape=shape, **_common(workload))
        for rate in workload["phase_a"]["rates"]
    ]


def phase_b_shapes(config: dict[str, Any]) -> list[dict[str, Any]]:
    phase_b = config["workload"]["phase_b"]
    shapes = [{"input": i, "output": o} for i in phase_b.get("inputs", []) for o in phase_b.get("outputs", [])]
    return shapes + list(phase_b.get("shapes", []))


def phase_b_cells(config: dict[str, Any], name: str, reference: dict[str, Any]) -> list[CellSpec]:
    """Phase B at its reference rate, then Phase B' (same launch) where the study asks for it."""
    workload = config["workload"]
    rate = reference[workload["phase_b"]["rate"]]
    cells = [
        CellSpec(phase=PHASE_B, label=shape_label(s), arrival="poisson", rate=rate, shape=s, **_common(workload))
        for s in phase_b_shapes(config)
    ]
    prime = workload.get("phase_b_prime")
    if prime and name in prime["configs"] and reference["ref_load"] != reference["ref_safe"]:
        prime_rate = reference[prime["rate"]]
        cells += [
            CellSpec(phase=PHASE_B_PRIME, label=shape_label(s), arrival="poisson", rate=prime_rate, shape=s,
                     **_common(workload))  # fmt: skip
            for s in prime["shapes"]
        ]
    return cells


def run_order(config: dict[str, Any]) -> list[str]:
    """The design's defence against thermal drift: configs in a seeded random order."""
    names = [c["name"] for c in config["configs"]]
    random.Random(config["seed"]).shuffle(names)
    return names
