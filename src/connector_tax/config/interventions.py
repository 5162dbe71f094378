"""Declared interventions: small, disclosed changes a variant may ask to be loaded into vLLM's processes.

A variant names them (`interventions: [nixl_progress_off]`); the launch passes the names to the
instrumentation's site hook (patches/site/sitecustomize.py), which loads each one's module
(patches/interventions/) into every vLLM process of that launch and no other. Each is part of the
variant's settings, so of its fingerprint, and every output discloses it (run.json
`interventions` and `workarounds`, the manifest, the report). The registry is this table: the
names, the connector each acts on, what it changes in words (patches/ keeps equal copies of the
names and disclosures, since code there imports nothing of the package: a test checks), and, for
the report, the symptom it removes and the overlay that tests it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connector_tax.config.errors import ConfigError
from connector_tax.config.vllm_rules import connector_types

INTERVENTIONS_ENV = "CONNECTOR_TAX_INTERVENTIONS"  # = patches.interventions.INTERVENTIONS_ENV


@dataclass(frozen=True)
class Intervention:
    name: str
    connector: str  # the connector type it acts on (the variant must have one, or a child)
    disclosure: str  # what it changes in vLLM's behaviour, as every output says it
    removes: str  # the suspected cause it removes, in words
    thread: str | None = None  # a busy-at-idle thread it addresses: text in the thread's `started_by`
    overlay: str | None = None  # the overlay that measures the variant beside it
    cpu_only: bool = False  # acts only without an accelerator (the guard): required there


REGISTRY: dict[str, Intervention] = {
    i.name: i
    for i in (
        Intervention(
            "mooncake_cpu_guard",
            "mooncake",
            "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0",
            "vLLM's MooncakeConnectorWorker asking torch for an accelerator's device index on a host without one",
            cpu_only=True,
        ),
        Intervention(
            "nixl_progress_off",
            "nixl",
            "NIXL agent without its progress thread (nixl_agent_config(enable_prog_thread=False)): UCX is "
            "progressed by the agent's own calls",
            "NIXL's UCX progress thread, which polls with a 0 ms timeout (nixl's Python agent sets pthrDelay = 0)",
            thread="Nixl",
            overlay="configs/overlays/nixl-progress.yaml",
        ),
        Intervention(
            "nixl_progress_delay_1ms",
            "nixl",
            "NIXL agent's progress thread polls with a 1 ms timeout (nixlAgentConfig.pthrDelay = 1000 us, not "
            "the Python agent's 0)",
            "the busy loop of NIXL's UCX progress thread (a 0 ms poll timeout), keeping the thread",
            thread="Nixl",
            overlay="configs/overlays/nixl-progress.yaml",
        ),
        Intervention(
            "nixl_kv_core_off_compute",
            "nixl",
            "vLLM's NIXL worker reserves each NUMA node's highest core outside VLLM_CPU_OMP_THREADS_BIND "
            "(rsv_cores_for_kv), not the node's highest core: the thread that builds it is moved there",
            "vLLM's CPU reservation for NIXL (rsv_cores_for_kv, each node's highest core) landing on the worker's "
            "compute core",
            overlay="configs/overlays/nixl-reservation.yaml",
        ),
        Intervention(
            "nixl_agent_off_compute",
            "nixl",
            "NIXL's agent is built with its building thread on the cores vLLM would reserve outside "
            "VLLM_CPU_OMP_THREADS_BIND, then the thread is put back: the agent's threads run off the compute cores",
            "NIXL's agent threads (its progress thread among them) inheriting the worker's compute core",
            thread="Nixl",
            overlay="configs/overlays/nixl-reservation.yaml",
        ),
    )
}


def declared(variant: Mapping[str, Any]) -> list[Intervention]:
    """A checked variant's interventions, in the order it names them."""
    return [REGISTRY[name] for name in variant.get("interventions") or []]


def disclosures(variant: Mapping[str, Any]) -> list[str]:
    return [i.disclosure for i in declared(variant)]


def addressing(started_by: str | None) -> list[Intervention]:
    """The shipped interventions that address a busy thread started by `started_by`."""
    return [i for i in REGISTRY.values() if i.thread and started_by and i.thread in started_by]


def check_interventions(config: Mapping[str, Any], on_cpu: bool) -> None:
    """One line naming the key: an unknown name, one on another backend than vllm, one whose
    connector the variant lacks; and a Mooncake connector on CPU without the guard it needs."""
    for i, variant in enumerate(config["variants"]):
        kinds = connector_types(variant.get("connector"))
        for j, name in enumerate(variant.get("interventions") or []):
            where = f"variants[{i}].interventions[{j}]"
            if name not in REGISTRY:
                raise ConfigError(where, f"unknown intervention {name!r} (known: {', '.join(REGISTRY)})")
            if config["backend"] != "vllm":
                raise ConfigError(where, f"{name} acts inside vLLM's processes: backend vllm only")
            if REGISTRY[name].connector not in kinds:
                raise ConfigError(
                    where, f"{name} acts on a {REGISTRY[name].connector} connector; {variant['name']} has none"
                )
        if config["backend"] == "vllm" and on_cpu:
            needed = [r for r in REGISTRY.values() if r.cpu_only and r.connector in kinds]
            missing = [r.name for r in needed if r.name not in (variant.get("interventions") or [])]
            if missing:
                raise ConfigError(
                    f"variants[{i}].interventions",
                    f"{variant['name']} has a {needed[0].connector} connector on a CPU host: declare "
                    f"{', '.join(missing)} ({needed[0].removes} raises otherwise)",
                )
