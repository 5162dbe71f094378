"""What a job asks of a cluster scheduler: its time limit and memory (its CPUs are its threads).

Snakemake's SLURM executor turns a rule's `resources:` into sbatch options: `runtime` (minutes)
into `-t`, `mem_mb` into `--mem`, `gpu` into `--gpus`, `threads:` into `--cpus-per-gpu` (or
`--cpus-per-task`). A phase job's time limit is `ctax plan`'s estimate of that job
(planning.time_estimate: the cells' rules, or a previous run's measured cells) times TIME_FACTOR plus
TIME_MARGIN_S: enough for a loaded node and a server relaunch, and a job that hangs is still
stopped by SLURM. Phase B's estimate is only exact once the reference rates exist; its jobs are
planned after that checkpoint, so they get it. Everything here can be overridden per rule
(`--set-resources phase_a_plain:runtime=600`), as on any Snakemake workflow.

Local runs ignore `runtime` and `mem_mb` (nothing enforces them there).
"""

from __future__ import annotations

import math

from connector_tax.config import ConfigError, StudyConfig
from connector_tax.planning.time_estimate import plan_study
from connector_tax.serving.server_process import ready_timeout_s

TIME_FACTOR = 1.5
TIME_MARGIN_S = 600.0
GATE_S = 300.0  # a gated vLLM configuration's verify script, beyond the server's start (preflight.run_gate)

# Host memory a job may use, MiB: the load generator's processes and the simulator take well
# under 1 GiB; vLLM's API server, engine core and worker stage the model through host memory
# (on a CPU host they hold the whole model and KV cache there).
MEM_MB = {"sim": 4096, "openai": 4096, "vllm": 65536, "vllm_cpu": 16384}


def _minutes(seconds: float) -> int:
    return math.ceil((seconds * TIME_FACTOR + TIME_MARGIN_S) / 60.0)


def phase_runtime_min(study: StudyConfig, name: str, stage: str) -> int:
    """A phase job's time limit in minutes: ctax plan's estimate of the job, with the margin."""
    estimates, _ = plan_study(study)
    seconds = next(e.seconds for e in estimates if e.stage == stage and e.variant == name)
    return _minutes(seconds)


def preflight_runtime_min(study: StudyConfig, name: str) -> int:
    """A preflight job's: its server's start-up bound, a gate's verify script, one request."""
    ready = ready_timeout_s(study, study.variant(name))
    return _minutes(ready + (GATE_S if study.backend == "vllm" else 0.0))


def job_mem_mb(study: StudyConfig) -> int:
    if study.backend == "vllm":
        return MEM_MB["vllm_cpu" if study.device == "cpu" else "vllm"]
    return MEM_MB[study.backend]


def gpus_per_job(study: StudyConfig, asked: object = None) -> int:
    """GPUs each phase and preflight job holds: one for vLLM on GPUs, none otherwise, unless
    asked (`--config gpus_per_job=N`, 0 or 1): a simulated study may ask one per job to rehearse
    a GPU cluster's placement. ConfigError naming the key for anything else."""
    needs = 1 if study.backend == "vllm" and study.device != "cpu" else 0
    if asked is None:
        return 1 if study.backend == "vllm" else 0
    if isinstance(asked, bool) or asked not in (0, 1):
        raise ConfigError("gpus_per_job", f"must be 0 or 1 (one GPU per job, or none), got {asked!r}")
    if asked < needs:
        raise ConfigError("gpus_per_job", "backend vllm on GPUs needs one GPU per job")
    return int(asked)
