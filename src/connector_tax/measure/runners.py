"""The two clocks a phase's cells run on, behind one interface the measuring loop (measure.py)
takes: a server launch driven by the load generator in real time (`ServerRunner`), or the
simulator computing each cell in virtual time (`VirtualRunner`, `sim.clock: virtual`).

A runner is entered once per phase job (what the job holds while it measures: a GPU lease);
`launch()` is one server launch (the loop launches again after a failure); a launch's `run()`
measures one cell into its staging folder and returns its summary and, if the server failed
during it, why. Both run the cell by the load generator's cell rules (loadgen.schedule.rules); the
overload guard reads the `waiting` scrapes the runner appends to, whichever clock made them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from connector_tax.config import StudyConfig, Variant
from connector_tax.config.cells import PHASE_A, Cell, launch_seed
from connector_tax.contract.fingerprint import METRICS_INTERVAL_S
from connector_tax.contract.index import PhaseIndex
from connector_tax.contract.layout import CellFiles, PhaseLayout
from connector_tax.contract.records import LAUNCH_SEED_ENV
from connector_tax.contract.summary import CellSummary
from connector_tax.launch.command import SIDECAR_PORTS, launch_spec, sidecar_names
from connector_tax.launch.evidence import seen, unseen
from connector_tax.launch.provenance import gpu_description
from connector_tax.launch.steptiming import built_on, thread_labels
from connector_tax.launch.vllm import workarounds
from connector_tax.loadgen.host.affinity import plan_affinity
from connector_tax.loadgen.host.priority import raised_process
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions, needs_server
from connector_tax.measure.precision import PrecisionWatch
from connector_tax.measure.steplog_slices import StepLogSplitter, drop_raw_logs, step_timing_status
from connector_tax.measure.watch import ServerWatch
from connector_tax.metrics.host import HostSampler, listener_pid, not_measured
from connector_tax.metrics.host import Study as HostStudy
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.metrics.threads import IDLE_WINDOW_S, ThreadSampler, record_idle
from connector_tax.oracle.virtual_run import VirtualTimeRun
from connector_tax.serving.cpus import Leased, cpu_lease
from connector_tax.serving.gpus import Gpu, gpu_env, gpu_lease, wait_released
from connector_tax.serving.placement import pin_server_threads, pin_sidecar, pin_this_process, server_pins
from connector_tax.serving.server_process import ServerProcess, ServerStartError, free_port, ready_timeout_s
from connector_tax.serving.sidecar import Sidecars
from connector_tax.sim.settings import resolve

# (monotonic seconds on the cell's clock, vllm:num_requests_waiting) of every scrape
Waiting = list[tuple[float, float]]
VIRTUAL_HOST = "virtual time: the cell was computed, not run on this host, so no contention could touch it"


class Launched(Protocol):
    def run(
        self,
        cell: Cell,
        staging: CellFiles,
        t0_ns: int,
        precision: PrecisionWatch,
        give_up: Callable[[], bool],
        waiting: Waiting,
    ) -> tuple[CellSummary, str | None]: ...


class Runner(Protocol):
    def __enter__(self) -> Runner: ...
    def __exit__(self, *exc: object) -> None: ...
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Any: ...


def _launch_seed(study: StudyConfig, index: PhaseIndex) -> int:
    """This launch's seed: its variant, phase, replicate and how many relaunches came before it."""
    return launch_seed(study.seed, index.variant, index.phase, index.replicate, len(index.restarts))


class ServerRunner:
    """Real time: the variant's server (vLLM, `ctax sim`, or an external one) and its sidecars,
    the load generator, a /metrics sampler and a watch per cell; the step log sliced per cell."""

    def __init__(self, study: StudyConfig, variant: Variant, folder: PhaseLayout, cpus: int | None = None) -> None:
        """cpus: how many CPUs to lease for this job (it has neighbours), near its GPU; None: all."""
        self.study, self.variant, self.folder = study, variant, folder
        self.cpus = cpus
        self.gpu: Gpu | None = None
        self.leased: Leased | None = None
        self._held = contextlib.ExitStack()

    def __enter__(self) -> ServerRunner:
        drop_raw_logs(self.folder.raw_steps)  # an earlier launch's cells are sealed or will be redone
        with contextlib.ExitStack() as stack:
            # The GPU first: the CPUs are leased from its NUMA node.
            self.gpu = stack.enter_context(gpu_lease(self.study.backend, device=self.study.device))
            self.leased = stack.enter_context(cpu_lease(self.cpus, self.gpu.numa_node if self.gpu else None))
            self._held = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._held.close()  # the leases go whatever ended the job
        if exc[0] is None:
            drop_raw_logs(self.folder.raw_steps)

    def _wait_for_gpu(self, index: PhaseIndex) -> None:
        """Record where the job runs, and wait for its GPU's memory to be released: vLLM refuses
        to start below gpu_memory_utilization x total free, and a crashed server's memory comes
        back seconds after it is gone (serving.gpus)."""
        index.cpus_leased = self.leased.cpus if self.leased else None
        placement = dict(index.placement or {})
        if self.leased is not None:
            placement.update(self.leased.record())
        else:  # all of them, or (under SLURM) the allocation's, already in the record
            placement.setdefault("cpus", None)
        if self.gpu is None:
            index.placement = placement
            return
        placement.update(self.gpu.record())
        need = float(self.study.server_of(self.variant).get("gpu_memory_utilization") or 0.0)
        waited = wait_released(self.gpu.index, need)
        placement["gpu_waits_s"] = [*placement.get("gpu_waits_s", []), round(waited, 2)]
        if index.restarts:  # the relaunch after the last failure
            index.restarts[-1]["gpu_released_after_s"] = round(waited, 2)
        index.placement = placement

    @contextmanager
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Iterator[_ServerLaunch]:
        study, backend, variant = self.study, self.study.backend, self.variant
        index.gpu = gpu_description(self.gpu.index if self.gpu else None, backend)
        self._wait_for_gpu(index)
        host = variant.host or study.host
        port = free_port(host, block=3 if backend == "vllm" else 1)
        # Each sidecar (an LMCache MP server) on ports of its own, reserved until it stops.
        sidecar_ports = {name: free_port(host, block=SIDECAR_PORTS) for name in sidecar_names(study, variant)}
        launch_id = f"{index.launch_id}.{len(index.restarts)}"
        raw = self.folder.raw_step_log(launch_id)
        raw.parent.mkdir(parents=True, exist_ok=True)
        step_log = str(raw) if backend != "openai" else None
        # Declared interventions write what they did here, kept with the launch's records.
        evidence = self.folder.evidence(launch_id) if backend == "vllm" and variant.interventions else None
        spec = launch_spec(
            str(study.source), study, variant, port, step_log, sidecar_ports, str(evidence) if evidence else None
        )
        if self.gpu is not None:
            spec.env.update(gpu_env(self.gpu.index))
        if backend == "sim":  # the launch's own draws (the simulator's per-launch speed factor)
            spec.env[LAUNCH_SEED_ENV] = str(_launch_seed(study, index))
        url = spec.url or f"http://{host}:{port}"
        index.launch_command = spec.argv
        index.server_env = dict(spec.env)
        if backend == "vllm":
            index.workarounds = workarounds(variant)
            index.interventions = list(variant.interventions)
            index.interventions_seen = {}
        options = LoadgenOptions.of_study(study, url)
        # Off the load generator's worker cores: a server waking there preempts a send spin.
        cpus = plan_affinity(options.workers).server_cpus if options.affinity else ()
        # The load generator's workers start while the server boots when they need nothing from
        # it (0.35 s less a launch side by side, 16 launches in the default study: docs/simulator.md).
        # Not for vLLM: the load generator is pinned after the server's threads, its idle
        # threads are recorded with no load generator running, and its boot takes a minute.
        overlap = backend != "vllm" and not needs_server(options)
        # Sidecars first, each ready before vLLM starts (it would wait minutes for an absent one),
        # stopped after it; placed where the server is.
        with (
            Sidecars(spec.sidecars, self.folder.folder, cpus) as sidecars,
            ServerProcess(spec, url, self.folder.folder, cpus=cpus) as server,
            LoadGenerator(options) if overlap else contextlib.nullcontext() as early,
        ):
            index.server_cpus = list(server.cpus) or None
            index.sidecars = sidecars.records()
            save()
            server.wait_ready(ready_timeout_s(study, self.variant), sidecars.failure)
            sidecars.check_registered()
            if evidence is not None:
                _check_interventions(index, evidence, save)
            if backend == "vllm" and server.proc is not None:  # what vLLM pinned, before the study moves a thread
                started_on = sorted(server.cpus) if server.cpus else sorted(os.sched_getaffinity(0))
                pins = server_pins(server.proc.pid, started_on, built_on(raw))
                index.placement = {**(index.placement or {}), "server_pins": pins}
            placement = study.cpu_placement if backend == "vllm" else None
            if placement and server.proc is not None:  # every server thread but the model's, apart from it
                threads = pin_server_threads(server.proc.pid, *placement)
                threads["sidecar_threads"] = sum(pin_sidecar(pid, placement[0]) for pid in sidecars.roots())
                index.placement = {**(index.placement or {}), "server_threads": threads}
            labels = _thread_labels(raw, backend)
            # Per-thread CPU of the idle server (and its sidecars): once per variant, in its Phase A launch.
            if backend == "vllm" and server.proc is not None and index.phase == PHASE_A:
                idle = self.folder.idle_threads
                samples = record_idle(
                    server.proc.pid, idle, IDLE_WINDOW_S, METRICS_INTERVAL_S, labels, sidecars.roots()
                )
                index.idle_threads = {
                    "file": idle.name,
                    "launch": f"{index.launch_id}.{len(index.restarts)}",
                    "seconds": IDLE_WINDOW_S,
                    "samples": samples,
                }
            given_back = pin_this_process(placement[0]) if placement else None  # the load generator too
            try:
                with contextlib.nullcontext(early) if early is not None else LoadGenerator(options) as gen:
                    yield _ServerLaunch(index.variant, server, gen, StepLogSplitter(raw), labels, sidecars)
            finally:
                if given_back:
                    pin_this_process(given_back)
            available, reason = step_timing_status(raw, backend, self.variant.connector is not None)
            index.step_timing_available, index.step_timing_reason = available, reason
        if evidence is not None:  # the launch stopped: its final counts
            index.interventions_seen = seen(evidence, index.interventions)


def _check_interventions(index: PhaseIndex, evidence: Path, save: Callable[[], None]) -> None:
    """Once the server is ready, every declared intervention has acted or the launch is refused:
    each shipped one acts while vLLM starts (NIXL's agent and Mooncake's worker are built before
    the server answers), so a cell measured now would measure the variant without it."""
    index.interventions_seen = seen(evidence, index.interventions)
    save()
    why = unseen(index.interventions_seen)
    if why is not None:
        raise ServerStartError(why)


def _local_listener(url: str) -> int | None:
    target = urlsplit(url if "://" in url else f"http://{url}")
    if target.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    return listener_pid(target.port or (443 if target.scheme == "https" else 80))


class _ServerLaunch:
    def __init__(
        self,
        name: str,
        server: ServerProcess,
        gen: LoadGenerator,
        splitter: StepLogSplitter,
        labels: Callable[[], dict[str, str]],
        sidecars: Sidecars,
    ) -> None:
        self.name, self.server, self.gen, self.splitter, self.labels = name, server, gen, splitter, labels
        self.sidecars = sidecars
        # The study's own processes on this host: this job (the load generator's main process) with
        # its descendants and ancestors, the server's process group (it runs in its own session)
        # and its sidecars' groups. An external server (backend openai) on this host is found by
        # its port: its CPU is the server's, not contention.
        external = None if server.proc else _local_listener(server.url)
        self.study = HostStudy(os.getpid(), server.proc.pid if server.proc else None, external, sidecars.pgids())

    def run(
        self,
        cell: Cell,
        staging: CellFiles,
        t0_ns: int,
        precision: PrecisionWatch,
        give_up: Callable[[], bool],
        waiting: Waiting,
    ) -> tuple[CellSummary, str | None]:
        threads = self._threads(staging)
        host = HostSampler(staging.host, self.study, METRICS_INTERVAL_S, self.gen.options.validity)
        # The samplers share the sending thread's GIL: with the load generator real-time, they are too.
        with (
            raised_process(self.gen.options.rt_priority) as priority,
            MetricsSampler(self.server.url, staging.metrics, METRICS_INTERVAL_S, waiting) as sampler,
            precision,
            threads,
        ):
            watch = ServerWatch(self.server, self.gen, sampler, f"{self.name}/{cell.key}", beside=self.sidecars.failure)
            with host, watch:
                summary = self.gen.run_cell(cell, staging.folder, precision.enough, give_up)
        if summary.rt_priority is not None:
            summary.rt_priority.process = priority.describe()
        summary.host = host.report()
        self.splitter.split(t0_ns, time.monotonic_ns(), staging.engine_step)
        # A dead load-generator worker lost the requests it held: the cell is redone, on a fresh pool.
        failure = watch.failure or (None if self.gen.pool.alive() else "a load generator worker died during the cell")
        return summary, failure

    def _threads(self, staging: CellFiles) -> Any:
        """Per-thread CPU time of the server's processes, sampled with the metrics, sliced per
        cell; nothing for an external server (backend openai)."""
        if self.server.proc is None:
            return contextlib.nullcontext()
        return ThreadSampler(
            self.server.proc.pid, staging.threads, METRICS_INTERVAL_S, self.labels, self.sidecars.roots()
        )


def _thread_labels(raw: Any, backend: str) -> Callable[[], dict[str, str]]:
    """{tid: connector} of threads a connector's constructor started (vLLM's step-timing reports)."""
    if backend != "vllm":
        return dict
    return lambda: thread_labels(raw)


class VirtualRunner:
    """Virtual time: no server; the engine `ctax sim` would serve with computes each cell
    (oracle.virtual_run). A cell's `wall_s` is its virtual duration (what it would take on the
    modelled hardware), `compute_s` what computing it took here."""

    def __init__(self, study: StudyConfig, variant: Variant) -> None:
        self.study, self.variant = study, variant
        self.settings = resolve(study, variant, {})
        self.options = LoadgenOptions.of_study(study, "virtual:")

    def __enter__(self) -> VirtualRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @contextmanager
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Iterator[VirtualRunner]:
        index.launch_command = None
        index.step_timing_available, index.step_timing_reason = True, None  # the engine model writes every step
        self.settings = resolve(self.study, self.variant, {}, _launch_seed(self.study, index))
        yield self

    def run(
        self,
        cell: Cell,
        staging: CellFiles,
        t0_ns: int,
        precision: PrecisionWatch,
        give_up: Callable[[], bool],
        waiting: Waiting,
    ) -> tuple[CellSummary, str | None]:
        print(f"  {cell.key}: computing in virtual time", flush=True)
        summary = VirtualTimeRun(
            self.settings,
            cell,
            self.options,
            staging,
            t0_ns,
            enough=precision.check,  # recomputed once a virtual second (the rules' ask_every_ns)
            give_up=give_up,
            waiting=waiting,
            metrics_interval_s=METRICS_INTERVAL_S,
        ).run()
        summary.host = not_measured(VIRTUAL_HOST)
        return summary, None
