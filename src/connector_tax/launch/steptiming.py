"""Reading what the vLLM step-timing instrumentation (patches/step_timing.py) wrote.

For a launch with CONNECTOR_TAX_STEP_LOG=<base>.jsonl every vLLM process that imported the
hooked modules leaves `<base>.targets.<pid>.json` (what it wrapped), the engine-core process
writes `<base>.engine.<pid>.jsonl` (one record per engine step: step_duration_us is
Scheduler.schedule(), engine_step_us the whole step) and the process holding the worker
connector `<base>.worker.<pid>.jsonl` (one record per worker-connector step: start_load_kv,
wait_for_layer_load, save_kv_layer, wait_for_save, get_finished). The pipeline calls:

* step_timing_status(step_log, has_connector) -> (available, reason): the manifest's
  step_timing_available is true only when an engine process wrapped every needed target;
* read_step_records(step_log, role="engine"|"worker") -> the records, oldest first (a
  truncated last line, as a killed server leaves, is skipped);
* merge_step_log(step_log, dest) -> writes those records as one JSONL file (e.g. the
  study's engine_step_<phase>_<cell>.jsonl after slicing by t_ns);
* thread_labels(step_log) -> {tid: connector}: threads started inside a connector's constructor
  (the per-thread CPU sampler names them with it);
* built_on(step_log) -> [{"connector", "pid", "tid", "cpus_before", "cpus_after"}]: the thread each
  connector was built on and its CPUs before and after the constructor (a constructor that pins its
  caller, as vLLM's NIXL worker does on CPU, shows as a change).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Must equal patches/targets.py's ENGINE_INSTANCES etc. (patches/ cannot import this package;
# tests check the two agree).
ENGINE_INSTANCES = ("engine.step_fn", "scheduler.schedule")
SCHEDULER_CONNECTOR_INSTANCES = ("connector.scheduler.build_connector_meta",)
WORKER_CONNECTOR_INSTANCES = tuple(
    f"connector.worker.{hook}"
    for hook in (
        "bind_connector_metadata",
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
        "get_transfer_results",
        "clear_connector_metadata",
    )
)


def _base(step_log: str | Path) -> Path:
    path = Path(step_log)
    return path.with_suffix("") if path.suffix == ".jsonl" else path


def step_log_files(step_log: str | Path) -> dict[str, list[Path]]:
    """{"engine": [...], "worker": [...], "targets": [...]} next to a step log path."""
    base = _base(step_log)
    folder, stem = base.parent, base.name

    def glob(pattern: str) -> list[Path]:
        return sorted(folder.glob(f"{stem}.{pattern}")) if folder.is_dir() else []

    return {
        "engine": glob("engine.*.jsonl"),
        "worker": glob("worker.*.jsonl"),
        "targets": [p for p in glob("targets.*.json") if not p.name.endswith(".tmp")],
    }


def read_targets(step_log: str | Path) -> list[dict[str, Any]]:
    reports = []
    for path in step_log_files(step_log)["targets"]:
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return reports


def thread_labels(step_log: str | Path) -> dict[str, str]:
    """{tid: "NixlConnector worker"}: threads that appeared while a connector was built, as every
    instrumented process recorded them (the per-thread CPU records carry them as `started_by`)."""
    labels: dict[str, str] = {}
    for report in read_targets(step_log):
        started = report.get("threads_started")
        if isinstance(started, dict):
            labels.update({str(k): str(v) for k, v in started.items()})
    return labels


def built_on(step_log: str | Path) -> list[dict[str, Any]]:
    """[{"connector": "NixlPullConnector worker", "pid": 11680, "tid": 11680, "cpus_before": [1],
    "cpus_after": [1]}, ...]: every connector built in the launch's instrumented processes, and the
    thread it was built on."""
    out: list[dict[str, Any]] = []
    for report in read_targets(step_log):
        built = report.get("built_on")
        if not isinstance(built, dict):
            continue
        for label, where in sorted(built.items()):
            if isinstance(where, dict) and isinstance(where.get("tid"), int):
                out.append(
                    {
                        "connector": str(label),
                        "pid": report.get("pid"),
                        "tid": where["tid"],
                        "cpus_before": where.get("cpus_before"),
                        "cpus_after": where.get("cpus_after"),
                    }
                )
    return out


def _wrapped(status: str | None) -> bool:
    return bool(status) and str(status).startswith("wrapped")


def step_timing_status(step_log: str | Path, has_connector: bool) -> tuple[bool, str]:
    """(available, reason). Available when some engine process wrapped its step and its
    scheduler's schedule() and wrote records, and, for a configuration with a connector, the
    scheduler connector's build_connector_meta and the worker connector's start_load_kv and
    get_transfer_results were wrapped (in the engine process, or in worker processes)."""
    reports = read_targets(step_log)
    if not reports:
        return False, f"no instrumentation report next to {step_log} (patches/ not loaded?)"
    engines = [r for r in reports if r.get("role") == "engine"]
    if not engines:
        errors = [e for r in reports for e in r.get("errors", [])]
        targets = {k: v for r in reports for k, v in r.get("targets", {}).items()}
        missing = [k for k, v in targets.items() if not str(v).startswith(("wrapped", "present"))]
        detail = "; ".join(errors[:2] + [f"{k}: {targets[k]}" for k in missing[:2]])
        return False, "no vLLM engine-core process was instrumented" + (f" ({detail})" if detail else "")
    instances: dict[str, str] = {}
    for report in reports:
        for key, value in report.get("instances", {}).items():
            if _wrapped(value) or key not in instances:
                instances[key] = value
    needed = list(ENGINE_INSTANCES)
    if has_connector:
        needed += list(SCHEDULER_CONNECTOR_INSTANCES) + list(WORKER_CONNECTOR_INSTANCES)
    missing = [k for k in needed if not _wrapped(instances.get(k))]
    if missing:
        return False, "not wrapped: " + "; ".join(f"{k} ({instances.get(k, 'never reached')})" for k in missing)
    if not read_step_records(step_log):
        return False, "instrumented, but no engine step was recorded"
    versions = sorted({str(r.get("vllm_version")) for r in engines})
    return True, f"all targets wrapped (vLLM {', '.join(versions)})"


def _read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a truncated last line
            if isinstance(record, dict):
                records.append(record)
    return records


def read_step_records(
    step_log: str | Path, role: str = "engine", t0_ns: int | None = None, t1_ns: int | None = None
) -> list[dict[str, Any]]:
    """The records of one role, oldest first; with t0_ns/t1_ns only steps that started in
    [t0_ns, t1_ns) (a cell's window)."""
    records = _read_jsonl(step_log_files(step_log)[role])
    if t0_ns is not None:
        records = [r for r in records if r.get("t_ns", 0) >= t0_ns]
    if t1_ns is not None:
        records = [r for r in records if r.get("t_ns", 0) < t1_ns]
    records.sort(key=lambda r: (r.get("t_ns", 0), r.get("pid", 0), r.get("step_id", 0)))
    return records


def merge_step_log(
    step_log: str | Path,
    dest: str | Path | None = None,
    t0_ns: int | None = None,
    t1_ns: int | None = None,
) -> Path:
    """Write the engine records (optionally of one time window) to `dest` (default: the step
    log path itself) as one JSONL file; returns its path."""
    out = Path(dest) if dest is not None else Path(step_log)
    records = read_step_records(step_log, "engine", t0_ns, t1_ns)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    tmp.replace(out)
    return out
