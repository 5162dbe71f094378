"""What the step-timing instrumentation touches in vLLM, and the checks made before it wraps.

Imports nothing from connector_tax or vLLM. tests/unit/test_vllm_static.py checks TARGETS against
vLLM 0.33.0's source; at run time each target's parameters are compared with the table (with
inspect) before anything is wrapped, so a changed signature is reported, never wrapped blind.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# The package defines the same name once (connector_tax.contract.records); this folder may not
# import the package, so a test checks the two are equal.
STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"
SCHEMA_VERSION = 2

ENGINE_MODULE = "vllm.v1.engine.core"
FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"
BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1."

# Keys of the study's engine-step record, in order (docs/study-design.md). An engine
# record adds engine_step_us, pid, role, source; a worker record adds WORKER_FIELDS.
RECORD_FIELDS = (
    "t_ns",
    "step_id",
    "step_duration_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "num_running",
    "num_waiting",
    "prefill_tokens",
    "decode_tokens",
)
ENGINE_FIELDS = RECORD_FIELDS + ("engine_step_us", "pid", "role", "source")
WORKER_FIELDS = RECORD_FIELDS + (
    "worker_step_us",
    "wait_for_layer_load_us",
    "wait_for_layer_load_calls",
    "save_kv_layer_us",
    "save_kv_layer_calls",
    "wait_for_save_us",
    "pid",
    "role",
    "source",
)

# vLLM 0.33 (and 0.32, whose signatures are the same) with the parameters the wrappers rely on.
# "*" entries only need to exist.
TARGETS: dict[str, tuple[str, ...]] = {
    "vllm.v1.engine.core:EngineCore.__init__": ("*",),
    "vllm.v1.engine.core:EngineCore.step": ("self",),
    "vllm.v1.engine.core:EngineCore.step_with_batch_queue": ("self",),
    "vllm.v1.core.sched.scheduler:Scheduler.schedule": ("self", "throttle_prefills"),
    "vllm.v1.core.sched.scheduler:Scheduler.get_request_counts": ("self",),
    FACTORY_MODULE + ":KVConnectorFactory.create_connector": (
        "cls",
        "config",
        "role",
        "kv_cache_config",
    ),
    BASE + "build_connector_meta": ("self", "scheduler_output"),
    BASE + "bind_connector_metadata": ("self", "connector_metadata"),
    BASE + "start_load_kv": ("self", "forward_context", "**kwargs"),
    BASE + "wait_for_layer_load": ("self", "layer_name"),
    BASE + "save_kv_layer": ("self", "layer_name", "kv_layer", "attn_metadata", "**kwargs"),
    BASE + "wait_for_save": ("self",),
    BASE + "get_finished": ("self", "finished_req_ids"),
    BASE + "get_transfer_results": ("self", "finished_req_ids"),
    BASE + "clear_connector_metadata": ("self",),
}

# Instance-level wraps (names in the targets file). The engine process needs the first two; a
# run with a connector also needs the scheduler connector's build_connector_meta and, in some
# process, every worker-connector hook below.
ENGINE_INSTANCES = ("engine.step_fn", "scheduler.schedule")
SCHEDULER_CONNECTOR_INSTANCES = ("connector.scheduler.build_connector_meta",)
WORKER_HOOKS = (
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
    "get_transfer_results",
    "clear_connector_metadata",
)
WORKER_CONNECTOR_INSTANCES = tuple(f"connector.worker.{hook}" for hook in WORKER_HOOKS)

WRAPPED_FLAG = "__connector_tax_wrapped__"


def params(func: Any) -> tuple[str, ...] | None:
    """Parameter names as the TARGETS table spells them (`*args`, `**kwargs`)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            names.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            names.append("**" + p.name)
        else:
            names.append(p.name)
    return tuple(names)


def expect(name: str, func: Any) -> str | None:
    """None if `func` has the parameters TARGETS expects for `name`, else why not."""
    expected = TARGETS.get(name)
    if expected is None or expected == ("*",):
        return None
    if inspect.ismethod(func):
        func = func.__func__
    got = params(func)
    if got is None:
        return "signature unreadable"
    if expected[0] in ("self", "cls") and got[:1] != expected[:1]:
        # bound (a classmethod's cls, or an instance attribute that wraps a bound method with
        # functools.wraps, whose signature inspect reads through __wrapped__): no self/cls
        expected = expected[1:]
    if got != expected:
        return f"signature changed: expected ({', '.join(expected)}), found ({', '.join(got)})"
    return None


def mark(wrapper: Callable, original: Callable) -> Callable:
    """Make `wrapper` look like `original` (name, doc, signature via __wrapped__) and flag it."""
    setattr(wrapper, WRAPPED_FLAG, True)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    return wrapper


def is_wrapped(func: Any) -> bool:
    return bool(getattr(func, WRAPPED_FLAG, False))
