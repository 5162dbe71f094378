"""Server launches measuring the cells a phase could not reuse, each cell sealed as it ends.

Per cell: a staging folder receives the load generator's records and summary, the /metrics
sampler's scrapes and the cell's slice of the raw step log; then `seal_cell` moves them into the
phase folder, summary last. The index (run.json) is rewritten after every cell, so a kill at
any moment leaves it true.

While a cell runs, a `ServerWatch` looks at its server twice a second: a server that exited, or
that is stuck (requests in flight, none answered and no engine work for STALL_S), stops the cell
at once (every completed record is kept); the cell is sealed as failed with the reason, the
server and load generator are stopped and launched anew for the next cell, at most MAX_RESTARTS
times per phase job (each restart recorded in the index). A dead load-generator worker fails its
cell the same way. A cell in which no request succeeded is failed too. Failed cells keep their
records for a person to read and are redone on the next run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from connector_tax.contract import PHASE_A, Cell, StudyLayout
from connector_tax.contract.fingerprint import METRICS_INTERVAL_S
from connector_tax.contract.index import COMPLETE, FAILED, PRUNED, PhaseIndex, seal_cell
from connector_tax.contract.layout import CellFiles, now_iso
from connector_tax.launch.command import launch_spec
from connector_tax.launch.vllm_cpu import device
from connector_tax.loadgen.affinity import plan_affinity
from connector_tax.loadgen.session import CellSpec, LoadGenerator, LoadgenOptions, Progress
from connector_tax.loadgen.stats import ValidityThresholds
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.metrics.threads import ThreadSampler, record_idle
from connector_tax.pipeline.plan import PlannedCell
from connector_tax.pipeline.precision import OverloadGuard, PrecisionWatch
from connector_tax.pipeline.provenance import gpu_description, virtual_clock
from connector_tax.pipeline.steplog import StepLogSplitter, drop_raw_logs, step_timing_status
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.process import ServerProcess, free_port, ready_timeout_s

MAX_RESTARTS = 2  # server launches after the first, per phase job
IDLE_THREADS_S = 3.0  # vLLM: per-thread CPU of the ready, idle server before its Phase A cells
STALL_S = 30.0  # no answer and no engine work for this long, requests in flight: the server is stuck


class ServerDied(RuntimeError):
    """The server failed more often than a launch may restart it."""


def loadgen_options(config: dict[str, Any], url: str) -> LoadgenOptions:
    workload = config["workload"]
    loadgen = config["loadgen"]
    return LoadgenOptions(
        url=url,
        model=config["model"].get("served_name") or config["model"]["name"],
        endpoint=workload["endpoint"],
        prompt=workload["prompt"],
        temperature=workload["temperature"],
        ignore_eos=workload["ignore_eos"],
        inflight_cap=workload["inflight_cap"],
        timeout_s=workload["request_timeout_s"],
        seed=config["seed"],
        workers=loadgen["workers"],
        affinity=loadgen["affinity"],
        cpu_latency_us=loadgen["cpu_latency_us"],
        validity=ValidityThresholds.from_dict(config.get("validity")),
        api_key_env=(config.get("openai") or {}).get("api_key_env") if config["backend"] == "openai" else None,
    )


def cell_spec(planned: PlannedCell) -> CellSpec:
    cell = planned.cell
    return CellSpec(
        phase=cell.phase,
        label=cell.label,
        arrival=cell.arrival,
        gamma_shape=cell.gamma_shape,
        rate=cell.rate,
        shape=cell.shape,
        warmup_s=cell.warmup_s,
        duration_s=cell.duration_s,
        min_completed=cell.min_completed,
        max_duration_s=cell.max_duration_s,
    )


PROGRESS_S = 5.0  # a progress line per cell this often, in the job's log and snakemake's console


class ServerWatch:
    """Stops the running cell when its server exits or is stuck; `failure` says why. Prints the
    cell's progress every PROGRESS_S (elapsed, sent, completed, errors, recent TTFT p50).

    Stuck: requests in flight, none answered (ok or error) for `stall_s`, and the engine's work
    counters on /metrics still for as long (or /metrics not answering). A long request that is
    still decoding moves the counters; a slow /metrics alone, with requests completing, is not a
    stuck server."""

    def __init__(
        self, server: ServerProcess, gen: LoadGenerator, sampler: MetricsSampler, name: str, stall_s: float = STALL_S
    ) -> None:
        self.server, self.gen, self.sampler, self.stall_s, self.name = server, gen, sampler, stall_s, name
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-server-watch", daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _run(self) -> None:
        start = time.monotonic()
        answered, since, shown = -1, start, start
        # By hand in a terminal: a live bar; under snakemake (a pipe and a log): a line every PROGRESS_S.
        bar = tqdm(desc=self.name, unit="req", file=sys.stderr, leave=False) if sys.stderr.isatty() else None
        try:
            while not self._stop.wait(0.5):
                now = time.monotonic()
                progress = self.gen.progress
                if bar is not None:
                    self._show_bar(bar, progress)
                elif now - shown >= PROGRESS_S:
                    shown = now
                    print(f"  {self.name}: {now - start:.0f} s, {self._counts(progress)}", flush=True)
                if progress.completed + progress.errors != answered or progress.in_flight == 0:
                    answered, since = progress.completed + progress.errors, now
                if self._check(progress, start, now, since):
                    return
        finally:
            if bar is not None:
                bar.close()

    @staticmethod
    def _counts(progress: Progress) -> str:
        ttft = progress.ttft_p50_ms()
        return (
            f"sent {progress.issued}, completed {progress.completed}, errors {progress.errors}, "
            f"in flight {progress.in_flight}" + (f", TTFT p50 {ttft:.1f} ms" if ttft is not None else "")
        )

    @staticmethod
    def _show_bar(bar: tqdm, progress: Progress) -> None:
        bar.n = progress.completed
        ttft = progress.ttft_p50_ms()
        bar.set_postfix_str(
            f"sent {progress.issued}, in flight {progress.in_flight}, errors {progress.errors}"
            + (f", TTFT p50 {ttft:.1f} ms" if ttft is not None else ""),
            refresh=True,
        )

    def _check(self, progress: Progress, start: float, now: float, since: float) -> bool:
        """Set `failure` and stop the cell when the server exited or is stuck."""
        worked = max(self.sampler.last_work or start, start)
        code = self.server.exited()
        if code is not None:
            self.failure = f"server exited with code {code} during the cell"
        elif now - since > self.stall_s and now - worked > self.stall_s:
            self.failure = (
                f"server stuck: no response and no engine work for {self.stall_s:g} s "
                f"with {progress.in_flight} requests in flight"
            )
        if self.failure:
            self.gen.stop()
            return True
        return False


def _verdict(summary: dict[str, Any], failure: str | None) -> tuple[str, str | None]:
    if failure:
        return FAILED, failure
    counts = summary.get("counts") or {}
    if counts.get("post_warmup", 0) > 0 and counts.get("ok", 0) == 0:
        return FAILED, "no request succeeded"
    return COMPLETE, None


def measure(
    config_path: str,
    config: dict[str, Any],
    variant: dict[str, Any],
    layout: StudyLayout,
    index: PhaseIndex,
    todo: list[PlannedCell],
    save: Callable[[], None],
    prune: Callable[[PlannedCell], str | None] = lambda planned: None,
) -> None:
    """Measure `todo` in order, launching the variant's server (again after a failure); a cell
    `prune` gives a reason for, when its turn comes, is recorded as pruned, not measured."""
    backend = config["backend"]
    phase_dir = layout.phase(index.config, index.phase)
    drop_raw_logs(phase_dir.raw_steps)  # an earlier launch's cells are sealed or will be redone
    pending = list(todo)
    prune_from(index, pending, prune)
    if not pending:
        return
    if virtual_clock(config):
        from connector_tax.pipeline.measure_virtual import measure_virtual

        measure_virtual(config, variant, layout, index, pending, save, prune)
        return
    with gpu_lease(backend, device=device(config)) as gpu:
        index.gpu = gpu_description(gpu, backend)
        while pending:
            failure = _launch(config_path, config, variant, layout, index, pending, gpu, save, prune)
            if failure is None:
                break
            index.restarts.append({"at": now_iso(), "after": failure})
            save()
            if len(index.restarts) > MAX_RESTARTS:
                raise ServerDied(f"server failed {len(index.restarts)} times; last: {failure}")
    drop_raw_logs(phase_dir.raw_steps)


def _launch(
    config_path: str,
    config: dict[str, Any],
    variant: dict[str, Any],
    layout: StudyLayout,
    index: PhaseIndex,
    pending: list[PlannedCell],
    gpu: str | None,
    save: Callable[[], None],
    prune: Callable[[PlannedCell], str | None],
) -> str | None:
    """One server launch measuring cells off the front of `pending` until a server failure
    (returned) or the end (None)."""
    backend = config["backend"]
    phase_dir = layout.phase(index.config, index.phase)
    host = variant.get("server", {}).get("host") or config["server"]["host"]
    port = free_port(host, block=3 if backend == "vllm" else 1)
    raw = phase_dir.raw_step_log(f"{index.launch_id}.{len(index.restarts)}")
    raw.parent.mkdir(parents=True, exist_ok=True)
    spec = launch_spec(config_path, config, variant, port, str(raw) if backend != "openai" else None)
    if gpu is not None:
        spec.env["CUDA_VISIBLE_DEVICES"] = gpu
    url = spec.url or f"http://{host}:{port}"
    index.launch_command = spec.argv
    index.server_env = dict(spec.env)
    if backend == "vllm":
        from connector_tax.launch.vllm import workarounds

        index.workarounds = workarounds(config, variant)
    options = loadgen_options(config, url)
    # Off the load generator's worker cores: a server waking there preempts a send spin.
    cpus = plan_affinity(options.workers).server_cpus if options.affinity else ()
    with ServerProcess(spec, url, phase_dir.folder, cpus=cpus) as server:
        index.server_cpus = list(server.cpus) or None
        save()
        server.wait_ready(ready_timeout_s(config, variant))
        labels = _thread_labels(raw, backend)
        # -- per-thread CPU of the idle server (issue 22): once per configuration, in its Phase A launch
        if backend == "vllm" and server.proc is not None and index.phase == PHASE_A:
            samples = record_idle(server.proc.pid, phase_dir.idle_threads, IDLE_THREADS_S, METRICS_INTERVAL_S, labels)
            index.idle_threads = {
                "file": phase_dir.idle_threads.name,
                "launch": f"{index.launch_id}.{len(index.restarts)}",
                "seconds": IDLE_THREADS_S,
                "samples": samples,
            }
        splitter = StepLogSplitter(raw)
        with LoadGenerator(options) as gen:
            while pending:
                failure = _measure_cell(
                    layout, index, pending.pop(0), gen, server, splitter, config["saturation"], labels
                )
                prune_from(index, pending, prune)
                save()
                if failure:
                    return failure
        available, reason = step_timing_status(raw, backend, bool(variant.get("connector")))
        index.step_timing_available, index.step_timing_reason = available, reason
    return None


def prune_from(index: PhaseIndex, pending: list[PlannedCell], prune: Callable[[PlannedCell], str | None]) -> None:
    """Record as pruned, not measured, the next pending cells `prune` gives a reason for."""
    while pending and (why := prune(pending[0])) is not None:
        entry = index.cell(pending[0].cell.phase, pending[0].cell.label)
        if entry is not None:
            entry.status, entry.reason = PRUNED, why
        pending.pop(0)


def _measure_cell(
    layout: StudyLayout,
    index: PhaseIndex,
    planned: PlannedCell,
    gen: LoadGenerator,
    server: ServerProcess,
    splitter: StepLogSplitter,
    saturation: dict[str, float],
    labels: Callable[[], dict[str, str]] = dict,
) -> str | None:
    """Measure and seal one cell; returns why the server failed during it, if it did."""
    cell = planned.cell
    folder = layout.phase(index.config, cell.phase)
    staging, final = folder.staging(cell.label), folder.cell(cell.label)
    staging.folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic_ns()
    precision = PrecisionWatch(staging.requests, cell.precision_target)
    threads = _cell_threads(server, staging.threads, labels)
    with MetricsSampler(server.url, staging.metrics, METRICS_INTERVAL_S) as sampler, precision, threads:
        guard = overload_guard(sampler, time.monotonic() + cell.warmup_s, saturation, cell)
        with ServerWatch(server, gen, sampler, f"{index.config}/{cell.key}") as watch:
            summary = gen.run_cell(cell_spec(planned), staging.folder, precision.enough, guard.overloaded)
    splitter.split(t0, time.monotonic_ns(), staging.engine_step)
    # A dead load-generator worker lost the requests it held: the cell is redone, on a fresh pool.
    failure = watch.failure or (None if gen.pool.alive() else "a load generator worker died during the cell")
    seal_measured(index, planned, staging, final, summary, failure, precision.describe(summary, guard))
    return failure


# -- per-thread CPU time of the server's processes (issue 22): sampled with the metrics, sliced per cell


def _thread_labels(raw: Any, backend: str) -> Callable[[], dict[str, str]]:
    """{tid: connector} of threads a connector's constructor started (vLLM's step-timing reports)."""
    if backend != "vllm":
        return dict
    from connector_tax.launch.steptiming import thread_labels

    return lambda: thread_labels(raw)


def _cell_threads(server: ServerProcess, path: Any, labels: Callable[[], dict[str, str]]) -> Any:
    """A ThreadSampler for a launched server; nothing for an external one (backend openai)."""
    if server.proc is None:
        return contextlib.nullcontext()
    return ThreadSampler(server.proc.pid, path, METRICS_INTERVAL_S, labels)


def overload_guard(sampler: Any, since: float, saturation: dict[str, float], cell: Cell) -> OverloadGuard:
    """Phase B and B' cells end at their floor when saturated, unless the study turned it off."""
    return OverloadGuard(sampler, since, saturation["waiting_p50_max"], cell.phase != PHASE_A and cell.overload_guard)


def seal_measured(
    index: PhaseIndex,
    planned: PlannedCell,
    staging: CellFiles,
    final: CellFiles,
    summary: dict[str, Any],
    failure: str | None,
    extra: dict[str, Any],
) -> None:
    """Seal a measured cell (failed with `failure` if there was one) and note it in the index."""
    cell = planned.cell
    status, reason = _verdict(summary, failure)
    sealed = seal_cell(staging, final, planned.fingerprint, status=status, reason=reason, extra=extra)
    entry = index.cell(cell.phase, cell.label)
    if entry is not None:
        entry.status = COMPLETE if sealed["complete"] else FAILED
        entry.reason = sealed.get("reason")
        entry.counts = {k: v["records"] for k, v in sealed["files"].items()}
