"""`ctax pipeline STEP ...`: one step of the study as its Snakemake rule runs it (workflow/rules/),
the command a user types to run that step by hand. One parser per step, each with its Args; the
step itself is its pipeline/ module's `job` function, imported only when that step runs, so a
job pays for its own step's imports alone."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from connector_tax.arguments import number
from connector_tax.commands.namespace import runs
from connector_tax.config.cells import LAUNCH_PHASES
from connector_tax.serving.slurm import PLACEMENTS


@dataclass(frozen=True)
class StudyConfigArgs:
    """`ctax pipeline study-config`."""

    config: str


@dataclass(frozen=True)
class PreflightCheckArgs:
    """`ctax pipeline preflight check`."""

    config: str
    variant: str
    out: Path
    log_dir: Path
    placement: str


@dataclass(frozen=True)
class PreflightMergeArgs:
    """`ctax pipeline preflight merge`."""

    out: Path
    parts: list[Path]


@dataclass(frozen=True)
class PhaseArgs:
    """`ctax pipeline phase`."""

    config: str
    variant: str
    phase: str
    replicate: int
    cpus: int
    placement: str


@dataclass(frozen=True)
class ConfigArgs:
    """`ctax pipeline reference` and `ctax pipeline manifest`: the study config, nothing else."""

    config: str


def study_config(args: StudyConfigArgs) -> int:
    from connector_tax.pipeline.studyfolder import job

    return job(args.config)


def preflight_check(args: PreflightCheckArgs) -> int:
    from connector_tax.pipeline.preflight import check_job

    return check_job(args.config, args.variant, args.out, args.log_dir, args.placement)


def preflight_merge(args: PreflightMergeArgs) -> int:
    from connector_tax.pipeline.preflight import merge_job

    return merge_job(args.out, args.parts)


def phase(args: PhaseArgs) -> int:
    from connector_tax.pipeline.phase import job

    return job(args.config, args.variant, args.phase, args.replicate, args.cpus, args.placement)


def reference(args: ConfigArgs) -> int:
    from connector_tax.pipeline.reference import job

    return job(args.config)


def manifest(args: ConfigArgs) -> int:
    from connector_tax.pipeline.manifest import job

    return job(args.config)


def add_arguments(pipeline: argparse.ArgumentParser) -> None:
    steps = pipeline.add_subparsers(dest="step", required=True, metavar="STEP")

    step = steps.add_parser("study-config", help="write the validated study config and the study folder's stamp")
    step.add_argument("--config", required=True, help="the staged, validated config")
    runs(step, StudyConfigArgs, study_config)

    step = steps.add_parser("preflight", help="one variant's readiness (check), or merge the results")
    actions = step.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="readiness of one configuration")
    check.add_argument("--config", required=True)
    check.add_argument("--variant", required=True, metavar="NAME")
    check.add_argument("--out", required=True, type=Path)
    check.add_argument("--log-dir", required=True, type=Path)
    check.add_argument(
        "--placement", choices=PLACEMENTS, default="host", help="slurm: use this SLURM job's GPU, no lease"
    )
    runs(check, PreflightCheckArgs, preflight_check)
    merge = actions.add_parser("merge", help="merge per-configuration results")
    merge.add_argument("--out", required=True, type=Path)
    merge.add_argument("parts", nargs="+", type=Path)
    runs(merge, PreflightMergeArgs, preflight_merge)

    step = steps.add_parser("phase", help="one variant's phase: reuse what provably belongs, measure the rest")
    step.add_argument("--config", required=True)
    step.add_argument("--variant", required=True, metavar="NAME")
    step.add_argument("--phase", required=True, choices=list(LAUNCH_PHASES))
    step.add_argument(
        "--replicate",
        type=number(int, 1),
        default=1,
        metavar="K",
        help="which launch of workload.replicates (default 1)",
    )
    step.add_argument("--cpus", type=number(int, 0), default=0, help="lease this many CPUs (jobs side by side); 0: all")
    step.add_argument(
        "--placement", choices=PLACEMENTS, default="host", help="slurm: use this SLURM job's GPUs and CPUs, no lease"
    )
    runs(step, PhaseArgs, phase)

    step = steps.add_parser("reference", help="saturation of Phase A cells, then ref_safe and ref_load")
    step.add_argument("--config", required=True)
    runs(step, ConfigArgs, reference)

    step = steps.add_parser("manifest", help="MANIFEST.md and MANIFEST.tsv")
    step.add_argument("--config", required=True)
    runs(step, ConfigArgs, manifest)
