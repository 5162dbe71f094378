# Validate the config before any rule runs, and name what every stage shares. Every path comes
# from the study contract (connector_tax.contract): no rule builds a results path by hand.
import os
import shlex
import sys
from pathlib import Path

from connector_tax.config import ConfigError, StudyConfig, validate_config
from connector_tax.contract import StudyLayout
from connector_tax.config import LAUNCH_PHASES, PHASE_A, PHASE_B, launch_order
from connector_tax.contract.index import read_index
from connector_tax.measure.cellplan import launch_digest
from connector_tax.pipeline.jobs import describe_pending, job_params, study_outcome
from connector_tax.planning.time_estimate import job_threads
from connector_tax.planning.job_resources import gpus_per_job, job_mem_mb, phase_runtime_min, preflight_runtime_min
from connector_tax.pipeline.studyfolder import check_study_folder, claim_study, forward_stop_signals, stage_config
from connector_tax.serving.slurm import cancel_orphans

# gpus_per_job (--config gpus_per_job=1) is how jobs are placed, not a study setting: taken out
# before the study config is validated, staged and fingerprinted. With the simulator it makes each
# phase and preflight job ask the scheduler for a GPU as a vLLM study's do (a cluster rehearsal).
_GPUS_PER_JOB = config.pop("gpus_per_job", None)
try:
    _validated = validate_config(config)
    check_study_folder(StudyConfig.from_mapping(_validated))
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
config.clear()
config.update(_validated)
# The typed view every helper below takes (the mapping stays what Snakemake hashes and stages).
SETTINGS = StudyConfig.from_mapping(config)

STUDY = SETTINGS.study
STAGED_CONFIG = str(stage_config(SETTINGS))
LAYOUT = StudyLayout.of(STUDY)
RESULTS = str(LAYOUT.root)
VARIANTS = SETTINGS.names
STUDY_CONFIG = str(LAYOUT.study_config)
PREFLIGHT_STATUS = str(LAYOUT.preflight_status)
REFERENCE_RATES = str(LAYOUT.reference_rates)
# Every (variant, replicate) launch of a phase in its seeded, interleaved order (config.cells).
LAUNCH_ORDER = {phase: launch_order(SETTINGS, phase) for phase in LAUNCH_PHASES}
REPLICATES = range(1, SETTINGS.workload.replicates + 1)
# Each real-vLLM job holds one GPU (--resources gpu=N runs N side by side); the simulator none.
try:
    GPUS_PER_JOB = gpus_per_job(SETTINGS, _GPUS_PER_JOB)
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
# The CPUs a phase job keeps busy; with room for neighbours it leases its own (serving.cpus).
PHASE_THREADS = job_threads(SETTINGS)
# What a job asks of a cluster scheduler besides: memory and a time limit (planning.job_resources).
JOB_MEM_MB = job_mem_mb(SETTINGS)
# A job Snakemake's SLURM executor placed runs in a remote-mode snakemake inside its own SLURM
# job: it takes its GPU and CPUs from that allocation instead of leasing them (serving.slurm).
PLACEMENT = "slurm" if workflow.remote_exec and os.environ.get("SLURM_JOB_ID") else "host"
# Jobs run `ctax pipeline STEP`, the command a user can type: the one installed beside the
# interpreter snakemake runs under, or the conda environment's own under --sdm conda.
_CONDA = any(m.name == "CONDA" for m in workflow.deployment_settings.deployment_method)
_CTAX = Path(sys.executable).with_name("ctax")
CTAX = "ctax" if _CONDA or not _CTAX.exists() else shlex.quote(str(_CTAX))
ENV = "../../environment.yml"


def log_of(name):
    return str(LAYOUT.log(name))


def index_of(name, phase, replicate=1):
    return str(LAYOUT.index(name, phase, replicate))


def job_of(phase, name, replicate=1):
    """A phase job's name: phase_a_<variant>, and phase_a_<variant>_rep<k> for replicate k > 1."""
    return f"{phase}_{name}" if replicate == 1 else f"{phase}_{name}_rep{replicate}"


def paired_with(name, phase, replicate):
    """workload.precision.of tax: a variant's cells stop on their taxes, paired against the
    baseline's cells of the same replicate, so its phase job waits for the baseline's."""
    if not SETTINGS.workload.precision.on_tax or name == SETTINGS.baseline:
        return []
    return launch_outputs(SETTINGS.baseline, phase, replicate)


def launch_outputs(name, phase, replicate=1):
    """A phase job's outputs: run.json, and job.json, written only by a job that returned with
    an outcome (contract.layout). Both are asked for by what comes after the job, since Snakemake
    checks only the outputs a later job needs: a launch whose job was stopped runs again."""
    return [index_of(name, phase, replicate), str(LAYOUT.job(name, phase, replicate))]


def indexes_of(phase):
    """Every launch's run.json and job.json of a phase (all variants, all replicates)."""
    return [path for name in VARIANTS for r in REPLICATES for path in launch_outputs(name, phase, r)]


# What the existing results lack, before anything runs (a dry run shows it too); once, in the
# main process (a `run:` job re-reads this file in a subprocess).
if workflow.is_main_process:
    for _line in describe_pending(STUDY_CONFIG, SETTINGS):
        print(f"connector-tax: {_line}", file=sys.stderr)


def reference_rates_checkpoint(wildcards):
    """Phase B runs at the reference rates: its jobs exist once the checkpoint has run."""
    return checkpoints.reference.get().output[0]


def reference_input(phase):
    """A Phase B job waits for the reference checkpoint; a Phase A job has nothing to wait for."""
    return reference_rates_checkpoint if phase == PHASE_B else []


def phase_plan(name, phase, replicate):
    """A phase job's params.plan (its cells and their fingerprints); Phase B's computed once the
    reference rates exist."""
    if phase == PHASE_B:
        return lambda wildcards, input: job_params(STUDY_CONFIG, SETTINGS, name, PHASE_B, replicate)
    return job_params(STUDY_CONFIG, SETTINGS, name, phase, replicate)


def lease_cpus(wildcards, threads):
    """A phase job leases its CPUs only when others may run beside it (--cores > its threads)."""
    try:
        cores = workflow.cores
    except Exception:  # snakemake --report and --dag ask for params without --cores
        return 0
    return threads if threads < cores else 0


def phase_runtime(name, phase):
    """A phase job's time limit, minutes (ctax plan's estimate and a margin); Phase B's is planned
    once the reference rates exist, as its cells are."""
    return lambda wildcards: phase_runtime_min(SETTINGS, name, phase)


def study_dir(wildcards, input):
    """results/<study>, from a rule's study_config.yaml input."""
    return os.path.dirname(input.config)

