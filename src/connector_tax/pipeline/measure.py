"""One server launch measuring the cells a phase could not reuse, each sealed as it ends.

Per cell: a staging folder receives the load generator's records and summary, the /metrics
sampler's scrapes and the cell's slice of the raw step log; then `seal_cell` moves them into the
phase folder, summary last. The index (run.json) is rewritten after every cell, so a kill at
any moment leaves it true. A cell whose server died, or in which no request succeeded, is
sealed as failed with the reason (its records are kept for a person to read) and is redone on
the next run; the launch stops at a dead server and leaves the remaining cells pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import METRICS_INTERVAL_S
from connector_tax.contract.index import COMPLETE, FAILED, PhaseIndex, seal_cell
from connector_tax.launch.command import launch_spec
from connector_tax.launch.vllm_cpu import device
from connector_tax.loadgen.affinity import plan_affinity
from connector_tax.loadgen.session import CellSpec, LoadGenerator, LoadgenOptions
from connector_tax.loadgen.stats import ValidityThresholds
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.pipeline.plan import PlannedCell
from connector_tax.pipeline.provenance import gpu_description
from connector_tax.pipeline.steplog import StepLogSplitter, drop_raw_logs, step_timing_status
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.process import READY_TIMEOUT_S, ServerProcess, free_port


class ServerDied(RuntimeError):
    """The server exited while cells were still to be measured."""


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
    )


def cell_spec(planned: PlannedCell) -> CellSpec:
    cell = planned.cell
    return CellSpec(
        phase=cell.phase,
        label=cell.label,
        arrival=cell.arrival,
        rate=cell.rate,
        shape=cell.shape,
        warmup_s=cell.warmup_s,
        duration_s=cell.duration_s,
        min_completed=cell.min_completed,
    )


def _verdict(summary: dict[str, Any], server: ServerProcess) -> tuple[str, str | None]:
    if server.proc is not None and server.proc.poll() is not None:
        return FAILED, f"server exited with code {server.proc.returncode} during the cell"
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
) -> None:
    """Launch the variant's server once and measure `todo` in order, updating `index`."""
    backend = config["backend"]
    phase_dir = layout.phase(index.config, index.phase)
    host = variant.get("server", {}).get("host") or config["server"]["host"]
    port = free_port(host, block=3 if backend == "vllm" else 1)
    drop_raw_logs(phase_dir.raw_steps)  # an earlier launch's cells are sealed or will be redone
    raw = phase_dir.raw_step_log(index.launch_id)
    raw.parent.mkdir(parents=True, exist_ok=True)
    spec = launch_spec(config_path, config, variant, port, str(raw) if backend != "openai" else None)
    url = spec.url or f"http://{host}:{port}"
    index.launch_command = spec.argv
    with gpu_lease(backend, device=device(config)) as gpu:
        if gpu is not None:
            spec.env["CUDA_VISIBLE_DEVICES"] = gpu
        index.gpu = gpu_description(gpu, backend)
        options = loadgen_options(config, url)
        # Off the load generator's worker cores: a server waking there preempts a send spin.
        cpus = plan_affinity(options.workers).server_cpus if options.affinity else ()
        with ServerProcess(spec, url, phase_dir.folder, cpus=cpus) as server:
            index.server_cpus = list(server.cpus) or None
            save()
            server.wait_ready(READY_TIMEOUT_S[backend])
            splitter = StepLogSplitter(raw)
            with LoadGenerator(options) as gen:
                for planned in todo:
                    _measure_cell(layout, index, planned, gen, server, splitter)
                    save()
                    entry = index.cell(planned.cell.phase, planned.cell.label)
                    if entry is not None and entry.reason and entry.reason.startswith("server exited"):
                        raise ServerDied(f"{planned.cell.key}: {entry.reason}")
            available, reason = step_timing_status(raw, backend, bool(variant.get("connector")))
            index.step_timing_available, index.step_timing_reason = available, reason
    drop_raw_logs(phase_dir.raw_steps)


def _measure_cell(
    layout: StudyLayout,
    index: PhaseIndex,
    planned: PlannedCell,
    gen: LoadGenerator,
    server: ServerProcess,
    splitter: StepLogSplitter,
) -> None:
    cell = planned.cell
    folder = layout.phase(index.config, cell.phase)
    staging, final = folder.staging(cell.label), folder.cell(cell.label)
    staging.folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic_ns()
    with MetricsSampler(server.url, staging.metrics, METRICS_INTERVAL_S):
        summary = gen.run_cell(cell_spec(planned), staging.folder)
    splitter.split(t0, time.monotonic_ns(), staging.engine_step)
    status, reason = _verdict(summary, server)
    sealed = seal_cell(staging, final, planned.fingerprint, status=status, reason=reason)
    entry = index.cell(cell.phase, cell.label)
    if entry is not None:
        entry.status = COMPLETE if sealed["complete"] else FAILED
        entry.reason = sealed.get("reason")
        entry.counts = {k: v["records"] for k, v in sealed["files"].items()}
