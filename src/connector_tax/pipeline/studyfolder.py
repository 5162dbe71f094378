"""The study's validated config on disk, and one backend per study folder.

The Snakefile validates the config (file + --config) when it loads and stages it under
.snakemake/connector-tax/ — rewritten only when its content changes, so its modification time
says when the study's settings last changed. The `study_config` rule copies it to
results/<study>/study_config.yaml, the file every job reads.

While a run executes, its snakemake process holds results/<study>/.study.lock (flock): a second
run on the same study stops with one line naming the first, and the kernel releases the lock
when the holder dies. That run also turns SIGTERM and SIGHUP into a stop of every running job
(as Ctrl-C does): Snakemake alone would wait for jobs that may run for an hour.

`results/<study>/study.json` records the study name and backend of the first run that wrote
there. A later run of the same study name on another backend (a simulated run of the real
study's config, say) is refused before anything starts: its cells would otherwise be measured
into the same folders as, and compared with, results of a different kind.

    ctax pipeline study-config --config .snakemake/connector-tax/STUDY.yaml
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType

import psutil
import yaml

from connector_tax.atomic import write_atomic, write_json
from connector_tax.config import ConfigError, StudyConfig, load_study
from connector_tax.contract import StudyLayout
from connector_tax.serving.lifecycle import exclusive_lock, lock_holder


def staged_config(study: str) -> Path:
    return Path(".snakemake") / "connector-tax" / f"{study}.yaml"


def stage_config(study: StudyConfig) -> Path:
    """Write the validated config where the study_config rule reads it, if it changed."""
    path = staged_config(study.study)
    text = yaml.safe_dump(dict(study.raw), sort_keys=False)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    write_atomic(path, text)
    return path


def check_study_folder(study: StudyConfig) -> None:
    """Raise ConfigError (one line) if results/<study> holds another backend's results."""
    layout = StudyLayout.of(study.study)
    try:
        stamp = json.loads(layout.stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if stamp.get("backend") != study.backend:
        raise ConfigError(
            "backend",
            f"{layout.root} holds backend {stamp.get('backend')} results and this run is backend "
            f"{study.backend}: give it its own study name (e.g. --config study={study.study}-{study.backend})",
        )


_held: dict[str, int] = {}


def claim_study(study: StudyConfig) -> None:
    """Hold the study's lock for the life of this process, or exit with the holder named."""
    layout = StudyLayout.of(study.study)
    fd = exclusive_lock(layout.lock)
    if fd is None:
        sys.exit(
            f"connector-tax: {layout.root} is being run by {lock_holder(layout.lock)}; "
            "wait for it, or stop it, then run again"
        )
    _held[study.study] = fd


def _stop_jobs(signum: int, frame: FrameType | None) -> None:
    """Our running jobs stop now (each leaves its launch resumable), then Snakemake unwinds as
    on Ctrl-C."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if is_pipeline_job(proc.cmdline()):
                proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def is_pipeline_job(cmdline: list[str]) -> bool:
    """`ctax pipeline STEP ...` (the rules' jobs), not their servers or load-generator workers."""
    return any(Path(part).name == "ctax" for part in cmdline[:2]) and "pipeline" in cmdline[1:3]


def forward_stop_signals() -> None:
    """In snakemake's main thread, once its scheduler exists (onstart)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_jobs)


def write_study_config(study: StudyConfig) -> None:
    layout = StudyLayout.of(study.study)
    check_study_folder(study)
    write_atomic(layout.study_config, yaml.safe_dump(dict(study.raw), sort_keys=False))
    write_json(layout.stamp, {"study": study.study, "backend": study.backend})


def job(config: str) -> int:
    """The study_config rule's job: the staged config at `config` into the study folder."""
    try:
        write_study_config(load_study(config))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    return 0
