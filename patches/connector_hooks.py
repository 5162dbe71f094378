"""Connector wrappers: every connector instance KVConnectorFactory.create_connector makes is
wrapped per instance (an instance attribute shadows the class's method, so the concrete
connector's own override is what gets timed, whichever model runner calls it).

Scheduler role: build_connector_meta (engine_hooks.wrap_build_meta). Worker role: a worker
step opens at bind_connector_metadata and closes at clear_connector_metadata, which both model
runners call once per step (V1: KVConnectorModelRunnerMixin._get_kv_connector_output and
finalize_kv_connector; V2, 0.33's default on GPUs: ActiveKVConnector.pre_forward / post_forward
/ finalize_step); between them start_load_kv, wait_for_layer_load and save_kv_layer (called per
attention layer by maybe_transfer_kv_layer), wait_for_save, and get_finished (reached through
get_transfer_results; a connector may override either, the outer call is the one timed) are
summed. Imports nothing from connector_tax or vLLM.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from patches.engine_hooks import wrap_build_meta, wrap_timed
from patches.recorder import StepRecorder
from patches.targets import BASE, FACTORY_MODULE, WORKER_HOOKS, expect, is_wrapped, mark


def _wrap_bind(fn: Callable, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def bind_connector_metadata_timed(*args: Any, **kwargs: Any) -> Any:
        rec.begin_worker_step(mono())
        return fn(*args, **kwargs)

    return mark(bind_connector_metadata_timed, fn)


def _wrap_clear(fn: Callable, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def clear_connector_metadata_timed(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            rec.end_worker_step(mono())

    return mark(clear_connector_metadata_timed, fn)


def _wrap_get_finished(fn: Callable, rec: StepRecorder) -> Callable:
    """get_transfer_results and get_finished both: the outermost call of the two is timed."""
    mono = time.monotonic_ns

    def get_finished_timed(*args: Any, **kwargs: Any) -> Any:
        if rec.in_get_finished:
            return fn(*args, **kwargs)
        rec.in_get_finished = True
        t0 = mono()
        try:
            return fn(*args, **kwargs)
        finally:
            d = mono() - t0
            rec.in_get_finished = False
            rec.get_finished.ns += d
            if rec.engine_process:
                rec.engine_get_finished.ns += d

    return mark(get_finished_timed, fn)


_WORKER_PLAN: dict[str, Callable[[Callable, StepRecorder], Callable]] = {
    "bind_connector_metadata": _wrap_bind,
    "start_load_kv": lambda fn, rec: wrap_timed(fn, rec, rec.start_load_kv, rec.engine_start_load_kv),
    # per attention layer: summed, and counted (*_calls in the worker record)
    "wait_for_layer_load": lambda fn, rec: wrap_timed(fn, rec, rec.wait_for_layer_load),
    "save_kv_layer": lambda fn, rec: wrap_timed(fn, rec, rec.save_kv_layer),
    "wait_for_save": lambda fn, rec: wrap_timed(fn, rec, rec.wait_for_save),
    "get_finished": _wrap_get_finished,
    "get_transfer_results": _wrap_get_finished,
    "clear_connector_metadata": _wrap_clear,
}
assert tuple(_WORKER_PLAN) == WORKER_HOOKS


def wrap_connector(connector: Any, role: str, rec: StepRecorder) -> Any:
    """Wrap one connector instance's hooks for its role ("scheduler" or "worker")."""
    if role == "scheduler":
        plan: dict[str, Callable[[Callable, StepRecorder], Callable]] = {"build_connector_meta": wrap_build_meta}
        rec.has_scheduler_connector = True
    elif role == "worker":
        plan = _WORKER_PLAN
        rec.has_worker_connector = True
        if not rec.engine_process:
            rec.set_role("worker")
    else:
        rec.note_error(f"connector of unknown role {role!r} not wrapped")
        return connector
    for method, wrapper in plan.items():
        key = f"connector.{role}.{method}"
        fn = getattr(connector, method, None)
        if fn is None:
            rec.note_instance(key, f"absent: {type(connector).__name__} has no {method}")
            continue
        if is_wrapped(fn):
            continue
        problem = expect(BASE + method, fn)
        if problem:
            rec.note_instance(key, f"absent: {problem}")
            continue
        try:
            setattr(connector, method, wrapper(fn, rec))
        except (AttributeError, TypeError) as exc:
            rec.note_instance(key, f"absent: cannot set attribute: {exc}")
            continue
        rec.note_instance(key, f"wrapped ({type(connector).__name__})")
    return connector


def _thread_ids() -> set[str]:
    """This process's thread ids (Linux); empty where /proc is not there."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def _own_cpus() -> list[int] | None:
    """The CPUs the calling thread may run on (Linux keeps affinity per thread); None elsewhere."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def hook_factory_class(cls: type, rec: StepRecorder) -> bool:
    name = FACTORY_MODULE + ":KVConnectorFactory.create_connector"
    raw = cls.__dict__.get("create_connector")
    if not isinstance(raw, classmethod):
        rec.note_target(name, "absent: create_connector is not a classmethod")
        return False
    original = raw.__func__
    if is_wrapped(original):
        return True
    problem = expect(name, original)
    if problem:
        rec.note_target(name, f"absent: {problem}")
        return False

    def create_connector(klass: type, config: Any, role: Any, kv_cache_config: Any) -> Any:
        before, cpus_before = _thread_ids(), _own_cpus()
        connector = original(klass, config, role, kv_cache_config)
        try:
            role_name = str(getattr(role, "name", role)).lower()
            label = f"{type(connector).__name__} {role_name}"
            rec.note_threads(_thread_ids() - before, label)
            # vLLM's NIXL worker on CPU re-pins the thread that builds it (rsv_cores_for_kv): the
            # building thread's CPUs before and after say whether a constructor moved it.
            rec.note_built_on(threading.get_native_id(), label, cpus_before, _own_cpus())
            wrap_connector(connector, role_name, rec)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"connector wrap failed: {exc!r}")
        return connector

    cls.create_connector = classmethod(mark(create_connector, original))  # type: ignore[method-assign]
    rec.note_target(name, "wrapped")
    return True
