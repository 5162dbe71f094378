"""How a job is placed, without a SLURM: its allocation read from SLURM's environment, GPU and CPU
leases bypassed under it, server ports that cannot collide, what a job asks of a scheduler, and
the output that proves a phase job ended (job.json). Against a real SLURM: tests/slurm/test_slurm.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from study_runner import REPO

from connector_tax.cli import main as ctax
from connector_tax.config import ConfigError, StudyConfig, validate_config
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import PhaseIndex
from connector_tax.pipeline import phase
from connector_tax.planning.job_resources import gpus_per_job, phase_runtime_min, preflight_runtime_min
from connector_tax.serving import server_process, slurm
from connector_tax.serving.cpus import cpu_lease
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.lifecycle import exclusive_lock, private_dir

SLURM_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NAME": "python3",  # what srun sets inside a step: not the job's name
    "SLURM_STEP_ID": "0",
    "SLURMD_NODENAME": "gpu07",
    "SLURM_JOB_PARTITION": "gpu",
    "CUDA_VISIBLE_DEVICES": "1",
    "SLURM_STEP_GPUS": "1",
}


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch):
    """This process as a job SLURM placed on GPU 1."""
    for key, value in SLURM_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(slurm, "_job_name", {"42": "run-7f3a"}.get)  # what squeue says
    allocation = slurm.adopt("slurm")
    yield allocation
    slurm.adopt("host")


def _study(**changes) -> StudyConfig:
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    config.update(changes)
    return StudyConfig.from_mapping(validate_config(config))


def test_the_allocation_is_read_from_slurms_environment(placed) -> None:
    assert placed.record() == {
        "scheduler": "slurm",
        "job_id": "42",
        "job_name": "run-7f3a",
        "step_id": "0",
        "node": "gpu07",
        "partition": "gpu",
        "gpus": ("1",),
        "node_gpus": ("1",),
        "cpus": tuple(sorted(os.sched_getaffinity(0))),
    }
    assert slurm.placement_record()["job_id"] == "42"


def test_orphans_are_the_running_launches_and_every_job_of_their_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed run's jobs: those its indexes name as running, and, through the run's job name,
    its pending jobs and those that had not written an index yet; a finished run's are gone."""

    def launch(variant: str, status: str, job: str, run: str) -> PhaseIndex:
        where = {"scheduler": "slurm", "job_id": job, "job_name": run}
        return PhaseIndex("s", variant, "phase_a", "sim", {}, {}, [], status=status, placement=where)

    here, elsewhere = os.getcwd(), "/elsewhere"
    queue = {  # what squeue lists now: each job's run (job name), working directory and comment
        "11": ("RUNNING", "killed", here, "rule_phase_a_plain"),
        "13": ("PENDING", "killed", here, "rule_phase_a_mooncake_both"),
        "14": ("RUNNING", "other-study", here, "rule_phase_a_plain"),
        "15": ("PENDING", "killed", elsewhere, "rule_phase_a_plain"),  # the same name from elsewhere
        "16": ("PENDING", "killed", here, "a job of the user's own"),  # not the plugin's
    }
    asked = []

    def squeue(option: str, values: list[str]) -> dict[str, slurm.Queued]:
        asked.append((option, sorted(values)))
        column = {"--jobs": 0, "--name": 1}[option]
        return {job: slurm.Queued(*listed) for job, listed in queue.items() if (job, listed[1])[column] in values}

    monkeypatch.setattr(slurm, "_squeue", squeue)
    indexes = [
        launch("plain", "running", "11", "killed"),
        launch("noop_connector", "complete", "12", "killed"),  # ended before the kill
        launch("plain", "complete", "5", "earlier"),  # a run long gone
        None,  # a launch never started
        PhaseIndex("s", "x", "phase_a", "sim", {}, {}, [], status="running", placement={"scheduler": "host"}),
    ]
    assert slurm.orphaned_jobs(indexes) == {"11": "plain/phase_a", "13": "phase_a_mooncake_both, pending"}
    assert asked == [("--jobs", ["11"]), ("--name", ["earlier", "killed"])]
    assert slurm.orphaned_jobs([indexes[4], None]) == {}


def test_placement_slurm_outside_slurm_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(RuntimeError, match=r"^--placement slurm: not inside a SLURM job \(no SLURM_JOB_ID\)$"):
        slurm.adopt("slurm")
    assert slurm.adopted() is None
    assert slurm.placement_record() == {"scheduler": "host", "node": socket.gethostname()}


def test_the_phase_command_refuses_placement_slurm_outside_slurm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    argv = [sys.executable, "-m", "connector_tax.cli", "pipeline", "phase", "--config", "none.yaml"]
    out = subprocess.run(
        [*argv, "--variant", "plain", "--phase", "phase_a", "--placement", "slurm"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "plain phase_a: --placement slurm: not inside a SLURM job (no SLURM_JOB_ID)"
    ]


def test_a_placed_job_uses_its_gpu_without_a_lease(placed) -> None:
    # Another process of this user holds GPU 1's host lease: a placed job does not care, SLURM
    # gave GPU 1 to it (on a node with a device cgroup every job sees its GPU as device 0).
    held = exclusive_lock(private_dir("gpus") / "gpu1.lock")
    try:
        with gpu_lease("vllm") as gpu:
            assert gpu is not None and gpu.index == "1"
    finally:
        if held is not None:
            os.close(held)
    with gpu_lease("sim") as gpu:
        assert gpu is None


def test_a_placed_vllm_job_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    slurm.adopt("slurm")
    try:
        with pytest.raises(RuntimeError, match="SLURM job 43 has none"), gpu_lease("vllm"):
            pass
    finally:
        slurm.adopt("host")


def test_a_placed_job_leases_no_cpus(placed) -> None:
    allowed = os.sched_getaffinity(0)
    with cpu_lease(1) as leased:
        assert leased is None
        assert os.sched_getaffinity(0) == allowed


def test_server_ports_are_outside_the_ephemeral_range_and_reserved() -> None:
    low, high = server_process._ephemeral_range()
    ports = [server_process.free_port(block=3) for _ in range(20)]
    try:
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert port + 2 < low or port > high
            # reserved: another taker (a job beside this one) cannot lock any port of the block
            for p in range(port, port + 3):
                assert exclusive_lock(private_dir("ports") / f"port{p}.lock") is None
    finally:
        for port in ports:
            server_process.release_port(port)
    fd = exclusive_lock(private_dir("ports") / f"port{ports[0]}.lock")
    assert fd is not None  # released
    os.close(fd)


def test_a_stopped_server_gives_its_port_back(tmp_path: Path) -> None:
    from connector_tax.serving.spec import LaunchSpec

    port = server_process.free_port()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with server_process.ServerProcess(LaunchSpec(sleeper), f"http://127.0.0.1:{port}", tmp_path):
        assert port in server_process._reserved
    assert port not in server_process._reserved


def test_time_limits_come_from_the_plan_with_a_margin() -> None:
    tiny = _study()
    longer = _study(workload={**tiny.raw["workload"], "duration_s": 120.0})
    assert phase_runtime_min(tiny, "plain", "phase_a") >= 10  # the 10 min margin
    # two rates of 120 s cells, x 1.5, plus the margin
    assert phase_runtime_min(longer, "plain", "phase_a") >= 10 + 2 * 120 * 1.5 / 60
    assert preflight_runtime_min(tiny, "plain") == 11  # the simulator's 30 s start-up bound, x 1.5 + 10 min


def test_gpus_per_job_is_checked() -> None:
    tiny = _study()
    assert gpus_per_job(tiny) == 0
    assert gpus_per_job(tiny, 1) == 1
    for bad in (2, -1, "one", True):
        with pytest.raises(ConfigError, match=r"^gpus_per_job: must be 0 or 1"):
            gpus_per_job(tiny, bad)
    vllm = _study(backend="vllm")
    assert gpus_per_job(vllm) == 1
    with pytest.raises(ConfigError, match="needs one GPU per job"):
        gpus_per_job(vllm, 0)


@pytest.mark.parametrize("stop", [None, KeyboardInterrupt("signal SIGTERM")])
def test_only_a_job_that_returned_writes_job_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop) -> None:
    """job.json, the phase rule's second output, proves the job ended with an outcome. A job
    stopped by a signal writes run.json (interrupted) but no job.json, and removes the one an
    earlier job left, so Snakemake finds the output missing and runs the launch again (under
    SLURM the step's snakemake may delete outputs before a stopping job's last run.json lands)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(phase, "stop_on_signals", lambda: None)
    config = REPO / "configs" / "test-tiny.yaml"
    layout = StudyLayout.of("test-tiny")
    job_json = layout.job("plain", "phase_a")
    job_json.parent.mkdir(parents=True)
    job_json.write_text('{"launch_id": "an earlier job"}')

    def run_phase(*args, **kwargs) -> PhaseIndex:
        assert not job_json.exists(), "the earlier job's job.json must go before this job measures"
        if stop is not None:
            raise stop
        index = PhaseIndex("test-tiny", "plain", "phase_a", "sim", {}, {}, [], launch_id="L1", status="ok")
        index.finished = "2026-11-26T00:00:00+00:00"
        return index

    monkeypatch.setattr(phase, "run_phase", run_phase)
    rc = ctax(["pipeline", "phase", "--config", str(config), "--variant", "plain", "--phase", "phase_a"])
    if stop is None:
        assert rc == 0
        assert json.loads(job_json.read_text()) == {
            "launch_id": "L1",
            "status": "ok",
            "finished": "2026-11-26T00:00:00+00:00",
        }
    else:
        assert rc == 130
        assert not job_json.exists()


def test_the_phase_rules_ask_for_job_json_and_what_follows_needs_it() -> None:
    """Snakemake checks only the outputs a later job needs: job.json must be one of them."""
    rules = REPO / "workflow" / "rules"
    text = (rules / "phase.smk").read_text()
    assert "launch_outputs(_name," in text[text.index("output:") : text.index("log:")]
    common = (rules / "common.smk").read_text()
    outputs = common[common.index("def launch_outputs") : common.index("def indexes_of")]
    assert "LAYOUT.job(name, phase, replicate)" in outputs
    assert "launch_outputs(name, phase, r)" in common[common.index("def indexes_of") :]
