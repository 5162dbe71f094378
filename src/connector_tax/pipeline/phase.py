"""One configuration's phase: plan its cells, reuse what provably belongs, measure the rest.

Every planned cell has a fingerprint (contract.fingerprint). A cell is reused only when its
sealed files carry that fingerprint; anything else under its label is moved to superseded/
and the cell is measured again in one server launch (measure.loop). The launch's index,
run.json, lists every planned cell with its fingerprint, settings and state (complete, failed,
pending) and the launch's facts; it is written before the launch, after every cell and at the
end, whatever happened. Recorded outcomes (a preflight SKIP, a server that would not start or
died, a cell with no successful request) exit 0 so the study goes on with the other
configurations; they are listed in the manifest and the report, and redone on the next run.

    ctax pipeline phase --config results/STUDY/study_config.yaml --variant NAME --phase phase_a
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from connector_tax.atomic import write_atomic, write_json
from connector_tax.config import (
    PHASE_A,
    PHASE_B,
    PHASE_B_PRIME,
    Cell,
    StudyConfig,
    launch_label,
    launch_order,
    load_study,
)
from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import sha
from connector_tax.contract.index import COMPLETE, DONE, FAILED, IndexEntry, PhaseIndex, read_index, read_summary
from connector_tax.contract.layout import CellFiles, PhaseLayout, now_iso, utc_stamp
from connector_tax.launch.provenance import env_text, lmcache_mode, mooncake_transport, served_by
from connector_tax.measure.cellplan import CellPlan, LaunchPlan, digest_of, launch_plan, read_reference
from connector_tax.measure.loop import Policies, ServerDied, Suspect, measure
from connector_tax.measure.prune import knee, overloaded_shape, ttft_growth_only
from connector_tax.measure.resume import decide
from connector_tax.measure.runners import ServerRunner, VirtualRunner
from connector_tax.serving.lifecycle import AncestorWatch, exclusive_lock, lock_holder, stop_on_signals, stop_requested
from connector_tax.serving.server_process import ServerStartError
from connector_tax.serving.slurm import adopt, placement_record

# Facts of a server launch (not settings). A run that launches nothing (every cell reused, or the
# only cells left pruned) carries them over from the last launch, which measured the cells it
# reuses. They are kept in launch.json: Snakemake deletes a job's output, run.json, before it
# re-runs the job (--forcerun, a touched input), so run.json alone would lose them.
_CARRIED = (
    "launch_command",
    "server_cpus",
    "gpu",
    "step_timing_available",
    "step_timing_reason",
    "workarounds",
    "interventions",
    "interventions_seen",
    "server_env",
    "idle_threads",
    "sidecars",
)


def _settings_of(index: PhaseIndex) -> str:
    """Every cell's fingerprint holds these: cells reused now were measured by a launch of them."""
    return sha({"launch": index.launch, "code": index.code})


def _keep_launch_facts(folder: PhaseLayout, index: PhaseIndex) -> None:
    facts = {key: getattr(index, key) for key in _CARRIED}
    write_json(folder.launch_json, {"launch_id": index.launch_id, "settings": _settings_of(index), **facts})


def _carry_launch_facts(folder: PhaseLayout, index: PhaseIndex, previous: PhaseIndex | None) -> None:
    """The last launch's facts, from launch.json (or, for results older than it, a run.json that
    is still there), if that launch ran with the current launch settings and code."""
    try:
        facts = json.loads(folder.launch_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        facts = None
    if not isinstance(facts, dict) and previous is not None:
        facts = {"settings": _settings_of(previous), **{key: getattr(previous, key) for key in _CARRIED}}
    if isinstance(facts, dict) and facts.get("settings") == _settings_of(index):
        for key in _CARRIED:
            setattr(index, key, facts.get(key, getattr(index, key)))


def preflight_reason(layout: StudyLayout, name: str, launch: str) -> str | None:
    """None if the configuration passed preflight with these launch settings (`launch`, their
    digest: measure.cellplan.launch_digest), else why it is skipped. An ok of other settings is
    none of this launch's: the phase job never starts on a verdict it cannot tie to its launch."""
    try:
        status = json.loads(layout.preflight_status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no preflight_status.json"
    entry = status.get(name) or {}
    if entry.get("status") != "ok":
        return f"preflight SKIP: {entry.get('reason') or 'not in preflight_status.json'}"
    if entry.get("launch") != launch:
        checked = entry.get("launch") or "none named"
        return f"preflight ok is for other launch settings (checked {checked}, this launch {launch}): run the preflight again"
    return None


def _final_status(index: PhaseIndex) -> str:
    states = [c.status for c in index.cells]
    if all(s in DONE for s in states):
        return "ok"
    if any(s == COMPLETE for s in states):
        return "partial"
    return "failed"


def policies(layout: StudyLayout, study: StudyConfig, name: str, plan: LaunchPlan, index: PhaseIndex) -> Policies:
    """The study's policies for one launch's cells: its saturation and validity settings, Phase A
    pruning past the knee and Phase B' on saturated shapes, pairing with the baseline, and a
    second look at a knee that criterion 3 alone would make."""
    return Policies(
        study.saturation,
        study.validity,
        prune=_pruner(layout, study, name, plan, index),
        pair_with=_pairer(layout, study),
        suspect=_suspect(layout, study, name, plan, index),
    )


def _pruner(
    layout: StudyLayout, study: StudyConfig, name: str, plan: LaunchPlan, index: PhaseIndex
) -> Callable[[CellPlan], str | None]:
    """Why a cell about to be measured is not worth it (prune.py): Phase A past the knee of the
    complete cells below it; Phase B' on a shape saturated in Phase B."""

    def complete(p: CellPlan) -> bool:
        return (index.cell(p.cell.phase, p.cell.label) or IndexEntry("", "", "", {})).status == COMPLETE

    def check(planned: CellPlan) -> str | None:
        if planned.cell.phase == PHASE_A:
            return knee(layout, study, name, [p for p in plan.cells if p.cell.rps < planned.cell.rps and complete(p)])
        if planned.cell.phase == PHASE_B_PRIME:
            shape = next(
                (p for p in plan.cells if p.cell.phase == PHASE_B and p.cell.label == planned.cell.label), None
            )
            return overloaded_shape(layout, study, name, shape) if shape is not None and complete(shape) else None
        return None

    return check


def _pairer(layout: StudyLayout, study: StudyConfig) -> Callable[[Cell], Path | None]:
    """The baseline's sealed requests a cell that stops on its taxes is paired with: its cell of
    the same phase, label and replicate, if complete (else None: the cell stops on its p90s)."""

    def pair_with(cell: Cell) -> Path | None:
        if cell.precision_of != "tax":
            return None
        files = layout.phase(study.baseline, cell.phase, cell.replicate).cell(cell.label)
        summary = read_summary(files)
        return files.requests if summary is not None and summary.complete and files.requests.is_file() else None

    return pair_with


def _suspect(layout: StudyLayout, study: StudyConfig, name: str, plan: LaunchPlan, index: PhaseIndex) -> Suspect:
    """Why a valid Phase A attempt must be measured once more (prune.ttft_growth_only)."""

    def check(planned: CellPlan, files: CellFiles) -> str | None:
        if planned.cell.phase != PHASE_A:
            return None
        done = [
            p
            for p in plan.cells
            if p.cell.phase == PHASE_A
            and p.cell.rps < planned.cell.rps
            and (index.cell(p.cell.phase, p.cell.label) or IndexEntry("", "", "", {})).status == COMPLETE
        ]
        return ttft_growth_only(layout, study, name, planned, files, done)

    return check


def run_phase(
    study: StudyConfig, name: str, launch_phase: str, cpus: int | None = None, replicate: int = 1
) -> PhaseIndex:
    """One launch of variant `name` for `launch_phase`: plan its cells, reuse those already sealed,
    measure the rest by the study's policies, and keep its index. cpus: lease that many CPUs of the
    host for this job (it has neighbours), near its GPU, once it launches a server
    (runners.ServerRunner); None: use all. replicate: which of the study's workload.replicates
    launches of this variant and phase."""
    variant = study.variant(name)
    if not 1 <= replicate <= study.workload.replicates:
        raise ValueError(f"--replicate {replicate}: the study has workload.replicates {study.workload.replicates}")
    layout = StudyLayout.of(study.study)
    folder = layout.phase(name, launch_phase, replicate)
    folder.folder.mkdir(parents=True, exist_ok=True)
    reference = read_reference(layout) if launch_phase == PHASE_B else None
    plan = launch_plan(str(study.source), study, name, launch_phase, reference, replicate)
    previous = read_index(folder.index)
    index = PhaseIndex(
        study=study.study,
        variant=name,
        phase=launch_phase,
        backend=study.backend,
        launch=plan.launch,
        code=plan.code,
        cells=[],
        launch_id=f"{utc_stamp()}-{os.getpid()}",
        started=now_iso(),
        run_order=[launch_label(n, r) for n, r in launch_order(study, launch_phase)],
        replicate=replicate,
        server_versions=plan.launch["server_versions"],
        placement=placement_record(),
        served_by=served_by(study, plan.launch["server_versions"]),
        mooncake_transport=mooncake_transport(study, variant),
        lmcache_mode=lmcache_mode(study, variant),
    )
    skip = preflight_reason(layout, name, digest_of(plan.launch))
    if skip:
        index.cells = [IndexEntry(p.cell.phase, p.cell.label, p.fingerprint, p.settings) for p in plan.cells]
        index.status, index.reason, index.finished = "skipped", skip, now_iso()
        index.write(folder.index)
        return index

    index.cells, index.superseded = decide(layout, plan)
    todo = [p for p, entry in zip(plan.cells, index.cells) if not entry.reused]
    if not todo:
        _carry_launch_facts(folder, index, previous)
        index.status, index.finished = _final_status(index), now_iso()
        index.write(folder.index)
        return index

    write_json(
        folder.config_json,
        {
            "study": study.study,
            "variant": variant.raw,
            "workload": study.raw["workload"],  # as the config has it: what a person compares
            "launch": plan.launch,
            "code": plan.code,
        },
    )
    write_atomic(folder.env_txt, env_text(study.backend, plan.launch["server_versions"]))
    index.write(folder.index)
    runner = VirtualRunner(study, variant) if study.virtual_clock else ServerRunner(study, variant, folder, cpus)
    try:
        measure(
            runner, layout, index, todo, lambda: index.write(folder.index), policies(layout, study, name, plan, index)
        )
    except (ServerStartError, ServerDied, OSError, RuntimeError, ValueError) as exc:
        if (signal_name := stop_requested()) is not None:  # under SLURM scancel's SIGTERM reaches the
            # server too: what failed on the way out is the stop, and the next run resumes the cells
            index.status, index.reason, index.finished = "interrupted", f"stopped by {signal_name} ({exc})", now_iso()
            index.write(folder.index)
            raise KeyboardInterrupt(signal_name) from exc
        index.reason = str(exc)
        for entry in index.cells:
            if entry.status == "pending":
                entry.reason = f"not measured: {exc}"
    except BaseException:
        index.status, index.reason, index.finished = "interrupted", "stopped by a signal or Ctrl-C", now_iso()
        index.write(folder.index)
        raise
    if index.launch_command is None:  # every cell left was pruned: no server launched
        _carry_launch_facts(folder, index, previous)
    else:
        _keep_launch_facts(folder, index)
    index.status, index.finished = _final_status(index), now_iso()
    if index.status != "ok" and index.reason is None:
        failed = [c for c in index.cells if c.status == FAILED]
        index.reason = "; ".join(f"{c.key}: {c.reason}" for c in failed[:3])
    index.write(folder.index)
    return index


def job(config: str, variant: str, phase: str, replicate: int, cpus: int, placement: str) -> int:
    """The phase rule's job: launch `replicate` of `variant`'s `phase` measured, under its lock,
    with job.json written once it ends with a recorded outcome. `cpus` 0 leases all of them."""
    stop_on_signals()
    try:
        adopt(placement)
    except RuntimeError as exc:
        _say(f"{variant} {phase}: {exc}")
        return 2
    study = load_study(config)
    who = launch_label(variant, replicate)
    if not 1 <= replicate <= study.workload.replicates:
        _say(f"ctax pipeline phase: argument --replicate: {replicate} is not in 1..{study.workload.replicates}")
        return 2
    study.variant(variant)  # ConfigError naming the variant, before anything is locked
    layout = StudyLayout.of(study.study)
    lock_path = layout.phase(variant, phase, replicate).lock
    lock = exclusive_lock(lock_path)
    if lock is None:
        _say(f"{who} {phase}: already being measured by {lock_holder(lock_path)}")
        return 1
    job_json = layout.job(variant, phase, replicate)
    try:
        job_json.unlink(missing_ok=True)  # an earlier job's: this one has not ended yet
        with AncestorWatch():
            index = run_phase(study, variant, phase, cpus or None, replicate)
        write_json(job_json, {"launch_id": index.launch_id, "status": index.status, "finished": index.finished})
    except KeyboardInterrupt as exc:
        _say(f"{who} {phase}: interrupted ({exc or 'SIGINT'}); the next run resumes it")
        return 130
    except OSError as exc:
        _say(f"{who} {phase}: stopped: {exc}; the next run resumes it")
        return 1
    finally:
        os.close(lock)
    reused = sum(c.reused for c in index.cells)
    _say(
        f"{who} {phase}: {index.status}, {len(index.cells)} cells ({reused} reused)"
        + (f" ({index.reason})" if index.reason else "")
    )
    return 0


def _say(line: str) -> None:
    """The job's outcome on stderr, which may be a pipe already closed by a signal."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
