"""The rehearsal of an 8-GPU host, shared by its test (test_rehearsal.py) and its benchmark
(benchmarks/gpu_rehearsal.py): a scaled-down H20 study, backend vllm, on a fake GPU host
(fake_gpu_host.py), its `vllm serve` a stand-in that serves with `ctax sim`.

The host: nine fake H20s on two NUMA nodes (GPUs 0-4 on node 0, 5-8 on node 1, 24 fake CPUs a
node), GPU 1 held by a process outside the study for the whole run, so eight are free for the
study's eight configurations. A driver gives a dead server's memory back `release_s` later.
The study: the H20 config's eight configurations, server settings and seed, with cells of
seconds (two Phase A rates, one Phase B shape, one B' shape) on the simulator's tiny-fast
profile, so that eight phase jobs fit this 2-core machine side by side.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from fake_gpu_host import FakeGpuHost
from study_runner import LENIENT_VALIDITY, SNAKEMAKE

from connector_tax.config.vllm_rules import connector_types

REPO = Path(__file__).resolve().parents[1]
H20 = REPO / "configs" / "h20-qwen3-coder.yaml"
BUSY_GPU = "1"
GPUS = 9
MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
CRASHED = "mooncake_both"  # its Phase A server is killed mid-phase


def study_config(host: FakeGpuHost, variants: list[str] | None = None) -> dict[str, Any]:
    config = yaml.safe_load(H20.read_text())
    if variants is None:  # the study's eight: the fake host has no stand-in for an `lmcache` server,
        # which the two LMCache multi-process variants start beside vLLM
        variants = [v["name"] for v in config["variants"] if "lmcache_mp" not in connector_types(v.get("connector"))]
    config["variants"] = [v for v in config["variants"] if v["name"] in variants]
    config["study"] = "rehearsal-h20"
    config["sim"] = {"hardware_profile": "tiny-fast"}
    config["vllm"] = {**config["vllm"], "executable": str(host.bin / "vllm")}
    config["server"]["ready_timeout_s"] = 120
    config["workload"] = {
        **{k: config["workload"][k] for k in ("endpoint", "prompt", "temperature", "ignore_eos")},
        "warmup_s": 1,
        "duration_s": 20,
        "min_completed": 5,
        "request_timeout_s": 30,
        "phase_a": {"rates": [1, 2, 4], "shape": {"input": 256, "output": 16}},
        "phase_b": {"rate": "ref_safe", "inputs": [128], "outputs": [16]},
        "phase_b_prime": {
            "rate": "ref_load",
            "variants": ["plain", "mooncake_both"],
            "shapes": [{"input": 512, "output": 16}],
        },
    }
    # Thresholds that never fire: the reference rates, so the cells, do not hang on the noise of
    # eight jobs on two cores; nor does a cell's validity (one attempt each).
    config["saturation"] = {
        "throughput_ratio_min": 0.01,
        "waiting_p50_max": 1000,
        "ttft_p90_ratio_max": 1000,
        "min_requests": 1,
        "min_scrapes": 1,
    }
    config["validity"] = copy.deepcopy(LENIENT_VALIDITY)
    config["loadgen"] = {"workers": 1, "affinity": True, "cpu_latency_us": None}
    return config


def make(
    folder: Path, gpus: int = GPUS, busy: str | None = BUSY_GPU, variants: list[str] | None = None
) -> tuple[FakeGpuHost, Path, dict[str, str]]:
    """The host, the study config's path, and the environment snakemake runs in."""
    host = FakeGpuHost(folder / "host", gpus=gpus, nodes=2, cpus_per_node=24, release_s=3.0)
    if busy is not None:
        host.hold(busy, 30000)
    snapshot = folder / "hub" / f"models--{MODEL.replace('/', '--')}" / "snapshots" / "rehearsal"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"\0" * 16)
    path = folder / "rehearsal-h20.yaml"
    path.write_text(yaml.safe_dump(study_config(host, variants), sort_keys=False))
    env = {**host.env(path), "HF_HUB_CACHE": str(folder / "hub"), "CONNECTOR_TAX_LOCKS": str(folder / "locks")}
    return host, path, env


def placement_table(results: Path) -> list[dict[str, Any]]:
    """One row per phase job: where it ran, from its run.json."""
    rows = []
    for run in sorted(results.glob("*/phase_*/run.json")):
        doc = json.loads(run.read_text())
        placed = doc.get("placement") or {}
        cpus = placed.get("cpus") or []
        rows.append(
            {
                "job": f"{doc['phase']}_{doc['variant']}",
                "gpu": placed.get("gpu"),
                "cpus": f"{cpus[0]}-{cpus[-1]}" if cpus and cpus == list(range(cpus[0], cpus[-1] + 1)) else cpus,
                "numa_node": placed.get("numa_node"),
                "cpus_numa_node": placed.get("cpus_numa_node"),
                "gpu_waits_s": placed.get("gpu_waits_s"),
                "restarts": doc.get("restarts"),
                "started": doc.get("started"),
                "finished": doc.get("finished"),
                "status": doc.get("status"),
            }
        )
    return rows


def _kill_mid_phase(host, results: Path, stop: threading.Event, killed: list) -> None:
    """SIGKILL CRASHED's Phase A server once it has sealed its first cell (a crash mid-phase: the
    cell it is measuring fails, the server is launched again for the cells after it)."""
    run = results / CRASHED / "phase_a" / "run.json"
    while not stop.wait(0.2):
        try:
            doc = json.loads(run.read_text())
        except (OSError, ValueError):
            continue
        if not any(c["status"] == "complete" for c in doc["cells"]):
            continue
        live = [h for h in host.holders() if h["variant"] == CRASHED and h.get("pid") and not h.get("gone_at")]
        if live:
            try:
                os.kill(live[-1]["pid"], signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended on its own meanwhile: wait for the next one
            killed.append(live[-1])
            return


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def launch_seconds(config: Path, env: dict[str, str], folder: Path, at_once: int = 8) -> float:
    """How long the stand-in takes to start on this host as the command starts them, `at_once`
    together (a preflight check each, in folders of their own): the mean time to readiness, what
    `ctax plan --launch-s` gets. Timed alone it is a third of that here (two cores), so alone it
    would be the wrong number; on a GPU host, time `vllm serve` as many at once, too."""
    runs = []
    for k in range(at_once):
        where = folder / f"launch{k}"
        where.mkdir(parents=True)
        argv = [sys.executable, "-m", "connector_tax.cli", "pipeline", "preflight", "check", "--config", str(config)]
        argv += ["--variant", "plain", "--out", str(where / "plain.json"), "--log-dir", str(where / "logs")]
        runs.append(
            (where, subprocess.Popen(argv, env=env, cwd=where, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        )
    ready = []
    for where, proc in runs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        ready.append(float(json.loads((where / "plain.json").read_text())["ready_s"]))
    return sum(ready) / len(ready)


def rehearse(
    folder: Path,
    launch_s: float | None = None,
    gpus: int = GPUS,
    busy: str | None = BUSY_GPU,
    variants: list[str] | None = None,
    slurm_env: dict[str, str] | None = None,
    crash: bool = True,
) -> dict:
    """Plan (`ctax plan --gpus N --launch-s`, N the free GPUs, at most 8; a launch timed here first
    unless given), run the planned command (under SLURM: the slurm-local profile, docs/slurm.md),
    and return what a test or benchmark reads. `crash`: SIGKILL one server mid-phase (a relaunch the
    plan cannot foresee; without it the measured time is the plan's to match)."""
    host, config, env = make(folder, gpus, busy, variants)
    env = {**(slurm_env or os.environ), **env}
    side_by_side = min(8, gpus - (busy is not None))  # the GPUs the study may use: every free one
    if launch_s is None:
        launch_s = launch_seconds(config, env, folder / "timed", side_by_side)
    plan_json = folder / "plan.json"
    plan = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "plan", "--config", str(config), "--gpus", str(side_by_side)]
        + ["--json", str(plan_json)]
        + ["--launch-s", f"{launch_s:.1f}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan_json.read_text())
    command = planned["command"].split()
    results = folder / "results" / "rehearsal-h20"
    stop, killed = threading.Event(), []
    if crash:
        threading.Thread(target=_kill_mid_phase, args=(host, results, stop, killed), daemon=True).start()
    start = time.time()
    argv = [*SNAKEMAKE, *command[1:], "--directory", str(folder)]
    if slurm_env is not None:
        # The profile's 1 GB: a vLLM phase job asks for 64 GB, more than this node has.
        names = [v["name"] for v in yaml.safe_load(config.read_text())["variants"]]
        rules = ["preflight_config"] + [f"{p}_{n}" for n in names for p in ("phase_a", "phase_b")]
        argv = [*SNAKEMAKE, "--profile", str(REPO / "workflow" / "profiles" / "slurm-local"), "all"]
        argv += ["--configfile", str(config), "--directory", str(folder)]
        argv += ["--set-resources", *(f"{r}:mem_mb=1000" for r in rules)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    end = time.time()
    stop.set()
    assert done.returncode == 0, done.stderr[-3000:]
    first = placement_table(results)
    # The cell the crash cut short is failed and left for the next run, as any fault's is: the
    # same command again measures it (and reuses every other cell).
    again_start = time.time()
    again = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    assert again.returncode == 0, again.stderr[-3000:]
    return {
        "host": host,
        "config": config,
        "command": planned["command"],
        "planned_wall_s": planned["wall_s"],
        "launch_s": launch_s,
        "measured_phases_s": max(at(r["finished"]) for r in first) - start,
        "measured_all_s": end - start,
        "rerun_s": time.time() - again_start,
        "first": first,
        "rows": placement_table(results),
        "killed": killed,
        "stdout": done.stdout + again.stdout,
        "stderr": done.stderr + again.stderr,
    }
