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
from dataclasses import dataclass, field
from typing import Any

from connector_tax.config.errors import ConfigError
from connector_tax.config.vllm_rules import connector_types

INTERVENTIONS_ENV = "CONNECTOR_TAX_INTERVENTIONS"  # = patches.interventions.INTERVENTIONS_ENV
# Where the interventions write what they did (patches.interventions.EVIDENCE_ENV): a folder the
# launch names for a declaring variant, among the launch's records (contract.layout).
EVIDENCE_ENV = "CONNECTOR_TAX_EVIDENCE"
# connector-tax's own variables (the instrumentation's, the simulator's, the tools'): the launch sets
# those a server reads from the study's settings, so no `env` of the config may set one.
OWN_PREFIX = "CONNECTOR_TAX_"


@dataclass(frozen=True)
class Intervention:
    name: str
    connector: str  # the connector type it acts on (the variant must have one, or a child)
    disclosure: str  # what it changes in vLLM's behaviour, as every output says it
    removes: str  # the suspected cause it removes, in words
    thread: str | None = None  # a busy-at-idle thread it addresses: text in the thread's `started_by`
    overlay: str | None = None  # the overlay that measures the variant beside it
    cpu_only: bool = False  # acts only without an accelerator (the guard): required there, refused elsewhere
    # {another intervention: why the two cannot be declared together} (either side may say it)
    conflicts: Mapping[str, str] = field(default_factory=dict)


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
            conflicts={"nixl_progress_off": "the delay is the progress thread's, which nixl_progress_off removes"},
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


def conflict(a: str, b: str) -> str | None:
    """Why interventions `a` and `b` cannot be declared together, or None."""
    return REGISTRY[a].conflicts.get(b) or REGISTRY[b].conflicts.get(a)


def _env_maps(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Every `env` of the config that reaches a launched process, with its key."""
    vllm = config.get("vllm") or {}
    out = [("vllm.env", vllm.get("env") or {})]
    out += [(f"vllm.{k}.env", (vllm.get(k) or {}).get("env") or {}) for k in ("lmcache", "lmcache_mp")]
    out += [(f"variants[{i}].env", v.get("env") or {}) for i, v in enumerate(config["variants"])]
    return out


def check_own_variables(config: Mapping[str, Any]) -> None:
    """One line naming the key: an `env` that sets a variable of connector-tax's own (an
    intervention would then reach a variant that never declared it, undisclosed)."""
    for where, env in _env_maps(config):
        for key in env:
            if key.startswith(OWN_PREFIX):
                hint = " (declare an intervention in the variant's `interventions`)" if key == INTERVENTIONS_ENV else ""
                raise ConfigError(
                    f"{where}.{key}", f"is connector-tax's own ({OWN_PREFIX}*): the launch sets it from the study{hint}"
                )


def check_interventions(config: Mapping[str, Any], on_cpu: bool) -> None:
    """One line naming the key: an unknown name, one on another backend than vllm, one whose
    connector the variant lacks, two that conflict, a CPU-only one on an accelerator; a Mooncake
    connector on CPU without the guard it needs; and connector-tax's own variables in any `env`."""
    check_own_variables(config)
    for i, variant in enumerate(config["variants"]):
        kinds = connector_types(variant.get("connector"))
        names = list(variant.get("interventions") or [])
        for j, name in enumerate(names):
            where = f"variants[{i}].interventions[{j}]"
            if name not in REGISTRY:
                raise ConfigError(where, f"unknown intervention {name!r} (known: {', '.join(REGISTRY)})")
            if config["backend"] != "vllm":
                raise ConfigError(where, f"{name} acts inside vLLM's processes: backend vllm only")
            if REGISTRY[name].connector not in kinds:
                raise ConfigError(
                    where, f"{name} acts on a {REGISTRY[name].connector} connector; {variant['name']} has none"
                )
            if REGISTRY[name].cpu_only and not on_cpu:
                raise ConfigError(
                    where,
                    f"{name} acts only on a host without an accelerator (vllm.device: cpu); it would never act here",
                )
            for other in names[:j]:
                if other in REGISTRY and (why := conflict(other, name)):
                    raise ConfigError(where, f"{name} conflicts with {other}: {why}")
        if config["backend"] == "vllm" and on_cpu:
            needed = [r for r in REGISTRY.values() if r.cpu_only and r.connector in kinds]
            missing = [r.name for r in needed if r.name not in names]
            if missing:
                raise ConfigError(
                    f"variants[{i}].interventions",
                    f"{variant['name']} has a {needed[0].connector} connector on a CPU host: declare "
                    f"{', '.join(missing)} ({needed[0].removes} raises otherwise)",
                )
