"""The study on a real single-node SLURM, through Snakemake's SLURM executor plugin.

Marked `slurm` (deselected by default): `tools/slurm_local.sh start --gpus 2`, then
`pytest -m slurm`; .ci/run does both and stops the cluster after. Skipped, with the reason, when
the plugin is not installed or the local SLURM is not up. Every run goes through `snakemake
--profile workflow/profiles/slurm-local`, as docs/slurm.md tells a user; each test ends with
nothing of its study left: no process in the process table (walked for the test's folder, not
for names) and no job of its folder in SLURM's queue.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from study_runner import REPO, SNAKEMAKE, TINY, consistent, our_processes, sealed_cells, snakemake, write_config

from connector_tax.contract import StudyLayout

pytestmark = pytest.mark.slurm

SCRIPT = REPO / "tools" / "slurm_local.sh"
PROFILE = REPO / "workflow" / "profiles" / "slurm-local"


def _slurm_env() -> tuple[dict[str, str] | None, str]:
    """The environment the tests' snakemake runs in (SLURM_CONF of the local cluster), or why not."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return None, "snakemake-executor-plugin-slurm is not installed (pip install -e '.[slurm]')"
    env_line = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "SLURM_CONF": env_line.split("=", 1)[1]} if "=" in env_line else dict(os.environ)
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, env=env)
    if status.returncode != 0:
        return None, "the local SLURM is not up (tools/slurm_local.sh start --gpus 2)"
    gpus = re.search(r"gpu:(\d+)", status.stdout)
    if gpus is None or int(gpus.group(1)) < 2:
        return None, "the local SLURM declares fewer than 2 GPUs (tools/slurm_local.sh start --gpus 2)"
    return env, ""


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    found, why = _slurm_env()
    if found is None:
        pytest.skip(why)
    return found


def run(env: dict[str, str], folder: Path, config: Path, *args: str, timeout: float = 600):
    argv = [*SNAKEMAKE, "--profile", str(PROFILE), *args, "--configfile", str(config), "--directory", str(folder)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


_started: list[tuple[subprocess.Popen[str], Path, dict[str, str]]] = []
_since: list[datetime] = []


@pytest.fixture(autouse=True)
def _no_snakemake_left():
    """A test that fails midway leaves no snakemake of its own running, nor jobs in the queue."""
    _since[:] = [datetime.now()]  # sacct: this test's jobs, not those of an earlier run in a reused folder
    yield
    while _started:
        proc, folder, env = _started.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the plugin cancels its jobs on the way out
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if left := queued(env, folder):  # a killed snakemake's jobs, when the test failed before its next run
            subprocess.run(["scancel", *left], env=env, capture_output=True)


def start(env: dict[str, str], folder: Path, config: Path, *args: str) -> subprocess.Popen[str]:
    """In its own session, so that a signal reaches snakemake alone, as from a user's kill."""
    argv = [*SNAKEMAKE, "--profile", str(PROFILE), *args, "--configfile", str(config), "--directory", str(folder)]
    with open(folder / "snakemake.out", "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _started.append((proc, folder, env))
    return proc


def sacct(env: dict[str, str], folder: Path) -> list[dict[str, str]]:
    """This test's SLURM jobs (those submitted from its folder), as sacct records them."""
    fields = ["JobID", "Comment", "State", "Start", "End", "Timelimit", "AllocTRES", "WorkDir"]
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "-S", f"{_since[0]:%Y-%m-%dT%H:%M:%S}", "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]
    return [r for r in rows if r["WorkDir"] == str(folder)]


def queued(env: dict[str, str], folder: Path) -> dict[str, str]:
    """{job id: state} of the test's jobs SLURM lists (pending, running, completing)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %Z"], capture_output=True, text=True, env=env).stdout
    return {job: state for job, state, *where in map(str.split, out.splitlines()) if where == [str(folder)]}


def nothing_left(env: dict[str, str], folder: Path, within_s: float = 60.0) -> list:
    """What of the test's study still runs: processes, and jobs in SLURM's queue."""
    deadline = time.monotonic() + within_s
    while True:
        left = [_described(p) for p in our_processes(folder)] + list(queued(env, folder).items())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _described(proc) -> tuple:
    """A process left behind, with what tells whose it was: its parent, age and state."""
    try:
        return (proc.pid, proc.ppid(), f"{time.time() - proc.create_time():.0f} s old", proc.status(), proc.cmdline())
    except Exception as exc:  # psutil.Error: it ended while being described
        return (proc.pid, type(exc).__name__)


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        assert proc is None or proc.poll() is None, f"snakemake exited early ({proc.returncode})"
        time.sleep(0.2)


def index(folder: Path, study: str, name: str, phase: str = "phase_a") -> dict:
    try:
        return json.loads(StudyLayout(folder / "results" / study).index(name, phase).read_text())
    except (OSError, ValueError):
        return {}


def measuring(folder: Path, study: str, name: str) -> str | None:
    """The SLURM job measuring `name`'s Phase A once it has sealed a cell and has more to go."""
    doc = index(folder, study, name)
    cells = doc.get("cells") or []
    if doc.get("status") != "running" or not any(c["status"] == "complete" for c in cells):
        return None
    if all(c["status"] == "complete" for c in cells):
        return None
    return (doc.get("placement") or {}).get("job_id")


def launches(folder: Path, config: dict) -> dict[str, tuple]:
    """What each Phase A launch's run.json says (status, reason, cell states): a failed test's clue."""
    out = {}
    layout = StudyLayout(folder / "results" / config["study"])
    for variant in config["variants"]:
        doc = index(folder, config["study"], variant["name"])
        try:
            log = layout.log(f"phase_a_{variant['name']}").read_text(errors="replace")[-1500:]
        except OSError:
            log = None
        out[variant["name"]] = (
            doc.get("status"),
            doc.get("reason"),
            {c["label"]: (c["status"], c.get("reason")) for c in doc.get("cells") or []},
            log,
        )
    return out


def fault_study(folder: Path, configs: int = 2, cells: int = 4, seconds: float = 4.0) -> tuple[dict, Path]:
    """Phase A of `cells` cells of `seconds` each per configuration: long enough to be caught."""
    config = copy.deepcopy(TINY)
    mooncake = {"name": "mooncake_both", "connector": {"type": "mooncake", "role": "kv_both"}}
    config["variants"] = [*config["variants"], mooncake][:configs]
    config["workload"].update(
        duration_s=seconds, phase_a={"rates": [4 + 2 * i for i in range(cells)], "shape": {"input": 128, "output": 8}}
    )
    return config, write_config(folder, config)


def resumes(env: dict[str, str], folder: Path, config: dict, path: Path, before: dict) -> subprocess.CompletedProcess:
    """The next run finishes Phase A, reusing every cell sealed before the fault."""
    run(env, folder, path, "--unlock")  # a killed snakemake leaves Snakemake's own lock behind
    again = run(env, folder, path, "phase_a")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    after = sealed_cells(folder, config)
    assert all(after.values()), (after, launches(folder, config), again.stdout[-3000:] + again.stderr[-3000:])
    kept = {key: sealed for key, sealed in before.items() if sealed}
    assert kept, "the fault came before any cell was sealed: nothing to resume"
    for key, sealed in kept.items():
        assert after[key] == sealed, key
    assert consistent(folder, config["study"]) == []
    assert nothing_left(env, folder) == []
    return again


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def test_tiny_study_side_by_side_on_two_gpus_matches_a_local_run(env, tmp_path) -> None:
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    for folder in (on_slurm, local):
        folder.mkdir()
    t0 = time.monotonic()
    done = run(env, on_slurm, write_config(on_slurm, config), "all")
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 cells complete" in done.stdout + done.stderr
    assert nothing_left(env, on_slurm) == []
    print(f"tiny study through SLURM: {took:.0f} s")  # pytest -s shows it

    # every phase job was a SLURM job with one GPU, its CPUs and the time limit its rule asked for
    study = config["study"]
    jobs = {row["JobID"]: row for row in sacct(env, on_slurm)}
    phase = {}
    for name in ("plain", "noop_connector", "mooncake_both"):
        for launch in ("phase_a", "phase_b"):
            doc = index(on_slurm, study, name, launch)
            placement = doc["placement"]
            assert placement["scheduler"] == "slurm" and placement["node_gpus"] in (["0"], ["1"]), placement
            row = jobs[placement["job_id"]]
            assert row["Comment"].startswith(f"rule_{launch}_{name}") and row["State"] == "COMPLETED", row
            assert "gres/gpu=1" in row["AllocTRES"] and "cpu=1" in row["AllocTRES"], row
            asked = re.search(rf"rule {launch}_{name}:.*?runtime=(\d+)", done.stdout + done.stderr, re.S)
            assert row["Timelimit"] == f"00:{int(asked.group(1)):02d}:00", row  # ctax plan's estimate, x 1.5 + 10 min
            phase[placement["job_id"]] = (row, placement)
    # two of them ran side by side, on different GPUs and CPUs
    pairs = [
        (a, b)
        for a in phase
        for b in phase
        if a < b and _time(phase[a][0]["Start"]) < _time(phase[b][0]["End"])
        if _time(phase[b][0]["Start"]) < _time(phase[a][0]["End"])
    ]
    assert pairs, [(r["JobID"], r["Start"], r["End"]) for r, _ in phase.values()]
    for a, b in pairs:
        assert phase[a][1]["node_gpus"] != phase[b][1]["node_gpus"]
        assert not set(phase[a][1]["cpus"]) & set(phase[b][1]["cpus"])
    # analyze and figures ran as SLURM jobs too; the small steps in snakemake's process
    rules = sorted(row["Comment"].split("_wildcards")[0] for row in jobs.values())
    assert "rule_analyze" in rules and "rule_figures" in rules, rules
    assert not any(r.startswith(("rule_manifest", "rule_reference", "rule_report")) for r in rules), rules

    # the same study run locally: the same cells, fingerprints and files
    assert snakemake(local, write_config(local, config), "all").returncode == 0
    for name in ("plain", "noop_connector", "mooncake_both"):
        for launch in ("phase_a", "phase_b"):
            a, b = index(on_slurm, study, name, launch), index(local, study, name, launch)
            assert [(c["phase"], c["label"], c["fingerprint"], c["status"]) for c in a["cells"]] == [
                (c["phase"], c["label"], c["fingerprint"], c["status"]) for c in b["cells"]
            ]
            assert b["placement"]["scheduler"] == "host"

    def files(folder: Path) -> set[str]:
        root = folder / "results" / study
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "logs" not in p.parts}

    assert files(on_slurm) == files(local)
    assert consistent(on_slurm, study) == []


def test_scancel_of_a_running_phase_job_resumes(env, tmp_path) -> None:
    config, path = fault_study(tmp_path)
    proc = start(env, tmp_path, path, "phase_a")
    job: list[str] = []
    wait_for(lambda: job.append(measuring(tmp_path, "integrity", "plain") or "") or job[-1], proc)
    before = sealed_cells(tmp_path, config)
    subprocess.run(["scancel", job[-1]], env=env, check=True)
    assert proc.wait(300) != 0  # the job failed; keep-going finished the other configuration
    assert nothing_left(env, tmp_path) == []
    assert {r["JobID"]: r["State"] for r in sacct(env, tmp_path)}[job[-1]].startswith("CANCELLED")
    assert consistent(tmp_path, "integrity") == []
    assert not all(sealed_cells(tmp_path, config)[f"plain/phase_a/r{r}"] for r in (4, 6, 8, 10))
    resumes(env, tmp_path, config, path, before)


def test_a_job_killed_at_its_time_limit_resumes(env, tmp_path) -> None:
    # Four cells of 25 s under a one-minute limit (SLURM checks limits about every 30 s).
    config, path = fault_study(tmp_path, configs=1, seconds=25.0)
    killed = run(env, tmp_path, path, "phase_a", "--set-resources", "phase_a_plain:runtime=1")
    assert killed.returncode != 0
    assert "TIMEOUT" in killed.stdout + killed.stderr
    rows = sacct(env, tmp_path)
    assert [r["State"] for r in rows if r["Comment"].startswith("rule_phase_a_plain")] == ["TIMEOUT"], rows
    assert nothing_left(env, tmp_path) == []
    assert consistent(tmp_path, "integrity") == []
    before = sealed_cells(tmp_path, config)
    assert not all(before.values())
    resumes(env, tmp_path, config, path, before)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_snakemake_leaves_nothing_running_and_resumes(env, tmp_path, how) -> None:
    # SIGTERM: snakemake cancels its SLURM jobs. SIGKILL (a lost login session): its jobs stay in
    # the queue, orphans, until the next run of the study cancels them before it starts its own.
    # Three configurations on two GPUs, so one job waits in the queue at the kill: an orphan no
    # index names yet. Six cells of 8 s: the others still run when the next run, slow to start on
    # a busy host, looks.
    config, path = fault_study(tmp_path, configs=3, cells=6, seconds=8.0)
    proc = start(env, tmp_path, path, "phase_a")
    job: list[str] = []

    def caught() -> bool:
        """A launch mid-measure (whichever SLURM started first) while another job waits."""
        running = [measuring(tmp_path, "integrity", v["name"]) for v in config["variants"]]
        job.append(next(filter(None, running), ""))
        return bool(job[-1]) and "PENDING" in queued(env, tmp_path).values()

    wait_for(caught, proc)
    before = sealed_cells(tmp_path, config)
    os.kill(proc.pid, getattr(signal, how))
    assert proc.wait(120) != 0
    if how == "SIGTERM":
        assert nothing_left(env, tmp_path) == []
        assert consistent(tmp_path, "integrity") == []
        resumes(env, tmp_path, config, path, before)
        return
    orphans = queued(env, tmp_path)
    assert orphans.get(job[-1]) == "RUNNING", orphans  # orphaned: still running, its snakemake gone
    waiting = [j for j, state in orphans.items() if state == "PENDING"]
    assert waiting, orphans
    again = resumes(env, tmp_path, config, path, before)
    # the next run cancelled those still queued when it started (on a loaded host one may end
    # first), the waiting one among them
    cancelled = re.findall(r"cancelled SLURM job (\d+) \([^)]*\) of an earlier run", again.stdout + again.stderr)
    assert cancelled and set(cancelled) <= set(orphans), (cancelled, orphans)
    assert set(waiting) <= set(cancelled), (waiting, cancelled, again.stdout[-3000:])
    states = {r["JobID"]: r["State"] for r in sacct(env, tmp_path)}
    assert all(states[j].startswith("CANCELLED") for j in cancelled), states
    assert all(states[j].startswith(("CANCELLED", "COMPLETED")) for j in orphans), states
