"""The two clocks a phase's cells run on, behind one interface the measuring loop (measure.py)
takes: a server launch driven by the load generator in real time (`ServerRunner`), or the
simulator computing each cell in virtual time (`VirtualRunner`, `sim.clock: virtual`).

A runner is entered once per phase job (what the job holds while it measures: a GPU lease);
`launch()` is one server launch (the loop launches again after a failure); a launch's `run()`
measures one cell into its staging folder and returns its summary and, if the server failed
during it, why. Both run the cell by the load generator's cell rules (loadgen.rules); the
overload guard reads the `waiting` scrapes the runner appends to, whichever clock made them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

from connector_tax.config import Validity
from connector_tax.config.cells import PHASE_A, Cell, launch_seed
from connector_tax.config.vllm_rules import device
from connector_tax.contract.fingerprint import METRICS_INTERVAL_S
from connector_tax.contract.index import PhaseIndex
from connector_tax.contract.layout import CellFiles, PhaseLayout
from connector_tax.contract.records import LAUNCH_SEED_ENV
from connector_tax.launch.command import launch_spec
from connector_tax.launch.steptiming import thread_labels
from connector_tax.launch.vllm import workarounds
from connector_tax.loadgen.affinity import plan_affinity
from connector_tax.loadgen.priority import raised_process
from connector_tax.loadgen.session import LoadGenerator, LoadgenOptions
from connector_tax.metrics.host import HostSampler, listener_pid, not_measured
from connector_tax.metrics.host import Study as HostStudy
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.metrics.threads import ThreadSampler, record_idle
from connector_tax.oracle.virtual_run import VirtualTimeRun
from connector_tax.pipeline.precision import PrecisionWatch
from connector_tax.pipeline.provenance import gpu_description
from connector_tax.pipeline.steplog import StepLogSplitter, drop_raw_logs, step_timing_status
from connector_tax.pipeline.watch import ServerWatch
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.process import ServerProcess, free_port, ready_timeout_s
from connector_tax.sim.settings import resolve

IDLE_THREADS_S = 3.0  # vLLM: per-thread CPU of the ready, idle server before its Phase A cells

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
    ) -> tuple[dict[str, Any], str | None]: ...


class Runner(Protocol):
    def __enter__(self) -> Runner: ...
    def __exit__(self, *exc: object) -> None: ...
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Any: ...


def loadgen_options(config: dict[str, Any], url: str) -> LoadgenOptions:
    workload = config["workload"]
    loadgen = config["loadgen"]
    return LoadgenOptions(
        url=url,
        model=config["model"].get("served_name") or config["model"]["name"],
        endpoint=workload["endpoint"],
        prompt=workload["prompt"],
        tokenizer=workload["tokenizer"],
        temperature=workload["temperature"],
        ignore_eos=workload["ignore_eos"],
        inflight_cap=workload["inflight_cap"],
        timeout_s=workload["request_timeout_s"],
        seed=config["seed"],
        workers=loadgen["workers"],
        affinity=loadgen["affinity"],
        cpu_latency_us=loadgen["cpu_latency_us"],
        rt_priority=loadgen["rt_priority"],
        validity=Validity.from_mapping(config["validity"]),
        api_key_env=(config.get("openai") or {}).get("api_key_env") if config["backend"] == "openai" else None,
    )


def _launch_seed(config: dict[str, Any], index: PhaseIndex) -> int:
    """This launch's seed: its variant, phase, replicate and how many relaunches came before it."""
    return launch_seed(config["seed"], index.variant, index.phase, index.replicate, len(index.restarts))


class ServerRunner:
    """Real time: the variant's server (vLLM, `ctax sim`, or an external one), the load
    generator, a /metrics sampler and a watch per cell; the step log sliced per cell."""

    def __init__(self, config_path: str, config: dict[str, Any], variant: dict[str, Any], folder: PhaseLayout) -> None:
        self.config_path, self.config, self.variant, self.folder = config_path, config, variant, folder
        self.gpu: str | None = None
        self._lease: Any = None

    def __enter__(self) -> ServerRunner:
        drop_raw_logs(self.folder.raw_steps)  # an earlier launch's cells are sealed or will be redone
        self._lease = gpu_lease(self.config["backend"], device=device(self.config))
        self.gpu = self._lease.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lease.__exit__(*exc)
        if exc[0] is None:
            drop_raw_logs(self.folder.raw_steps)

    @contextmanager
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Iterator[_ServerLaunch]:
        config, variant, backend = self.config, self.variant, self.config["backend"]
        index.gpu = gpu_description(self.gpu, backend)
        host = variant.get("server", {}).get("host") or config["server"]["host"]
        port = free_port(host, block=3 if backend == "vllm" else 1)
        raw = self.folder.raw_step_log(f"{index.launch_id}.{len(index.restarts)}")
        raw.parent.mkdir(parents=True, exist_ok=True)
        spec = launch_spec(self.config_path, config, variant, port, str(raw) if backend != "openai" else None)
        if self.gpu is not None:
            spec.env["CUDA_VISIBLE_DEVICES"] = self.gpu
        if backend == "sim":  # the launch's own draws (the simulator's per-launch speed factor)
            spec.env[LAUNCH_SEED_ENV] = str(_launch_seed(config, index))
        url = spec.url or f"http://{host}:{port}"
        index.launch_command = spec.argv
        index.server_env = dict(spec.env)
        if backend == "vllm":
            index.workarounds = workarounds(config, variant)
        options = loadgen_options(config, url)
        # Off the load generator's worker cores: a server waking there preempts a send spin.
        cpus = plan_affinity(options.workers).server_cpus if options.affinity else ()
        with ServerProcess(spec, url, self.folder.folder, cpus=cpus) as server:
            index.server_cpus = list(server.cpus) or None
            save()
            server.wait_ready(ready_timeout_s(config, variant))
            labels = _thread_labels(raw, backend)
            # Per-thread CPU of the idle server: once per variant, in its Phase A launch.
            if backend == "vllm" and server.proc is not None and index.phase == PHASE_A:
                idle = self.folder.idle_threads
                samples = record_idle(server.proc.pid, idle, IDLE_THREADS_S, METRICS_INTERVAL_S, labels)
                index.idle_threads = {
                    "file": idle.name,
                    "launch": f"{index.launch_id}.{len(index.restarts)}",
                    "seconds": IDLE_THREADS_S,
                    "samples": samples,
                }
            with LoadGenerator(options) as gen:
                yield _ServerLaunch(index.variant, server, gen, StepLogSplitter(raw), labels)
            available, reason = step_timing_status(raw, backend, bool(variant.get("connector")))
            index.step_timing_available, index.step_timing_reason = available, reason


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
    ) -> None:
        self.name, self.server, self.gen, self.splitter, self.labels = name, server, gen, splitter, labels
        # The study's own processes on this host: this job (the load generator's main process) with
        # its descendants and ancestors, and the server's process group (it runs in its own session).
        # An external server (backend openai) on this host is found by its port: its CPU is the
        # server's, not contention.
        external = None if server.proc else _local_listener(server.url)
        self.study = HostStudy(os.getpid(), server.proc.pid if server.proc else None, external)

    def run(
        self,
        cell: Cell,
        staging: CellFiles,
        t0_ns: int,
        precision: PrecisionWatch,
        give_up: Callable[[], bool],
        waiting: Waiting,
    ) -> tuple[dict[str, Any], str | None]:
        threads = self._threads(staging)
        host = HostSampler(staging.host, self.study, METRICS_INTERVAL_S, self.gen.options.validity)
        # The samplers share the sending thread's GIL: with the load generator real-time, they are too.
        with (
            raised_process(self.gen.options.rt_priority) as priority,
            MetricsSampler(self.server.url, staging.metrics, METRICS_INTERVAL_S, waiting) as sampler,
            precision,
            threads,
        ):
            with host, ServerWatch(self.server, self.gen, sampler, f"{self.name}/{cell.key}") as watch:
                summary = self.gen.run_cell(cell, staging.folder, precision.enough, give_up)
        summary["rt_priority"]["process"] = priority.describe()
        summary["host"] = host.report()
        self.splitter.split(t0_ns, time.monotonic_ns(), staging.engine_step)
        # A dead load-generator worker lost the requests it held: the cell is redone, on a fresh pool.
        failure = watch.failure or (None if self.gen.pool.alive() else "a load generator worker died during the cell")
        return summary, failure

    def _threads(self, staging: CellFiles) -> Any:
        """Per-thread CPU time of the server's processes, sampled with the metrics, sliced per
        cell; nothing for an external server (backend openai)."""
        if self.server.proc is None:
            return contextlib.nullcontext()
        return ThreadSampler(self.server.proc.pid, staging.threads, METRICS_INTERVAL_S, self.labels)


def _thread_labels(raw: Any, backend: str) -> Callable[[], dict[str, str]]:
    """{tid: connector} of threads a connector's constructor started (vLLM's step-timing reports)."""
    if backend != "vllm":
        return dict
    return lambda: thread_labels(raw)


class VirtualRunner:
    """Virtual time: no server; the engine `ctax sim` would serve with computes each cell
    (oracle.virtual_run). A cell's `wall_s` is its virtual duration (what it would take on the
    modelled hardware), `compute_s` what computing it took here."""

    def __init__(self, config: dict[str, Any], variant: dict[str, Any]) -> None:
        self.config, self.variant = config, variant
        self.settings = resolve(config, variant, {})
        self.options = loadgen_options(config, "virtual:")

    def __enter__(self) -> VirtualRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @contextmanager
    def launch(self, index: PhaseIndex, save: Callable[[], None]) -> Iterator[VirtualRunner]:
        index.launch_command = None
        index.step_timing_available, index.step_timing_reason = True, None  # the engine model writes every step
        self.settings = resolve(self.config, self.variant, {}, _launch_seed(self.config, index))
        yield self

    def run(
        self,
        cell: Cell,
        staging: CellFiles,
        t0_ns: int,
        precision: PrecisionWatch,
        give_up: Callable[[], bool],
        waiting: Waiting,
    ) -> tuple[dict[str, Any], str | None]:
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
        summary["host"] = not_measured(VIRTUAL_HOST)
        return summary, None
