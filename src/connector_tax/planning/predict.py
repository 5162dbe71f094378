"""`ctax plan --predict`: what a study will find about its own length, from the simulator.

The rules alone cannot say where Phase A's knees are or what ref_safe will be, and a study's
length hangs on both (a Phase B cell at 0.5 req/s needs 400 s for 200 requests, at 4 req/s
only its 60 s floor). The simulator's hardware profile models the study's server, so the
prediction runs the study itself in virtual time (sim.clock: virtual) in a scratch folder, as
far as it must: preflight, every configuration's Phase A, the reference rates, and every
configuration's Phase B (with its B'). Those cells' simulated lengths then stand in for what the
plan would otherwise guess (pruned cells cost nothing), and each Phase B tax gets its own paired
interval (resolution.py). The baseline's Phase B alone would set the other cells' lengths under a
fixed plan, but not where a saturated shape or a tax-precision plan (workload.precision.of tax)
lengthens one, nor their taxes' intervals: on the default study the baseline's cell against
itself put the 64x8 TTFT tax at ±35 pp, where the variants' paired taxes are ±25 to ±158. All of
Phase B costs the default study's plan 1-6 s more (21-22 -> 22-27 s on 2 cores, three rounds).

This is only as good as the profile: for a vLLM study the config must name its server's
profile (sim.hardware_profile, a hand-set one; or sim.profile, or `ctax plan --profile FILE`, a
profile `ctax calibrate` fitted on that server), or there is nothing to predict from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from connector_tax import resources
from connector_tax.config import PHASE_B, StudyConfig
from connector_tax.contract import StudyLayout

_SNAKEFILE = resources.path("workflow/Snakefile")


def predictable(study: StudyConfig, named_profile: bool) -> str | None:
    """Why the simulator cannot predict this study, or None if it can."""
    if study.backend == "openai":
        return "an external server: the simulator does not model it"
    if study.backend == "vllm" and not named_profile:
        return "the config names no sim.hardware_profile or sim.profile for its server (or give --profile FILE)"
    return None


def predict(study: StudyConfig, workdir: Path, timeout_s: float = 3600) -> StudyLayout:
    """Compute the study's Phase A and Phase B in virtual time under `workdir`;
    returns the layout of those results. Raises RuntimeError with the log's tail on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(study.virtual(), sort_keys=False), encoding="utf-8")
    layout = StudyLayout(workdir / "results" / study.study)
    targets = [f"results/{study.study}/{name}/{PHASE_B}/run.json" for name in study.names]
    # Virtual time measures nothing on this host, so its jobs (one core each, planning.time_estimate.job_threads)
    # run side by side on every core this process may use: the H20 config's plan took 231-246 s on
    # 2 cores against 371-397 s one at a time, the same plan (docs/performance.md).
    cores = str(len(os.sched_getaffinity(0)))
    argv = [sys.executable, "-m", "snakemake", "-s", str(_SNAKEFILE), "--cores", cores, "--quiet", "all"]
    argv += ["--configfile", str(path), "--directory", str(workdir), *targets]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError("the virtual-time prediction failed: " + " | ".join(tail))
    return layout
