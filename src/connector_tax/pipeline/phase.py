"""One configuration's phase: one server launch, its cells in a row, then the server stops.

Resumable at cell level: a cell whose summary says it completed is not run again, so a re-run
after an interruption redoes only the incomplete cells. Every launch records what it did in
run.json (status, reason, timings, step-timing availability) before it returns, whatever
happened; a failure in one cell stops the phase (the server is likely gone) and is written
down, and the pipeline goes on with the other configurations.

    python -m connector_tax.pipeline.phase --config STUDY.yaml --name NAME --phase phase_a \
        --results results/STUDY
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from connector_tax.config import find_variant, load_config
from connector_tax.launch.command import launch_spec
from connector_tax.loadgen.affinity import plan_affinity
from connector_tax.loadgen.session import CellSpec, LoadGenerator, LoadgenOptions
from connector_tax.loadgen.stats import ValidityThresholds
from connector_tax.metrics.sampler import MetricsSampler
from connector_tax.pipeline.cells import PHASE_A, PHASE_B, phase_a_cells, phase_b_cells
from connector_tax.atomic import write_json
from connector_tax.pipeline.provenance import env_text
from connector_tax.pipeline.steplog import RAW_NAME, StepLogSplitter, step_timing_status
from connector_tax.launch.vllm_cpu import device
from connector_tax.serving.gpus import gpu_lease
from connector_tax.serving.process import READY_TIMEOUT_S, ServerProcess, ServerStartError, free_port



def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def cell_done(cell_dir: Path, cell: CellSpec) -> bool:
    summary = cell_dir / f"summary_{cell.phase}_{cell.label}.json"
    requests = cell_dir / f"requests_{cell.phase}_{cell.label}.jsonl"
    if not (summary.exists() and requests.exists()):
        return False
    try:
        return bool(json.loads(summary.read_text(encoding="utf-8")).get("complete"))
    except ValueError:
        return False


def plan(config: dict[str, Any], name: str, phase: str, results: Path) -> list[CellSpec]:
    if phase == PHASE_A:
        return phase_a_cells(config)
    reference = json.loads((results / "reference_rates.json").read_text(encoding="utf-8"))
    return phase_b_cells(config, name, reference)


def loadgen_options(config: dict[str, Any], url: str) -> LoadgenOptions:
    workload = config["workload"]
    loadgen = config["loadgen"]
    return LoadgenOptions(
        url=url,
        model=config["model"].get("served_name") or config["model"]["name"],
        endpoint=workload["endpoint"],
        prompt=workload["prompt"],
        temperature=workload["temperature"],
        ignore_eos=workload["ignore_eos"],
        inflight_cap=workload["inflight_cap"],
        timeout_s=workload["request_timeout_s"],
        seed=config["seed"],
        workers=loadgen["workers"],
        affinity=loadgen["affinity"],
        cpu_latency_us=loadgen["cpu_latency_us"],
        validity=ValidityThresholds.from_dict(config.get("validity")),
    )


def run_phase(config_path: str, name: str, phase: str, results: Path) -> dict[str, Any]:
    config = load_config(config_path)
    variant = find_variant(config, name)
    backend = config["backend"]
    phase_dir = results / name / phase
    phase_dir.mkdir(parents=True, exist_ok=True)
    run: dict[str, Any] = {
        "config": name, "phase": phase, "backend": backend, "simulated": backend == "sim",
        "started": _now(), "finished": None, "status": "ok", "reason": None, "cells": [],
        "cells_run": [], "cells_resumed": [], "launch_command": None, "server_cpus": None,
        "step_timing_available": False, "step_timing_reason": None,
    }  # fmt: skip
    preflight = json.loads((results / "preflight" / "preflight_status.json").read_text(encoding="utf-8"))
    if preflight.get(name, {}).get("status") != "ok":
        reason = preflight.get(name, {}).get("reason") or "not in preflight_status.json"
        run.update(status="skipped", reason=f"preflight SKIP: {reason}", finished=_now())
        write_json(phase_dir / "run.json", run)
        return run

    cells = plan(config, name, phase, results)
    run["cells"] = [f"{c.phase}/{c.label}" for c in cells]
    todo = [c for c in cells if not cell_done(results / name / c.phase, c)]
    run["cells_resumed"] = [f"{c.phase}/{c.label}" for c in cells if c not in todo]
    (phase_dir / "config.json").write_text(json.dumps({"study": config["study"], "variant": variant,
                                                       "workload": config["workload"]}, indent=2) + "\n")  # fmt: skip
    (phase_dir / "env.txt").write_text(env_text(backend), encoding="utf-8")
    if todo:
        try:
            _run_cells(config_path, config, variant, phase_dir, results, todo, run)
        except (ServerStartError, OSError, RuntimeError) as exc:
            run.update(status="failed", reason=str(exc))
    else:
        timing = step_timing_status(phase_dir, backend, bool(variant.get("connector")))
        run.update(step_timing_available=timing[0], step_timing_reason=timing[1])
    run["finished"] = _now()
    write_json(phase_dir / "run.json", run)
    return run


def _run_cells(
    config_path: str,
    config: dict[str, Any],
    variant: dict[str, Any],
    phase_dir: Path,
    results: Path,
    cells: list[CellSpec],
    run: dict[str, Any],
) -> None:
    backend = config["backend"]
    host = variant.get("server", {}).get("host") or config["server"]["host"]
    port = free_port(host, block=3 if backend == "vllm" else 1)
    raw_steps = phase_dir / RAW_NAME
    for old in phase_dir.glob("engine_step_raw*"):
        old.unlink()  # one launch, one raw log: resumed cells already have their slices
    spec = launch_spec(config_path, config, variant, port, str(raw_steps) if backend != "openai" else None)
    url = spec.url or f"http://{host}:{port}"
    run["launch_command"] = spec.argv
    with gpu_lease(backend, device=device(config)) as gpu:
        if gpu is not None:
            spec.env["CUDA_VISIBLE_DEVICES"] = gpu
        options = loadgen_options(config, url)
        # Off the load generator's worker cores: a server waking there preempts a send spin.
        cpus = plan_affinity(options.workers).server_cpus if options.affinity else ()
        with ServerProcess(spec, url, phase_dir, cpus=cpus) as server:
            run["server_cpus"] = list(server.cpus) or None
            server.wait_ready(READY_TIMEOUT_S[backend])
            splitter = StepLogSplitter(phase_dir)
            with LoadGenerator(options) as gen:
                for cell in cells:
                    cell_dir = results / variant["name"] / cell.phase
                    metrics = cell_dir / f"metrics_{cell.phase}_{cell.label}.jsonl"
                    t0 = time.monotonic_ns()
                    with MetricsSampler(server.url, metrics):
                        summary = gen.run_cell(cell, cell_dir)
                    splitter.split(t0, time.monotonic_ns(), cell_dir / f"engine_step_{cell.phase}_{cell.label}.jsonl")
                    run["cells_run"].append(f"{cell.phase}/{cell.label}")
                    if server.proc is not None and server.proc.poll() is not None:
                        raise RuntimeError(f"server exited with code {server.proc.returncode} during {cell.label}")
                    if summary["counts"]["ok"] == 0 and summary["counts"]["post_warmup"] > 0:
                        run["reason"] = f"cell {cell.label}: no request succeeded"
            timing = step_timing_status(phase_dir, backend, bool(variant.get("connector")))
            run.update(step_timing_available=timing[0], step_timing_reason=timing[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.pipeline.phase")
    parser.add_argument("--config", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--phase", required=True, choices=[PHASE_A, PHASE_B])
    parser.add_argument("--results", required=True, type=Path)
    args = parser.parse_args(argv)
    run = run_phase(args.config, args.name, args.phase, args.results)
    print(f"{args.name} {args.phase}: {run['status']}" + (f" ({run['reason']})" if run["reason"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
