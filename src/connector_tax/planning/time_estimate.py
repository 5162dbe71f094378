"""`ctax plan`: a study's cells and what they will cost, before anything runs.

Per cell: its warm-up, then max(duration floor, the time to reach min-completed at its rate),
then the drain (the last request's end-to-end latency, unloaded, from the simulator's hardware
profile), plus the cell's fixed costs (metrics, seal). Per launch: the server's start-up (the
simulator's is measured in seconds, vLLM's in minutes) and the load generator's. Where a
previous run of the same study left sealed cells, their measured wall time replaces the
estimate, and their launches' start-up is measured too. Phase B's rate and Phase A's knees are
only known after Phase A: without a previous run, Phase B is estimated at the middle Phase A
rate, Phase B' as if it runs and no rate is assumed pruned (an upper bound), and the output says
so. A job costs its own time besides (Overheads.job_s; a vLLM Phase A launch samples its idle server),
and the simulator's study its analysis, figures and report (Overheads.other_s).

With a calibrated profile (`ctax plan --profile FILE`, or the config's `sim.profile`) a vLLM
study's launches take the times that profile's own study measured on its host (Timing: a
preflight, a phase job besides its cells, the rest of `snakemake all`), not OVERHEADS'.

GPU-hours are the sum of the phase jobs' (and gated preflights') times, each job holding one
GPU; the wall time on N GPUs is the makespan of the phase jobs started in their seeded launch order.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from dataclasses import dataclass
from typing import Any

from connector_tax.config import (
    PHASE_A,
    PHASE_B,
    Cell,
    StudyConfig,
    launch_label,
    launch_order,
    phase_a_cells,
    phase_b_cells,
)
from connector_tax.config.profile import read_profile
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import PRUNED, read_index, read_summary
from connector_tax.launch.verify_scripts import preflight_check
from connector_tax.metrics.threads import IDLE_WINDOW_S
from connector_tax.serving import topology
from connector_tax.sim.profiles import HardwareProfile, hardware_profile


@dataclass(frozen=True)
class Overheads:
    """A backend's costs besides its cells' wall time, seconds, when no calibrated profile or
    --launch-s gives this host's (a previous run's measured cells replace only the cells)."""

    launch_s: float  # a server's start-up (vLLM: model load, CUDA graphs)
    job_s: float  # a job's own: the process and its imports, GPU/CPU leases, the server's stop, the index
    cell_s: float  # a cell's besides its wall time: sampler start/stop, step slice, seal, index
    checks_s: float  # a preflight's requests and probes once its server is ready
    other_s: float  # the rest of `snakemake all`: config, reference rates, analysis, figures, report, manifest


# vLLM: job_s as the 8-GPU rehearsal measured it (docs/gpu-host.md); its analysis is not counted
# (a calibrated profile's Timing.other_s measures it). The simulator: the default study's jobs as
# Snakemake's benchmark records timed them (docs/performance.md): 0.9 s a preflight, 1.7 s a phase
# job besides its three cells, 14 s for the rest.
OVERHEADS = {
    "vllm": Overheads(launch_s=150.0, job_s=3.0, cell_s=1.5, checks_s=2.0, other_s=0.0),
    "openai": Overheads(launch_s=1.0, job_s=3.0, cell_s=1.5, checks_s=2.0, other_s=0.0),
    "sim": Overheads(launch_s=0.45, job_s=0.9, cell_s=0.1, checks_s=0.0, other_s=14.0),
}
# vLLM on a CPU: the tiny model's ~24 s a launch (its API server, engine core and worker each
# import torch and vLLM in turn: docs/connectors-cpu.md).
LAUNCH_S_VLLM_CPU = 24.0


def default_launch_s(study: StudyConfig) -> float:
    """The start-up a plan assumes per launch when neither a calibrated profile nor --launch-s gives one."""
    return LAUNCH_S_VLLM_CPU if vllm_on_cpu(study) else OVERHEADS[study.backend].launch_s


def vllm_on_cpu(study: StudyConfig) -> bool:
    return study.backend == "vllm" and study.device == "cpu"


def holds_no_gpu(study: StudyConfig) -> bool:
    """vLLM's CPU build, or no vLLM at all: the study's jobs hold no GPU."""
    return study.backend != "vllm" or vllm_on_cpu(study)


@dataclass(frozen=True)
class Timing:
    """What a calibrated profile measured of its own study's jobs on its host (seconds), used in
    place of OVERHEADS: a preflight that launches, one that ended SKIP, a phase job's time around
    its cells, a phase job of a SKIPped variant, and everything else of `snakemake all` (config,
    reference, analysis, figures, report, manifest, Snakemake's own time)."""

    preflight_s: float
    preflight_skip_s: float
    phase_overhead_s: float
    phase_skip_s: float
    other_s: float
    skipped: frozenset[str] = frozenset()  # variants that were SKIP in the calibration study
    source: str = ""

    @classmethod
    def from_profile(cls, timing: dict[str, Any], source: str) -> Timing | None:
        try:
            return cls(
                preflight_s=float(timing["preflight_s"]),
                preflight_skip_s=float(timing.get("preflight_skip_s", timing["preflight_s"])),
                phase_overhead_s=float(timing["phase_overhead_s"]),
                phase_skip_s=float(timing.get("phase_skip_s", 5.0)),
                other_s=float(timing.get("other_s", 0.0)),
                skipped=frozenset(timing.get("skipped") or ()),
                source=source,
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class Estimate:
    stage: str
    variant: str
    cells: int
    seconds: float
    measured: int = 0  # cells whose time comes from a previous run


def _unloaded_e2e_s(study: StudyConfig, shape: dict[str, Any]) -> float:
    """The simulator's profile: a prefill step per chunk of the prompt, then one step per token."""
    sim = study.sim
    if sim.get("profile"):
        hw = HardwareProfile(**{**read_profile(sim["profile"]).hardware, **(sim.get("hardware") or {})})
    else:
        hw = hardware_profile(sim["hardware_profile"], sim.get("hardware"))
    entries = shape.get("mix") or shape.get("pattern") or [shape]
    inp = max(e["input"] for e in entries)
    out = max(e["output"] for e in entries)
    chunk: int = study.server["max_num_batched_tokens"]
    prefill = -(-inp // chunk) * hw.step_base_us + inp * hw.prefill_token_us
    decode = out * (hw.step_base_us + hw.decode_seq_us)
    return float(prefill + decode) / 1e6


def _job_fixed_s(study: StudyConfig, stage: str) -> float:
    """A job's time besides its launch and cells: a preflight's checks; the job's own (none in
    virtual time, where nothing launches); a vLLM Phase A launch's idle window."""
    costs = OVERHEADS[study.backend]
    checks = costs.checks_s if stage == "preflight" else 0.0
    if study.virtual_clock:
        return checks
    idle = IDLE_WINDOW_S if study.backend == "vllm" and stage == PHASE_A else 0.0
    return checks + costs.job_s + idle


def cell_seconds(study: StudyConfig, cell: Cell) -> float:
    issue = max(cell.duration_s, cell.min_completed / cell.rps)
    return cell.warmup_s + issue + _unloaded_e2e_s(study, cell.shape) + OVERHEADS[study.backend].cell_s


def _measured(study: StudyConfig, layout: StudyLayout, name: str, cell: Cell) -> float | None:
    """The cell's time in an earlier run of the study: its sealed wall time, 0 if it was pruned."""
    folder = layout.phase(name, cell.phase, cell.replicate)
    summary = read_summary(folder.cell(cell.label))
    if summary is not None and summary.complete and summary.wall_s is not None:
        return summary.wall_s + OVERHEADS[study.backend].cell_s
    index = read_index(folder.index)
    entry = index.cell(cell.phase, cell.label) if index is not None else None
    return 0.0 if entry is not None and entry.status == PRUNED else None


def baseline(study: StudyConfig) -> str:
    """The configuration taxes are measured against (the analysis's default)."""
    return study.baseline


def _reference(layout: StudyLayout, study: StudyConfig) -> tuple[dict[str, Any], str | None]:
    try:
        return json.loads(layout.reference_rates.read_text(encoding="utf-8")), None
    except (OSError, ValueError):
        rates = sorted(study.workload.phase_a.rates)
        mid, top = rates[len(rates) // 2], rates[-1]
        # An upper bound, as for the knees: Phase B' counted (it runs only where ref_load differs
        # from ref_safe), at the top Phase A rate.
        return (
            {"ref_safe": mid, "ref_load": top},
            f"no reference_rates.json yet: Phase B estimated at {mid:g} req/s, the middle of Phase A's rates "
            f"({', '.join(f'{r:g}' for r in rates)}{'; the upper of the two middle ones' if len(rates) % 2 == 0 else ''})"
            + (f", Phase B' at the top one ({top:g} req/s) as if it runs" if study.workload.phase_b_prime else ""),
        )


def plan_study(
    study: StudyConfig,
    layout: StudyLayout | None = None,
    timing: Timing | None = None,
    launch_s: float | None = None,
) -> tuple[list[Estimate], list[str]]:
    """`layout`: where earlier (or predicted, predict.py) cells of the study are; default its results folder.
    `timing`: a calibrated profile's measured job times (else OVERHEADS per launch, or `launch_s`:
    a launch's start-up as timed on the host, `ctax plan --launch-s`)."""
    layout = layout or StudyLayout.of(study.study)
    reference, note = _reference(layout, study)
    notes = [note] if note else []
    launch = 0.0 if study.virtual_clock else default_launch_s(study) if launch_s is None else launch_s
    if timing is None and launch_s is None and not study.virtual_clock:
        what = {
            "sim": "the simulator's",
            "openai": "an external server's readiness check",
            "vllm": "vLLM's CPU build with the tiny model, measured" if vllm_on_cpu(study) else "a GPU's model load",
        }[study.backend]
        notes.append(f"each server launch's start-up assumed {launch:g} s ({what}; --launch-s gives this host's)")
    base = baseline(study)
    out = []
    if timing is not None:
        notes.append(
            f"job times measured by the calibration study ({timing.source}): a launching preflight "
            f"{timing.preflight_s:.0f} s, a phase job {timing.phase_overhead_s:.0f} s besides its cells"
            + (
                f"; {', '.join(sorted(timing.skipped))} assumed SKIP as there"
                if timing.skipped & set(study.names)
                else ""
            )
        )
    for name in study.names:
        replicates = range(1, study.workload.replicates + 1)
        if timing is not None and name in timing.skipped:
            out.append(Estimate("preflight", name, 0, timing.preflight_skip_s))
            out += [
                Estimate(stage, launch_label(name, r), 0, timing.phase_skip_s)
                for r in replicates
                for stage in (PHASE_A, PHASE_B)
            ]
            continue
        if timing is not None:
            launch = timing.phase_overhead_s
        if study.preflight_gated_only and preflight_check(study.variant(name)) is None:
            # no readiness launch of its own: the library probe only, about what a SKIP costs
            pre = timing.preflight_skip_s if timing else _job_fixed_s(study, "preflight")
        else:
            pre = timing.preflight_s if timing else launch + _job_fixed_s(study, "preflight")
        out.append(Estimate("preflight", name, 0, pre))
        for replicate in replicates:
            who = launch_label(name, replicate)
            for stage, cells in (
                (PHASE_A, phase_a_cells(study, replicate, name)),
                (PHASE_B, phase_b_cells(study, name, reference, replicate)),
            ):
                # A calibrated profile's phase overhead is the whole job's time around its cells.
                seconds, measured = launch + (0.0 if timing is not None else _job_fixed_s(study, stage)), 0
                for cell in cells:
                    # An earlier (or predicted) cell of the same launch, else the first launch's (a
                    # replicate takes as long), else the baseline's for Phase B (the same shape and
                    # rate): the stand-ins for what is not measured yet.
                    took = _measured(study, layout, name, cell)
                    if took is None and replicate > 1:
                        took = _measured(study, layout, name, dataclasses.replace(cell, replicate=1))
                    if took is None and stage == PHASE_B:
                        took = _measured(study, layout, base, dataclasses.replace(cell, replicate=1))
                    measured += took is not None
                    seconds += took if took is not None else cell_seconds(study, cell)
                out.append(Estimate(stage, who, len(cells), seconds, measured))
    if study.workload.phase_a.prune_after_knee and not any(e.measured for e in out):
        notes.append(
            "no rate assumed pruned: knees are found while Phase A runs (an upper bound on Phase A; "
            "not on Phase B, whose cells run longer if Phase A finds a lower ref_safe)"
        )
    other = timing.other_s if timing is not None else OVERHEADS[study.backend].other_s
    if other:
        out.append(Estimate("other", "(study)", 0, other))
    return out, notes


def gpu_seconds(study: StudyConfig, estimates: list[Estimate]) -> float:
    """Phase jobs, and preflights where they launch a real server, each holding one GPU."""
    jobs = sum(e.seconds for e in estimates if e.stage in (PHASE_A, PHASE_B))
    if holds_no_gpu(study):
        return 0.0
    return jobs + sum(e.seconds for e in estimates if e.stage == "preflight")


def as_dict(
    study: StudyConfig, estimates: list[Estimate], notes: list[str], gpus: int = 1, config_path: str = "CONFIG"
) -> dict[str, Any]:
    by_stage: dict[str, float] = {}
    for e in estimates:
        by_stage[e.stage] = by_stage.get(e.stage, 0.0) + e.seconds
    return {
        "study": study.study,
        "backend": study.backend,
        "stages_s": {k: round(v, 1) for k, v in by_stage.items()},
        "total_s": round(sum(by_stage.values()), 1),
        "gpu_hours": None if holds_no_gpu(study) else round(gpu_seconds(study, estimates) / 3600, 3),
        "jobs": [dataclasses.asdict(e) for e in estimates],
        "command": run_command(study, config_path, gpus),
        "jobs_at_once": jobs_at_once(study, gpus),
        "wall_s": round(wall_seconds(study, estimates, jobs_at_once(study, gpus)), 1),
        "notes": notes,
    }


def makespan(jobs: list[float], slots: int) -> float:
    """Snakemake's schedule: jobs started in the given (priority) order, each on the first slot free."""
    loads = [0.0] * max(1, slots)
    for job in jobs:
        heapq.heapreplace(loads, loads[0] + job)
    return max(loads)


def jobs_at_once(study: StudyConfig, gpus: int) -> int:
    """How many phase jobs run side by side under run_command's command: one per GPU (a vLLM
    study on a CPU keeps every core, so one at a time)."""
    if vllm_on_cpu(study):
        return 1
    return max(1, gpus)


def run_command(study: StudyConfig, config_path: str, gpus: int) -> str:
    """The snakemake command that runs `gpus` phase jobs side by side: `--cores` is what that many
    jobs' threads add up to (Snakemake starts a job only when its threads fit in what is left of
    --cores), `--resources gpu` bounds the GPU jobs. One job at a time is `--cores 1`, the README's
    command: Snakemake then gives the job one thread, which changes nothing (a job leases CPUs
    only beside others), and a 2-CPU host is not told to use 3. The target comes first:
    --resources takes every word up to the next option, so a target after it is read as a
    resource (snakemake 9: "ValueError: dictionary update sequence element")."""
    n = jobs_at_once(study, gpus)
    cores = n * job_threads(study) if n > 1 else 1
    on_gpus = not holds_no_gpu(study)
    return (
        f"snakemake all --cores {cores}" + (f" --resources gpu={n}" if on_gpus else "") + f" --configfile {config_path}"
    )


def wall_seconds(study: StudyConfig, estimates: list[Estimate], slots: int) -> float:
    """The study's wall time with `slots` jobs at once: every preflight, then Phase A, then Phase
    B (the reference rates come between), each phase's jobs in their seeded launch order."""
    seconds = {(e.stage, e.variant): e.seconds for e in estimates}
    pre = makespan([e.seconds for e in estimates if e.stage == "preflight"], slots)
    phases = sum(
        makespan([seconds.get((phase, launch_label(n, r)), 0.0) for n, r in launch_order(study, phase)], slots)
        for phase in (PHASE_A, PHASE_B)
    )
    return pre + phases + sum(e.seconds for e in estimates if e.stage == "other")


def _span(seconds: float, by_stage: dict[str, float]) -> str:
    """Hours where a study takes hours, minutes where it takes minutes (a simulated study's
    preflights take seconds: 0.00 h said nothing)."""
    return f"{seconds / 3600:.2f} h" if sum(by_stage.values()) >= 3600 else f"{seconds / 60:.1f} min"


def render(
    study: StudyConfig, estimates: list[Estimate], notes: list[str], gpus: int, config_path: str = "CONFIG"
) -> str:
    lines = [f"plan of study '{study.study}' (backend {study.backend}, {len(study.variants)} configurations)", ""]
    lines.append(f"{'stage':10} {'variant':26} {'cells':>5} {'minutes':>8}  measured")
    for e in estimates:
        lines.append(f"{e.stage:10} {e.variant:26} {e.cells:5d} {e.seconds / 60:8.1f}  {e.measured or ''}")
    by_stage: dict[str, float] = {}
    for e in estimates:
        by_stage[e.stage] = by_stage.get(e.stage, 0.0) + e.seconds
    lines += [
        "",
        "per stage, one job at a time: " + ", ".join(f"{s} {_span(v, by_stage)}" for s, v in by_stage.items()),
    ]
    gpu_s = gpu_seconds(study, estimates)
    serial = sum(by_stage.values())
    held = {"vllm": "vLLM on CPU", "sim": "simulated", "openai": "an external server"}[study.backend]
    gpu_hours = f"no GPU held ({held})" if holds_no_gpu(study) else f"{gpu_s / 3600:.2f} GPU-hours"
    lines.append(f"total {serial / 3600:.2f} h ({serial / 60:.1f} min) one job at a time; {gpu_hours}")
    n = jobs_at_once(study, gpus)
    wall = wall_seconds(study, estimates, n)
    threads = job_threads(study)
    each = f"{threads} thread{'s' if threads > 1 else ''} each"
    lines += ["", f"run it with {n} phase jobs side by side ({each}):" if n > 1 else "run it one phase job at a time:"]
    lines += [f"  {run_command(study, config_path, gpus)}"]
    lines.append(f"wall clock with that command: {wall / 3600:.2f} h ({wall / 60:.1f} min)")
    cpus = len(topology.leasable_cpus())
    if n > 1 and n * job_threads(study) > cpus:
        lines.append(
            f"note: this host has {cpus} CPUs; the command's jobs lease {n * job_threads(study)} "
            "(serving.cpus): run it where they exist, or jobs wait for CPUs"
        )
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def job_threads(study: StudyConfig) -> int:
    """CPUs a phase job keeps busy: the load generator's main process and workers, and the
    server (one core for the simulator, four for vLLM's API server, engine core and worker on
    a GPU host; on a CPU host vLLM computes on every core it may use). A study in virtual time
    launches neither: its job computes each cell in its own process, on one core, so jobs run
    side by side as cores allow (`ctax plan --predict`)."""
    if study.virtual_clock:
        return 1
    loadgen = 1 + study.loadgen.workers
    if study.backend != "vllm":
        return loadgen + 1
    return (os.cpu_count() or 1) if study.device == "cpu" else loadgen + 4
