"""Step-timing instrumentation that runs inside vLLM processes (API server, engine core, workers).

Loaded by patches/site/sitecustomize.py when $CONNECTOR_TAX_STEP_LOG is set; leaves the
installed vLLM untouched. It installs a post-import hook: when vLLM imports
`vllm.v1.engine.core` or the KV connector factory, their classes are wrapped (never their
source files), and from then on

* every engine step (EngineCore.step_fn: `step` or `step_with_batch_queue`, i.e. schedule,
  execute, update_from_output) writes one JSONL record in the schema of shared/DESIGN.md,
* the scheduler instance's `schedule()` is timed (`schedule_us`) and its SchedulerOutput gives
  `prefill_tokens` / `decode_tokens`; `num_running` / `num_waiting` are the scheduler's
  request counts right after scheduling (the same counts /metrics reports),
* every connector instance made by KVConnectorFactory.create_connector is wrapped per instance,
  so a subclass's overrides are timed: `build_connector_meta` (scheduler role), and on the
  worker role `start_load_kv` and `get_transfer_results` (vLLM 0.33 reaches get_finished
  through it; reported as `get_finished_us`).

Hook durations are summed over the step in which they ran. With the single-process executor
(TP=1: the worker runs in the engine-core process, in the step's thread) one engine record
carries every field. A worker-only process (TP>1) writes its own records, one per
get_transfer_results call, with the scheduler fields null.

Files, for CONNECTOR_TAX_STEP_LOG=<base>.jsonl (one set per process, never shared):
  <base>.engine.<pid>.jsonl    engine-step records
  <base>.worker.<pid>.jsonl    worker-only records (TP>1)
  <base>.targets.<pid>.json    which targets this process wrapped (availability)

Nothing here imports connector_tax or (at import time) vLLM. Every failure is recorded in the
targets file and never raised into vLLM: a target that cannot be wrapped stays unwrapped and
the manifest reports step_timing_available=false.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import json
import os
import sys
import time
from typing import Any, Callable

STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"
SCHEMA_VERSION = 1

# Keys of the design's record, in order; the instrumentation adds schedule_us, pid, role, source.
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

ENGINE_MODULE = "vllm.v1.engine.core"
FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"

# What the instrumentation touches in vLLM 0.33, with the parameters it relies on. The tests
# check each against vLLM's source (ast); at run time the same names are checked with inspect
# before anything is wrapped. "*" entries only need to exist.
TARGETS: dict[str, tuple[str, ...]] = {
    "vllm.v1.engine.core:EngineCore.__init__": ("*",),
    "vllm.v1.engine.core:EngineCore.step": ("self",),
    "vllm.v1.engine.core:EngineCore.step_with_batch_queue": ("self",),
    "vllm.v1.core.sched.scheduler:Scheduler.schedule": ("self", "throttle_prefills"),
    "vllm.v1.core.sched.scheduler:Scheduler.get_request_counts": ("self",),
    "vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory.create_connector": (
        "cls",
        "config",
        "role",
        "kv_cache_config",
    ),
    "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1.build_connector_meta": (
        "self",
        "scheduler_output",
    ),
    "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1.start_load_kv": (
        "self",
        "forward_context",
        "**kwargs",
    ),
    "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1.get_transfer_results": (
        "self",
        "finished_req_ids",
    ),
}

# Instance-level wraps (names in the targets file). The engine process needs the first two;
# a run with a connector also needs the scheduler connector's build_connector_meta and, in
# some process, the worker connector's start_load_kv and get_transfer_results.
ENGINE_INSTANCES = ("engine.step_fn", "scheduler.schedule")
SCHEDULER_CONNECTOR_INSTANCES = ("connector.scheduler.build_connector_meta",)
WORKER_CONNECTOR_INSTANCES = (
    "connector.worker.start_load_kv",
    "connector.worker.get_transfer_results",
)

_WRAPPED_FLAG = "__connector_tax_wrapped__"


def _log_base(path: str) -> str:
    return path[: -len(".jsonl")] if path.endswith(".jsonl") else path


def records_path(step_log: str, role: str, pid: int) -> str:
    return f"{_log_base(step_log)}.{role}.{pid}.jsonl"


def targets_path(step_log: str, pid: int) -> str:
    return f"{_log_base(step_log)}.targets.{pid}.json"


def _params(func: Any) -> tuple[str, ...] | None:
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


def _num(value: float | int | None) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(round(value, 3))
    return str(value)


class StepRecorder:
    """Per-process state: the step accumulators, the record file, the availability report."""

    def __init__(self, step_log: str) -> None:
        self.step_log = os.path.abspath(step_log)
        self._reset_process()

    # -- process identity ------------------------------------------------------------
    def _reset_process(self) -> None:
        self.pid = os.getpid()
        self.role: str | None = None
        # True from the moment an EngineCore starts initialising in this process: its
        # worker-side connector hooks then belong to the engine's steps (single-process
        # executor), never to worker records.
        self.engine_process = False
        self.fds: dict[str, int] = {}
        self.step_id = 0
        self.worker_t0: int | None = None
        self.targets: dict[str, str] = {}
        self.instances: dict[str, str] = {}
        self.errors: list[str] = []
        self.has_scheduler_connector = False
        self.has_worker_connector = False
        self.disabled = False
        self._begin()

    def after_fork(self) -> None:
        """A forked child keeps the parent's wraps (its objects are copies that still call
        this recorder) but writes its own files under its own pid."""
        fds = list(self.fds.values())
        targets, instances = dict(self.targets), dict(self.instances)
        has_sched, has_worker = self.has_scheduler_connector, self.has_worker_connector
        self._reset_process()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.targets, self.instances = targets, instances
        self.has_scheduler_connector, self.has_worker_connector = has_sched, has_worker

    # -- per-step accumulators -------------------------------------------------------
    def _begin(self) -> None:
        self.schedule_us = 0.0
        self.build_meta_us = 0.0
        self.get_finished_us = 0.0
        self.start_load_kv_us = 0.0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.num_running: int | None = None
        self.num_waiting: int | None = None
        self.scheduled = False
        self.tokens_known = True

    # -- availability ----------------------------------------------------------------
    def note_target(self, name: str, status: str) -> None:
        self.targets[name] = status
        self.write_targets()

    def note_instance(self, name: str, status: str) -> None:
        self.instances[name] = status
        self.write_targets()

    def note_error(self, message: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(message)
        self.write_targets()

    def set_role(self, role: str) -> None:
        # engine wins over worker: the single-process executor runs both in one process.
        if self.role == "engine" or self.role == role:
            return
        self.role = role
        self.write_targets()

    def write_targets(self) -> None:
        vllm = sys.modules.get("vllm")
        report = {
            "schema": SCHEMA_VERSION,
            "pid": self.pid,
            "role": self.role or "other",
            "step_log": self.step_log,
            "records": records_path(self.step_log, self.role, self.pid) if self.role else None,
            "vllm_version": getattr(vllm, "__version__", None),
            "python": sys.version.split()[0],
            "targets": self.targets,
            "instances": self.instances,
            "errors": self.errors,
        }
        path = targets_path(self.step_log, self.pid)
        tmp = f"{path}.tmp"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as exc:  # never break vLLM over a report
            sys.stderr.write(f"connector-tax step timing: cannot write {path}: {exc}\n")

    # -- records ---------------------------------------------------------------------
    def _write(self, role: str, line: str) -> None:
        if self.disabled:
            return
        try:
            fd = self.fds.get(role)
            if fd is None:
                path = records_path(self.step_log, role, self.pid)
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                fd = self.fds[role] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, line.encode())
        except OSError as exc:
            self.disabled = True
            self.note_error(f"step log write failed, records stop here: {exc}")

    def end_engine_step(self, t0: int, t1: int) -> None:
        self.step_id += 1
        if not self.scheduled:
            self.tokens_known = True  # nothing scheduled: zero tokens, counts read below
        line = (
            f'{{"t_ns":{t0},"step_id":{self.step_id},'
            f'"step_duration_us":{_num((t1 - t0) / 1000.0)},'
            f'"build_meta_us":{_num(self.build_meta_us if self.has_scheduler_connector else None)},'
            f'"get_finished_us":{_num(self.get_finished_us if self.has_worker_connector else None)},'
            f'"start_load_kv_us":{_num(self.start_load_kv_us if self.has_worker_connector else None)},'
            f'"num_running":{_num(self.num_running)},"num_waiting":{_num(self.num_waiting)},'
            f'"prefill_tokens":{_num(self.prefill_tokens if self.tokens_known else None)},'
            f'"decode_tokens":{_num(self.decode_tokens if self.tokens_known else None)},'
            f'"schedule_us":{_num(self.schedule_us if self.scheduled else None)},'
            f'"pid":{self.pid},"role":"engine","source":"vllm"}}\n'
        )
        self._write("engine", line)

    def end_worker_step(self, t0: int) -> None:
        """A worker-only process (no EngineCore here): one record per connector step."""
        self.step_id += 1
        line = (
            f'{{"t_ns":{t0},"step_id":{self.step_id},"step_duration_us":null,'
            f'"build_meta_us":null,"get_finished_us":{_num(self.get_finished_us)},'
            f'"start_load_kv_us":{_num(self.start_load_kv_us)},'
            f'"num_running":null,"num_waiting":null,"prefill_tokens":null,"decode_tokens":null,'
            f'"schedule_us":null,"pid":{self.pid},"role":"worker","source":"vllm"}}\n'
        )
        self._write("worker", line)
        self.get_finished_us = 0.0
        self.start_load_kv_us = 0.0
        self.worker_t0 = None


# --------------------------------------------------------------------------- wrappers


def _mark(wrapper: Callable, original: Callable) -> Callable:
    setattr(wrapper, _WRAPPED_FLAG, True)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    return wrapper


def _is_wrapped(func: Any) -> bool:
    return bool(getattr(func, _WRAPPED_FLAG, False))


def wrap_step_fn(step_fn: Callable, rec: StepRecorder, scheduler: Any = None) -> Callable:
    mono = time.monotonic_ns

    def step_fn_timed(*args: Any, **kwargs: Any) -> Any:
        rec._begin()
        t0 = mono()
        try:
            return step_fn(*args, **kwargs)
        finally:
            t1 = mono()
            if not rec.scheduled and scheduler is not None:
                try:
                    rec.num_running, rec.num_waiting = _request_counts(scheduler)
                except Exception:  # noqa: BLE001 - never into vLLM
                    pass
            rec.end_engine_step(t0, t1)

    return _mark(step_fn_timed, step_fn)


def _request_counts(scheduler: Any) -> tuple[int, int]:
    counts = getattr(scheduler, "get_request_counts", None)
    if counts is not None:
        running, waiting = counts()
        return int(running), int(waiting)
    return len(scheduler.running), len(scheduler.waiting)


def wrap_schedule(schedule: Callable, scheduler: Any, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def schedule_timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        out = schedule(*args, **kwargs)
        rec.schedule_us += (mono() - t0) / 1000.0
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
            rec.num_running, rec.num_waiting = _request_counts(scheduler)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"request counts failed: {exc!r}")
        return out

    return _mark(schedule_timed, schedule)


def _wrap_build_meta(fn: Callable, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def build_connector_meta_timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.build_meta_us += (mono() - t0) / 1000.0

    return _mark(build_connector_meta_timed, fn)


def _wrap_start_load_kv(fn: Callable, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def start_load_kv_timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        if not rec.engine_process and rec.worker_t0 is None:
            rec.worker_t0 = t0
        try:
            return fn(*args, **kwargs)
        finally:
            rec.start_load_kv_us += (mono() - t0) / 1000.0

    return _mark(start_load_kv_timed, fn)


def _wrap_get_transfer_results(fn: Callable, rec: StepRecorder) -> Callable:
    mono = time.monotonic_ns

    def get_transfer_results_timed(*args: Any, **kwargs: Any) -> Any:
        t0 = mono()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.get_finished_us += (mono() - t0) / 1000.0
            if not rec.engine_process:
                rec.end_worker_step(rec.worker_t0 or t0)

    return _mark(get_transfer_results_timed, fn)


def _expect(name: str, func: Any) -> str | None:
    """None if `func` has the parameters TARGETS expects for `name`, else why not."""
    expected = TARGETS.get(name)
    if expected is None or expected == ("*",):
        return None
    got = _params(func)
    if got is None:
        return "signature unreadable"
    if name.endswith(".create_connector") and got and got[0] != "cls":
        got = ("cls", *got)  # a bound classmethod hides cls
    if got != expected:
        return f"signature changed: expected ({', '.join(expected)}), found ({', '.join(got)})"
    return None


def wrap_connector(connector: Any, role: str, rec: StepRecorder) -> Any:
    """Wrap one connector instance's hooks (instance attributes shadow the class's, so an
    override in any subclass is what gets timed)."""
    base = "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1."
    if role == "scheduler":
        plan = (("build_connector_meta", _wrap_build_meta),)
        rec.has_scheduler_connector = True
    elif role == "worker":
        plan = (
            ("start_load_kv", _wrap_start_load_kv),
            ("get_transfer_results", _wrap_get_transfer_results),
        )
        rec.has_worker_connector = True
        if not rec.engine_process:
            rec.set_role("worker")
    else:
        rec.note_error(f"connector of unknown role {role!r} not wrapped")
        return connector
    for method, wrapper in plan:
        key = f"connector.{role}.{method}"
        fn = getattr(connector, method, None)
        if fn is None:
            rec.note_instance(key, f"absent: {type(connector).__name__} has no {method}")
            continue
        if _is_wrapped(fn):
            continue
        problem = _expect(base + method, fn if not inspect.ismethod(fn) else fn.__func__)
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


def hook_engine_instance(engine: Any, rec: StepRecorder) -> None:
    """After EngineCore.__init__: time its step_fn and its scheduler's schedule()."""
    rec.engine_process = True
    rec.set_role("engine")
    scheduler = getattr(engine, "scheduler", None)
    step_fn = getattr(engine, "step_fn", None)
    if step_fn is None:
        rec.note_instance("engine.step_fn", "absent: EngineCore has no step_fn")
    elif not _is_wrapped(step_fn):
        target = getattr(step_fn, "__name__", "?")
        engine.step_fn = wrap_step_fn(step_fn, rec, scheduler)
        rec.note_instance("engine.step_fn", f"wrapped ({type(engine).__name__}.{target})")
    if scheduler is None:
        rec.note_instance("scheduler.schedule", "absent: EngineCore has no scheduler")
        return
    schedule = getattr(scheduler, "schedule", None)
    if schedule is None:
        rec.note_instance("scheduler.schedule", "absent: scheduler has no schedule()")
    elif not _is_wrapped(schedule):
        scheduler.schedule = wrap_schedule(schedule, scheduler, rec)
        rec.note_instance("scheduler.schedule", f"wrapped ({type(scheduler).__name__})")
    connector = getattr(scheduler, "connector", None)
    if connector is not None and not rec.has_scheduler_connector:
        # Made before the factory was hooked (should not happen); wrap it here.
        wrap_connector(connector, "scheduler", rec)


def hook_engine_core_class(cls: type, rec: StepRecorder) -> bool:
    name = "vllm.v1.engine.core:EngineCore.__init__"
    init = cls.__dict__.get("__init__")
    if init is None:
        rec.note_target(name, "absent: EngineCore defines no __init__")
        return False
    if _is_wrapped(init):
        return True
    for method in ("step", "step_with_batch_queue"):
        key = f"vllm.v1.engine.core:EngineCore.{method}"
        problem = _expect(key, getattr(cls, method, None)) if hasattr(cls, method) else "absent"
        rec.note_target(key, f"absent: {problem}" if problem else "present")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        rec.engine_process = True
        init(self, *args, **kwargs)
        try:
            hook_engine_instance(self, rec)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"engine hook failed: {exc!r}")

    cls.__init__ = _mark(__init__, init)  # type: ignore[method-assign]
    rec.note_target(name, "wrapped")
    return True


def hook_factory_class(cls: type, rec: StepRecorder) -> bool:
    name = (
        "vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory.create_connector"
    )
    raw = cls.__dict__.get("create_connector")
    if not isinstance(raw, classmethod):
        rec.note_target(name, "absent: create_connector is not a classmethod")
        return False
    original = raw.__func__
    if _is_wrapped(original):
        return True
    problem = _expect(name, original)
    if problem:
        rec.note_target(name, f"absent: {problem}")
        return False

    def create_connector(klass: type, config: Any, role: Any, kv_cache_config: Any) -> Any:
        connector = original(klass, config, role, kv_cache_config)
        try:
            role_name = str(getattr(role, "name", role)).lower()
            wrap_connector(connector, role_name, rec)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"connector wrap failed: {exc!r}")
        return connector

    cls.create_connector = classmethod(_mark(create_connector, original))  # type: ignore[method-assign]
    rec.note_target(name, "wrapped")
    return True


# --------------------------------------------------------------------------- post-import hook


class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[Any], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the hooked module names it asks the other finders and wraps
    the loader so that the hook runs right after the module's code."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PostImportLoader(spec.loader, hook)
        return spec


_RECORDER: StepRecorder | None = None
_FINDER: _PostImportFinder | None = None


def _guarded(name: str, fn: Callable[[Any], None], rec: StepRecorder) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        try:
            fn(module)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"hook for {name} failed: {exc!r}")

    return hook


def install(step_log: str | None = None) -> StepRecorder | None:
    """Install the hooks in this process; a no-op without a step log path. Idempotent."""
    global _RECORDER, _FINDER
    path = step_log or os.environ.get(STEP_LOG_ENV)
    if not path:
        return None
    if _RECORDER is not None:
        return _RECORDER
    rec = _RECORDER = StepRecorder(path)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=rec.after_fork)

    def engine_hook(module: Any) -> None:
        cls = getattr(module, "EngineCore", None)
        if cls is None:
            rec.note_target("vllm.v1.engine.core:EngineCore.__init__", "absent: no EngineCore")
        else:
            hook_engine_core_class(cls, rec)

    def factory_hook(module: Any) -> None:
        cls = getattr(module, "KVConnectorFactory", None)
        if cls is None:
            rec.note_target(
                "vllm.distributed.kv_transfer.kv_connector.factory:"
                "KVConnectorFactory.create_connector",
                "absent: no KVConnectorFactory",
            )
        else:
            hook_factory_class(cls, rec)

    hooks = {
        ENGINE_MODULE: _guarded(ENGINE_MODULE, engine_hook, rec),
        FACTORY_MODULE: _guarded(FACTORY_MODULE, factory_hook, rec),
    }
    # Modules imported before install (tests, or a late install) are hooked at once.
    for name, hook in list(hooks.items()):
        if name in sys.modules:
            hook(sys.modules[name])
    _FINDER = _PostImportFinder(hooks)
    sys.meta_path.insert(0, _FINDER)
    return rec


def uninstall() -> None:
    """Remove the import hook (tests). Classes already wrapped stay wrapped."""
    global _RECORDER, _FINDER
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    if _RECORDER is not None:
        for fd in _RECORDER.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
    _RECORDER = None
    _FINDER = None
