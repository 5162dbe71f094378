"""A variant's sidecar through the real entry point (`snakemake`), on the simulator: an
lmcache_mp variant's launch starts a stand-in LMCache server (sim/lmcache_server.py) before `ctax sim`.

Each fault ends as a recorded outcome with its reason (a SKIP or a failed cell), the healthy
sidecar is recorded (run.json, the manifest) and sampled (its threads), and after every fault —
kill -9 of the phase job, SIGTERM of snakemake, Ctrl-C of the whole group, a sidecar that crashes,
never answers or cannot start — no process of the study is left (the process table is walked for
the test's folder: the sidecar runs there). docs/faults.md has the table.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from study_runner import TINY, consistent, our_processes, start_snakemake, write_config

from connector_tax.contract import StudyLayout
from connector_tax.pipeline.studyfolder import is_pipeline_job

pytestmark = pytest.mark.e2e

MP = {"type": "lmcache_mp", "role": "kv_both"}
SIDECAR_FAULTS = {
    "mp_crash": {"sidecar_crash_after_s": 4},  # after its preflight (one request), during the phase's cells
    "mp_never_ready": {"sidecar_never_ready": True},
    "mp_fails_to_start": {"sidecar_fail_start": "No module named 'lmcache'"},
}
READY_TIMEOUT_S = 10  # vllm.lmcache_mp.ready_timeout_s: the stand-in answers in about a second


def _gone(folder: Path, within_s: float = 60.0) -> list:
    deadline = time.monotonic() + within_s
    while (left := our_processes(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [(p.pid, p.info["cmdline"]) for p in left]


def _layout(folder: Path) -> StudyLayout:
    return StudyLayout(folder / "results" / "integrity")


def _index(folder: Path, name: str) -> dict:
    return json.loads(_layout(folder).index(name, "phase_a").read_text())


def _config(variants: list[dict], rates: list[int], duration_s: float) -> dict:
    config = copy.deepcopy(TINY)
    config["variants"] = variants
    config["vllm"] = {"lmcache_mp": {"ready_timeout_s": READY_TIMEOUT_S}}
    config["workload"].update(duration_s=duration_s, phase_a={"rates": rates, "shape": {"input": 128, "output": 8}})
    return config


def _sidecars_of(folder: Path) -> list[psutil.Process]:
    return [p for p in our_processes(folder) if "connector_tax.sim.lmcache_server" in " ".join(p.info["cmdline"] or [])]


@pytest.fixture(scope="module")
def sidecar_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, int, dict]:
    """plain, a healthy lmcache_mp variant, one whose phase job is killed with -9 while it measures
    (its sidecar alive: seen), and one per sidecar fault."""
    folder = tmp_path_factory.mktemp("sidecars")
    variants = [{"name": "plain"}, {"name": "mp", "connector": MP}, {"name": "mp_killed", "connector": MP}]
    variants += [{"name": n, "connector": MP, "sim": {"faults": f}} for n, f in SIDECAR_FAULTS.items()]
    config = _config(variants, rates=[4, 6, 8], duration_s=2.0)
    proc = start_snakemake(folder, write_config(folder, config), "phase_a", "--keep-going", cores=2)
    seen: dict = {}
    deadline = time.monotonic() + 900  # a bail-out: six preflights first, on a loaded host
    while not _layout(folder).phase("mp_killed", "phase_a").staging("r4").folder.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "never saw mp_killed measuring"
        time.sleep(0.05)
    time.sleep(0.3)
    jobs = [p for p in our_processes(folder) if is_pipeline_job(p.info["cmdline"]) and "mp_killed" in p.info["cmdline"]]
    phase = [p for p in jobs if "phase" in p.info["cmdline"]]
    seen["sidecars_before_kill"] = [c.pid for p in phase for c in p.children() if c in _sidecars_of(folder)]
    for p in phase:
        p.send_signal(signal.SIGKILL)
    return folder, config, proc.wait(1200), seen


def test_sidecar_faults_are_recorded_outcomes_and_leave_nothing(sidecar_study) -> None:
    folder, _, returncode, seen = sidecar_study
    assert returncode != 0  # the killed phase job failed: snakemake says so, after the others
    assert seen["sidecars_before_kill"], "the killed phase job had no sidecar running"
    assert _gone(folder) == []  # the killed job's sidecar (and its server) included
    status = json.loads(_layout(folder).preflight_status.read_text())
    never = status["mp_never_ready"]
    assert never["status"] == "skip"
    assert never["reason"].startswith(
        f"sidecar lmcache_server (simulated LMCache MP server (ctax sim)) not ready after {READY_TIMEOUT_S} s"
    )
    fails = status["mp_fails_to_start"]
    assert fails["status"] == "skip" and fails["reason"] == (
        "sidecar lmcache_server (simulated LMCache MP server (ctax sim)) exited with code 1: No module named 'lmcache'"
    )  # the root cause read from its log, as a server's is
    # A sidecar that dies: the cell it died in failed with the reason and the launch was made again
    # (or, on a host slow enough that it died during the preflight's launch, a SKIP with the same reason).
    crash = "sidecar lmcache_server (simulated LMCache MP server (ctax sim)) exited with code 1: RuntimeError: "
    if status["mp_crash"]["status"] == "skip":
        assert status["mp_crash"]["reason"].startswith(crash)
    else:
        index = _index(folder, "mp_crash")
        failed = list(index["cells_failed"].values())
        assert failed and all(r.startswith(crash) and r.endswith("during the cell") for r in failed), failed
        assert index["restarts"]
    assert consistent(folder, "integrity") == []


def test_a_healthy_sidecar_is_recorded_sampled_and_in_the_manifest(sidecar_study) -> None:
    folder, _, _, _ = sidecar_study
    index = _index(folder, "mp")
    assert index["status"] == "ok", index["reason"]
    assert index["lmcache_mode"].startswith("multi-process (LMCacheMPConnector + lmcache server")
    assert index["lmcache_mode"].endswith("simulated")
    (side,) = index["sidecars"]
    assert side["name"] == "lmcache_server" and side["version"] is None and side["pid"]
    assert side["argv"][side["argv"].index("--port") + 1] == str(side["port"])
    phase = _layout(folder).phase("mp", "phase_a")
    assert (phase.folder / "sidecar_lmcache_server_stdout.log").read_text().startswith("simulated LMCache MP server")
    lines = [json.loads(x) for x in phase.cell("r4").threads.read_text().splitlines()]
    marked = {p["pid"] for line in lines for p in line["procs"] if p.get("sidecar") == "lmcache_server"}
    assert marked == {side["pid"]}
    # the cell's host report counts the sidecar as the server's, not as contention
    summary = json.loads(phase.cell("r4").summary.read_text())
    assert all(o["pid"] != side["pid"] for o in summary["host"]["top_others"])
    assert _index(folder, "plain")["sidecars"] == [] and _index(folder, "plain")["lmcache_mode"] is None
    staged = _layout(folder).root / "study_config.yaml"
    made = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "pipeline", "manifest", "--config", str(staged)],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    manifest = (_layout(folder).manifest_md).read_text()
    assert "- LMCache mode, mp: multi-process (LMCacheMPConnector + lmcache server" in manifest
    assert "- sidecar of mp: lmcache_server: simulated LMCache MP server (ctax sim): `" in manifest


@pytest.mark.parametrize(("how", "target"), [("SIGTERM", "snakemake"), ("SIGINT", "group")])
def test_a_stopped_study_stops_the_sidecar(tmp_path: Path, how: str, target: str) -> None:
    config = _config([{"name": "mp", "connector": MP}], rates=[4, 6, 8, 10], duration_s=3.0)
    proc = start_snakemake(tmp_path, write_config(tmp_path, config), "phase_a")
    deadline = time.monotonic() + 600  # a bail-out
    while not _layout(tmp_path).phase("mp", "phase_a").staging("r6").folder.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "never saw r6 measured"
        time.sleep(0.05)
    sidecars = _sidecars_of(tmp_path)
    assert sidecars, "no sidecar while the phase measured"
    sig = getattr(signal, how)
    os.killpg(proc.pid, sig) if target == "group" else os.kill(proc.pid, sig)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"snakemake did not stop on {how}")
    assert _gone(tmp_path) == []
    assert json.loads(_layout(tmp_path).index("mp", "phase_a").read_text())["status"] == "interrupted"
