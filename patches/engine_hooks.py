"""Engine-process wrappers: EngineCore.step_fn (the whole engine step), Scheduler.schedule()
(the study's step_duration_us, with the prefill/decode split and the request counts) and the
scheduler connector's build_connector_meta (build_meta_us, which runs inside schedule()).

Imports nothing from connector_tax or vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from patches.recorder import HookTime, StepRecorder
from patches.targets import expect, is_wrapped, mark


def request_counts(scheduler: Any) -> tuple[int, int]:
    """(running, waiting) as vLLM's /metrics defines them: vllm:num_requests_waiting is
    SchedulerStats.num_waiting_reqs + num_skipped_waiting_reqs, i.e. get_request_counts()'s
    waiting = the waiting queue plus the requests that hold KV while they wait
    (kv_holding_waiting), deferred ones included (vLLM 0.32 and 0.33)."""
    counts = getattr(scheduler, "get_request_counts", None)
    if counts is not None:
        running, waiting = counts()
        return int(running), int(waiting)
    holding = getattr(scheduler, "kv_holding_waiting", ())
    return len(scheduler.running), len(scheduler.waiting) + len(holding)


def wrap_step_fn(step_fn: Callable, rec: StepRecorder, scheduler: Any = None) -> Callable:
    mono = time.monotonic_ns

    def step_fn_timed(*args: Any, **kwargs: Any) -> Any:
        rec.begin_engine_step()
        t0 = mono()
        try:
            return step_fn(*args, **kwargs)
        finally:
            t1 = mono()
            if not rec.scheduled and scheduler is not None:
                try:
                    rec.num_running, rec.num_waiting = request_counts(scheduler)
                except Exception:  # noqa: BLE001 - never into vLLM
                    pass
            rec.end_engine_step(t0, t1)

    return mark(step_fn_timed, step_fn)


def wrap_schedule(schedule: Callable, scheduler: Any, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def schedule_timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        out = schedule(*args, **kwargs)
        rec.schedule.ns += mono() - t0
        rec.scheduled = True
        try:
            # After schedule(), num_computed_tokens already includes this step's tokens, so a
            # request's prompt tokens in this step are those below num_prompt_tokens.
            # (A preempted request's recomputed output tokens count as decode.)
            requests = scheduler.requests
            prefill = 0
            for req_id, n in out.num_scheduled_tokens.items():
                req = requests.get(req_id)
                if req is None:
                    continue
                left = req.num_prompt_tokens - (req.num_computed_tokens - n)
                if left > 0:
                    prefill += left if left < n else n
            rec.prefill_tokens += prefill
            rec.decode_tokens += out.total_num_scheduled_tokens - prefill
        except Exception as exc:  # noqa: BLE001
            if rec.tokens_known:
                rec.note_error(f"token split failed: {exc!r}")
            rec.tokens_known = False
        try:
            rec.num_running, rec.num_waiting = request_counts(scheduler)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"request counts failed: {exc!r}")
        return out

    return mark(schedule_timed, schedule)


def wrap_timed(fn: Callable, rec: StepRecorder, timer: HookTime, engine_timer: HookTime | None = None) -> Callable:
    """Add each call's duration (and count) to `timer` and, in the engine process, to
    `engine_timer` (a worker hook run by the single-process executor inside an engine step)."""
    mono = time.monotonic_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        try:
            return fn(*args, **kwargs)
        finally:
            d = mono() - t0
            timer.ns += d
            timer.calls += 1
            if engine_timer is not None and rec.engine_process:
                engine_timer.ns += d

    return mark(timed, fn)


def wrap_build_meta(fn: Callable, rec: StepRecorder) -> Callable:
    """build_connector_meta runs inside schedule(): part of step_duration_us, also on its own."""
    return wrap_timed(fn, rec, rec.build_meta)


def hook_engine_instance(engine: Any, rec: StepRecorder, wrap_connector: Callable | None = None) -> None:
    """After EngineCore.__init__: time its step_fn and its scheduler's schedule()."""
    rec.engine_process = True
    rec.set_role("engine")
    scheduler = getattr(engine, "scheduler", None)
    step_fn = getattr(engine, "step_fn", None)
    if step_fn is None:
        rec.note_instance("engine.step_fn", "absent: EngineCore has no step_fn")
    elif not is_wrapped(step_fn):
        target = getattr(step_fn, "__name__", "?")
        engine.step_fn = wrap_step_fn(step_fn, rec, scheduler)
        rec.note_instance("engine.step_fn", f"wrapped ({type(engine).__name__}.{target})")
    if scheduler is None:
        rec.note_instance("scheduler.schedule", "absent: EngineCore has no scheduler")
        return
    schedule = getattr(scheduler, "schedule", None)
    if schedule is None:
        rec.note_instance("scheduler.schedule", "absent: scheduler has no schedule()")
    elif not is_wrapped(schedule):
        scheduler.schedule = wrap_schedule(schedule, scheduler, rec)
        rec.note_instance("scheduler.schedule", f"wrapped ({type(scheduler).__name__})")
    connector = getattr(scheduler, "connector", None)
    if connector is not None and not rec.has_scheduler_connector and wrap_connector is not None:
        # Made before the factory was hooked (should not happen); wrap it here.
        wrap_connector(connector, "scheduler", rec)


def hook_engine_core_class(cls: type, rec: StepRecorder, wrap_connector: Callable | None = None) -> bool:
    name = "vllm.v1.engine.core:EngineCore.__init__"
    init = cls.__dict__.get("__init__")
    if init is None:
        rec.note_target(name, "absent: EngineCore defines no __init__")
        return False
    if is_wrapped(init):
        return True
    for method in ("step", "step_with_batch_queue"):
        key = f"vllm.v1.engine.core:EngineCore.{method}"
        problem = expect(key, getattr(cls, method)) if hasattr(cls, method) else "absent"
        rec.note_target(key, f"absent: {problem}" if problem else "present")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        rec.engine_process = True
        init(self, *args, **kwargs)
        try:
            hook_engine_instance(self, rec, wrap_connector)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"engine hook failed: {exc!r}")

    cls.__init__ = mark(__init__, init)  # type: ignore[method-assign]
    rec.note_target(name, "wrapped")
    return True
