"""Per-process state of the step-timing instrumentation: step accumulators, record files and
the availability report.

Two kinds of record, each in its own file per process (one os.write per record, O_APPEND, no
buffering: a killed server loses at most the line being written):

* engine records (`<base>.engine.<pid>.jsonl`), one per EngineCore.step_fn call, in the process
  that runs the EngineCore: `step_duration_us` is Scheduler.schedule() entry to exit (the
  study's definition), `build_meta_us` the build_connector_meta time inside it,
  `engine_step_us` the whole step_fn call (schedule, execute, update; with async scheduling it
  overlaps the model, since the batch queue holds two batches);
* worker records (`<base>.worker.<pid>.jsonl`), one per worker-connector step
  (bind_connector_metadata to clear_connector_metadata), in the process that holds the worker
  connector: start_load_kv, wait_for_layer_load (per layer, summed and counted), save_kv_layer
  (idem), wait_for_save and get_finished (through get_transfer_results) times.

When the worker connector lives in the engine process (vLLM's single-process executor), the
engine record also carries the worker hooks' time spent during that engine step in
`start_load_kv_us` / `get_finished_us`; otherwise those two fields are null there and the worker
records are the only place they are.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from patches.targets import SCHEMA_VERSION


def _log_base(path: str) -> str:
    return path[: -len(".jsonl")] if path.endswith(".jsonl") else path


def records_path(step_log: str, role: str, pid: int) -> str:
    return f"{_log_base(step_log)}.{role}.{pid}.jsonl"


def targets_path(step_log: str, pid: int) -> str:
    return f"{_log_base(step_log)}.targets.{pid}.json"


def num(value: float | int | None) -> str:
    """A JSON number, microseconds to the nanosecond ("%.3f": several times cheaper than
    repr(round(...)), and records are written on vLLM's step path)."""
    if value is None:
        return "null"
    if type(value) is float:
        return "%.3f" % value
    return str(value)


class HookTime:
    """One timed span's total in the current step, in integer nanoseconds, and its calls.

    The wrappers close over their HookTime and add to its slots directly: no attribute looked
    up by name and no float division per call (both were on vLLM's step path); microseconds
    are computed once, when the record is written."""

    __slots__ = ("ns", "calls")

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0

    def clear(self) -> None:
        self.ns = 0
        self.calls = 0

    @property
    def us(self) -> float:
        return self.ns / 1000.0


# A worker record: every field is known in the process that holds the worker connector, so one
# %-format makes the line (no per-field null handling).
_WORKER_LINE = (
    '{"t_ns":%d,"step_id":%d,"step_duration_us":null,"build_meta_us":null,"get_finished_us":%.3f,'
    '"start_load_kv_us":%.3f,"num_running":null,"num_waiting":null,"prefill_tokens":null,'
    '"decode_tokens":null,"worker_step_us":%.3f,"wait_for_layer_load_us":%.3f,'
    '"wait_for_layer_load_calls":%d,"save_kv_layer_us":%.3f,"save_kv_layer_calls":%d,'
    '"wait_for_save_us":%.3f,"pid":%d,"role":"worker","source":"vllm"}\n'
)


class StepRecorder:
    """Per-process state: the step accumulators, the record files, the availability report."""

    def __init__(self, step_log: str) -> None:
        self.step_log = os.path.abspath(step_log)
        # Made once and cleared in place, never replaced: the wrappers hold them (also across
        # a fork, whose child keeps the parent's wraps).
        self.schedule = HookTime()
        self.build_meta = HookTime()
        self.engine_get_finished = HookTime()
        self.engine_start_load_kv = HookTime()
        self.start_load_kv = HookTime()
        self.wait_for_layer_load = HookTime()
        self.save_kv_layer = HookTime()
        self.wait_for_save = HookTime()
        self.get_finished = HookTime()
        self._engine_times = (self.schedule, self.build_meta, self.engine_get_finished, self.engine_start_load_kv)
        self._worker_times = (
            self.start_load_kv,
            self.wait_for_layer_load,
            self.save_kv_layer,
            self.wait_for_save,
            self.get_finished,
        )
        self._reset_process()

    # -- process identity ------------------------------------------------------------
    def _reset_process(self) -> None:
        self.pid = os.getpid()
        self.role: str | None = None
        # True from the moment an EngineCore starts initialising in this process.
        self.engine_process = False
        self.fds: dict[str, int] = {}
        self.step_id = 0
        self.worker_step_id = 0
        self.targets: dict[str, str] = {}
        self.instances: dict[str, str] = {}
        self.errors: list[str] = []
        # Threads that appeared in this process while a connector was being built ({tid: "NixlConnector
        # worker"}): the per-thread CPU records name them (a library's threads carry the process's name).
        self.threads_started: dict[str, str] = {}
        # The thread each connector was built on, with its CPUs before and after the constructor
        # ({"NixlPullConnector worker": {"tid": 11680, "cpus_before": [1], "cpus_after": [1]}}): a
        # constructor that pins its caller (vLLM's NIXL worker on CPU) shows as a change.
        self.built_on: dict[str, dict[str, Any]] = {}
        self.has_scheduler_connector = False
        self.has_worker_connector = False
        self.disabled = False
        self.begin_engine_step()
        self._reset_worker_step()
        self.worker_t0: int | None = None

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
    def begin_engine_step(self) -> None:
        for timer in self._engine_times:
            timer.clear()
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.num_running: int | None = None
        self.num_waiting: int | None = None
        self.scheduled = False
        self.tokens_known = True

    @property
    def build_meta_us(self) -> float:
        return self.build_meta.us

    def _reset_worker_step(self) -> None:
        for timer in self._worker_times:
            timer.clear()
        # get_transfer_results calls get_finished: only the outer call is timed
        self.in_get_finished = False

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

    def note_threads(self, tids: set[str], label: str) -> None:
        if tids:
            self.threads_started.update(dict.fromkeys(sorted(tids), label))
            self.write_targets()

    def note_built_on(self, tid: int, label: str, before: list[int] | None, after: list[int] | None) -> None:
        self.built_on[label] = {"tid": tid, "cpus_before": before, "cpus_after": after}
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
            "records": {
                role: records_path(self.step_log, role, self.pid)
                for role in ("engine", "worker")
                if (role == "engine" and self.engine_process) or (role == "worker" and self.has_worker_connector)
            },
            "vllm_version": getattr(vllm, "__version__", None),
            "python": sys.version.split()[0],
            "targets": self.targets,
            "instances": self.instances,
            "errors": self.errors,
            "threads_started": self.threads_started,
            "built_on": self.built_on,
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
        """One engine record: t0/t1 are the step_fn call's entry and exit."""
        self.step_id += 1
        scheduled = self.scheduled
        sched_conn = self.has_scheduler_connector and scheduled
        # worker hooks in this process (single-process executor) belong to its engine steps
        here = self.has_worker_connector
        tokens = scheduled and self.tokens_known
        line = (
            f'{{"t_ns":{t0},"step_id":{self.step_id},'
            f'"step_duration_us":{num(self.schedule.us if scheduled else None)},'
            f'"build_meta_us":{num(self.build_meta.us if sched_conn else None)},'
            f'"get_finished_us":{num(self.engine_get_finished.us if here else None)},'
            f'"start_load_kv_us":{num(self.engine_start_load_kv.us if here else None)},'
            f'"num_running":{num(self.num_running)},"num_waiting":{num(self.num_waiting)},'
            f'"prefill_tokens":{num(self.prefill_tokens if tokens else (0 if not scheduled else None))},'
            f'"decode_tokens":{num(self.decode_tokens if tokens else (0 if not scheduled else None))},'
            f'"engine_step_us":{num((t1 - t0) / 1000.0)},'
            f'"pid":{self.pid},"role":"engine","source":"vllm"}}\n'
        )
        self._write("engine", line)

    def begin_worker_step(self, t0: int) -> None:
        if self.worker_t0 is not None:  # a step that was never cleared: close it first
            self.end_worker_step(t0)
        self._reset_worker_step()
        self.worker_t0 = t0

    def end_worker_step(self, t1: int) -> None:
        """One worker record, from bind_connector_metadata entry to clear_connector_metadata exit."""
        t0 = self.worker_t0
        if t0 is None:
            return  # a clear without a bind (nothing was bound): no step
        self.worker_t0 = None
        self.worker_step_id += 1
        line = _WORKER_LINE % (
            t0,
            self.worker_step_id,
            self.get_finished.us,
            self.start_load_kv.us,
            (t1 - t0) / 1000.0,
            self.wait_for_layer_load.us,
            self.wait_for_layer_load.calls,
            self.save_kv_layer.us,
            self.save_kv_layer.calls,
            self.wait_for_save.us,
            self.pid,
        )
        self._write("worker", line)

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}
