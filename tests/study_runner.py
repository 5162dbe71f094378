"""Helpers for tests that run a whole study through `snakemake`, the way a user does.

Not a conftest: test modules import it explicitly (`from study_runner import ...`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import yaml

from connector_tax.config import LAUNCH_PHASES, StudyConfig, launch_label, planned_cells, validate_config
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import read_index, read_summary, verify_cell

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile")]

# Every bound a busy host can break (measure/gate.py PERTURBATIONS) out of its reach; the
# server's own errors are still judged.
LENIENT_VALIDITY: dict[str, Any] = {
    "attempts": 1,
    "max_lateness_gap_frac": 1e6,
    "max_lateness_ttft_frac": 1e6,
    "max_lateness_max_us": 1e12,
    "max_rate_error": 1e6,
    "max_cpu_frac": 1e6,
    "max_unissued": 10**9,
    "max_overrun_ms": 1e12,
    "max_others_cpu_frac": 1.0,
    "max_steal_frac": 1.0,
}

# Two configurations, two rates, one Phase B shape, seconds per cell. Saturation thresholds
# that never fire keep the reference rates (and so the Phase B cells) fixed whatever the noise.
TINY: dict[str, Any] = {
    "study": "integrity",
    "backend": "sim",
    "seed": 7,
    "model": {"name": "Qwen/Qwen3-Coder-30B-A3B-Instruct"},
    "sim": {"hardware_profile": "tiny-fast"},
    "variants": [{"name": "plain"}, {"name": "noop_connector", "connector": {"type": "noop", "role": "kv_both"}}],
    "workload": {
        "warmup_s": 0.1,
        "duration_s": 0.4,
        "min_completed": 3,
        "request_timeout_s": 10,
        "phase_a": {"rates": [4, 8], "shape": {"input": 128, "output": 8}},
        "phase_b": {"inputs": [128], "outputs": [8]},
    },
    "saturation": {
        "throughput_ratio_min": 0.01,
        "waiting_p50_max": 1000,
        "ttft_p90_ratio_max": 1000,
        "min_requests": 1,  # cells of a few requests: judged anyway (the thresholds never fire)
        "min_scrapes": 1,
    },
    "loadgen": {"cpu_latency_us": None},
    # Not a measured setting (no fingerprint holds it): the simulator starts in about a second,
    # but several at once on a loaded 2-core host have taken over 20 s, past the default 30 s
    # bail-out's comfort.
    "server": {"ready_timeout_s": 120},
    # The validity gate is not what these tests test, and the host they run on is shared: one
    # attempt per cell, and bounds no busy host reaches, so a cell's reuse does not depend on
    # the neighbours (tests/unit/test_contention.py tests the gate).
    "validity": LENIENT_VALIDITY,
}


def write_config(folder: Path, config: dict[str, Any], name: str = "study.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(
    folder: Path, config: Path, *args: str, cores: int = 2, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Two jobs at a time by default: the simulator needs no GPU, and the tests need the time.
    The timeout is a bail-out for a hung run: a whole tiny study takes a minute or two on a
    loaded host."""
    argv = [*SNAKEMAKE, "--cores", str(cores), *args, "--configfile", str(config), "--directory", str(folder)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _interruptible() -> None:
    # SIGINT as a terminal's Ctrl-C delivers it: a test run started in the background by a
    # non-interactive shell (`cmd &`) inherits SIGINT ignored, and so would snakemake.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_snakemake(folder: Path, config: Path, *args: str, cores: int = 1) -> subprocess.Popen[bytes]:
    """In its own session, so the test can signal or kill the whole job tree."""
    argv = [*SNAKEMAKE, "--cores", str(cores), *args, "--configfile", str(config), "--directory", str(folder)]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_interruptible,
    )


def sealed_cells(folder: Path, config: dict[str, Any]) -> dict[str, str | None]:
    """{config/phase/label: when it was sealed complete, or None} for every planned cell."""
    config = validate_config(config)
    layout = StudyLayout(folder / "results" / config["study"])
    reference = json.loads(layout.reference_rates.read_text()) if layout.reference_rates.exists() else None
    out: dict[str, str | None] = {}
    study = StudyConfig.from_mapping(config)
    for variant in config["variants"]:
        for launch_phase in LAUNCH_PHASES:
            if launch_phase != LAUNCH_PHASES[0] and reference is None:
                continue
            for replicate in range(1, study.workload.replicates + 1):
                for cell in planned_cells(study, variant["name"], launch_phase, reference, replicate):
                    files = layout.phase(variant["name"], cell.phase, replicate).cell(cell.label)
                    summary = read_summary(files)
                    key = f"{launch_label(variant['name'], replicate)}/{cell.key}"
                    out[key] = summary.sealed if summary is not None and summary.complete else None
    return out


def _phase_of(folder: Path) -> tuple[str, int]:
    """(phase, replicate) of a phase folder: phase_a, phase_a.r2, ..."""
    phase, _, replicate = folder.name.partition(".r")
    return phase, int(replicate or 1)


def consistent(folder: Path, study: str) -> list[str]:
    """Problems on disk: a summary saying complete whose files do not all check out, or an
    index calling a cell complete that is not."""
    layout = StudyLayout(folder / "results" / study)
    problems = []
    for summary in layout.root.glob("*/*/summary_*.json"):
        doc = json.loads(summary.read_text())
        if doc.get("complete") and "superseded" not in summary.parts:
            stem = summary.name[len("summary_") : -len(".json")]
            phase, replicate = _phase_of(summary.parent)
            files = layout.phase(summary.parent.parent.name, phase, replicate).cell(stem[len(phase) + 1 :])
            ok, why = verify_cell(files, doc.get("fingerprint"))
            if not ok:
                problems.append(f"{summary}: {why}")
    for index_path in layout.root.glob("*/*/run.json"):
        index = read_index(index_path)
        for entry in index.cells if index else []:
            files = layout.phase(index.variant, entry.phase, index.replicate).cell(entry.label)
            if entry.status == "complete" and not verify_cell(files, entry.fingerprint)[0]:
                problems.append(f"{index_path}: {entry.key} indexed complete but is not")
    return problems


def our_processes(folder: Path) -> list[psutil.Process]:
    """Processes of a test's study: run in its folder, or naming it on their command line."""
    marker = str(folder)
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            mine = (proc.info["cwd"] or "").startswith(marker) or any(marker in a for a in proc.info["cmdline"] or [])
            if proc.pid != os.getpid() and mine:
                found.append(proc)
        except psutil.Error:
            continue
    return found
