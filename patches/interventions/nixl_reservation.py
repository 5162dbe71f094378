"""vLLM's CPU core reservation for NIXL (`rsv_cores_for_kv`), moved off the worker's compute cores.

What vLLM does (0.32 and 0.33, `NixlConnectorWorker.__init__` in
vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py, on a CPU device): after it has
built its NIXL agent, it takes `current_platform.discover_numa_topology()` (each NUMA node's
physical cores, read from /sys: no setting of vLLM's changes it), keeps the highest core of each
node (`rsv_cores_for_kv`) and calls `os.sched_setaffinity(0, rsv_cores_for_kv)`. That moves the
thread that builds the connector, the worker's main thread, which runs the model (OpenMP's master
thread), and nothing else: the agent's threads, its UCX progress thread among them, were started
before the call and keep the CPUs the building thread had then (its OpenMP binding).

* `nixl_kv_core_off_compute`: `discover_numa_topology` leaves out the cores the worker's OpenMP
  threads are bound to (VLLM_CPU_OMP_THREADS_BIND), so vLLM reserves each node's highest core that
  is not one of them, and vLLM's own call moves the worker's main thread there (the study's 2-core
  host, compute on core 1: core 0). A node with no other core keeps vLLM's choice.
* `nixl_agent_off_compute`: the NIXL agent is built with the building thread on those same cores,
  and the thread is put back right after: the agent's threads run off the compute cores, the model
  where it was; vLLM's reservation is left as shipped.

With VLLM_CPU_OMP_THREADS_BIND `auto` or `nobind` the compute cores are vLLM's to choose: neither
acts, and each says so on stderr. Imports nothing from connector_tax; vLLM and NIXL only through
post-import hooks.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any

from patches.import_hook import PostImportFinder
from patches.interventions import evidence

KV_CORE = "nixl_kv_core_off_compute"
AGENT = "nixl_agent_off_compute"
DISCLOSURES = {
    KV_CORE: "vLLM's NIXL worker reserves each NUMA node's highest core outside VLLM_CPU_OMP_THREADS_BIND "
    "(rsv_cores_for_kv), not the node's highest core: the thread that builds it is moved there",
    AGENT: "NIXL's agent is built with its building thread on the cores vLLM would reserve outside "
    "VLLM_CPU_OMP_THREADS_BIND, then the thread is put back: the agent's threads run off the compute cores",
}
PLATFORM_MODULE = "vllm.platforms.cpu"
NIXL_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")  # = nixl_progress.NIXL_MODULES
WAITS_FOR = (PLATFORM_MODULE, *NIXL_MODULES)  # the first for KV_CORE, the others for AGENT
CHANGES = {  # what each wraps, for its evidence
    KV_CORE: "{module}.CpuPlatform.discover_numa_topology: the OpenMP cores left out (vLLM reserves a core for NIXL off them)",
    AGENT: "{module}.nixl_agent.__init__: the agent built with its thread off the OpenMP cores, the thread put back",
}
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"

_FINDERS: dict[str, PostImportFinder] = {}


def compute_cores(environ: Any = None) -> set[int] | None:
    """The cores of VLLM_CPU_OMP_THREADS_BIND ("1", "0-3|4-7": every rank's); None for auto, nobind,
    unset or anything that is not a CPU list."""
    text = (os.environ if environ is None else environ).get(OMP_BIND_ENV, "auto")
    out: set[int] = set()
    for part in text.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        out.update(range(int(lo), int(hi or lo) + 1))
    return out or None


def off_compute(nodes: list[list[int]], compute: set[int]) -> list[list[int]]:
    """Each node's cores less the compute cores; a node left with none keeps its own."""
    return [[c for c in node if c not in compute] or list(node) for node in nodes]


def reserve_off_compute(cls: type, on_fire: Any = lambda detail: None) -> bool:
    """Wrap `cls.discover_numa_topology` (a classmethod) so that it leaves out the compute cores.
    Idempotent; returns whether it wrapped."""
    raw = cls.__dict__.get("discover_numa_topology")
    original = getattr(raw, "__func__", None)
    if original is None or getattr(original, "__connector_tax_intervention__", None) == KV_CORE:
        return False

    @functools.wraps(original)
    def discover_numa_topology(klass: type) -> list[list[int]]:
        nodes = original(klass)
        compute = compute_cores()
        if compute is None:
            evidence(KV_CORE).failed(f"{OMP_BIND_ENV} names no cores; not applied")
            return nodes
        moved = off_compute(nodes, compute)
        on_fire({"nodes": nodes, "compute": sorted(compute), "reserved": [max(n) for n in moved if n]})
        return moved

    discover_numa_topology.__connector_tax_intervention__ = KV_CORE  # type: ignore[attr-defined]
    cls.discover_numa_topology = classmethod(discover_numa_topology)  # type: ignore[attr-defined]
    return True


def _reserved_cores() -> list[int] | None:
    """The cores nixl_kv_core_off_compute would reserve, from vLLM's own topology (None: no vLLM
    platform loaded, or no compute cores named)."""
    compute = compute_cores()
    platforms = sys.modules.get("vllm.platforms")
    platform = getattr(platforms, "current_platform", None) if platforms else None
    if compute is None or platform is None or not hasattr(platform, "discover_numa_topology"):
        return None
    cores = [max(n) for n in off_compute(platform.discover_numa_topology(), compute) if n]
    return cores or None


def agent_off_compute(api: Any, cores: Any = _reserved_cores, on_fire: Any = lambda detail: None) -> bool:
    """Wrap api.nixl_agent.__init__ so that the agent is built with the calling thread on `cores()`
    and the thread is put back after. Idempotent; returns whether it wrapped."""
    cls = api.nixl_agent
    original = cls.__init__
    if getattr(original, "__connector_tax_intervention__", None) == AGENT:
        return False

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        target = cores()
        if not target:
            evidence(AGENT).failed(f"no cores outside {OMP_BIND_ENV}; not applied")
            original(self, *args, **kwargs)
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, target)
        try:
            original(self, *args, **kwargs)
        finally:
            os.sched_setaffinity(0, before)
        on_fire({"agent_cores": sorted(target), "thread": threading.get_native_id(), "thread_cores": sorted(before)})

    __init__.__connector_tax_intervention__ = AGENT  # type: ignore[attr-defined]
    cls.__init__ = __init__
    return True


def _hook(name: str) -> Any:
    def hook(module: Any) -> None:
        """Never raises into the import of vLLM or NIXL: an intervention that cannot apply says so in its evidence."""
        try:
            fire = functools.partial(_fire, name, module.__name__)
            if name == KV_CORE:
                reserve_off_compute(module.CpuPlatform, fire)
            else:
                agent_off_compute(module, _reserved_cores, fire)
            evidence(name).changed(CHANGES[name].format(module=module.__name__))
        except Exception as exc:  # noqa: BLE001
            evidence(name).failed(f"not applied to {module.__name__}: {exc!r}")

    return hook


def _fire(name: str, module: str, detail: dict[str, Any]) -> None:
    """Looked up at each call: a forked child keeps evidence of its own."""
    where = ", ".join(f"{k} {v}" for k, v in detail.items())
    evidence(name).changed(f"in {module}: {where}")
    evidence(name).fired(DISCLOSURES[name])


def install(name: str) -> bool:
    """Hook vLLM's CPU platform (KV_CORE) or NIXL's API module(s) (AGENT). Idempotent."""
    if name not in DISCLOSURES:
        raise ValueError(f"not a NIXL reservation intervention: {name!r}")
    if name in _FINDERS:
        return True
    hook = _hook(name)
    modules = (PLATFORM_MODULE,) if name == KV_CORE else NIXL_MODULES
    for module in modules:
        if module in sys.modules:
            hook(sys.modules[module])
    _FINDERS[name] = PostImportFinder(dict.fromkeys(modules, hook))
    sys.meta_path.insert(0, _FINDERS[name])
    return True


def uninstall() -> None:
    """Remove the import hooks (tests). What is already wrapped stays wrapped."""
    for finder in _FINDERS.values():
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    _FINDERS.clear()
