"""The instrumentation's overhead on a real engine: vLLM's CPU build, with and without patches/.

Run through `python benchmarks/instrumentation_overhead.py --real` (needs tools/vllm_cpu_env.sh
and tools/tiny_model.py). Two `vllm serve` launches of configs/vllm-cpu-tiny.yaml's
noop_connector (the configuration with the most hooks wrapped) run side by side, made by the
project's launcher: one with a step log (instrumented), one without (sitecustomize then loads
nothing). Every seeded prompt goes to both servers back to back, one request at a time, the
order alternating from prompt to prompt, so the host's load (this machine is shared, and its
load swings by several times within a minute) hits a pair's two requests alike.

With one request in flight every streamed chunk is one engine step, so the client's inter-token
latency is the per-step latency, whatever runs inside the step; E2E is the request's whole
latency. Per pair: the difference (instrumented - plain) of the two requests' median ITL and of
their E2E; the overhead is the median over pairs with a 95% bootstrap CI over pairs, also
relative to the plain server's median. The instrumented server's own records give the design's
fields for scale (step_duration_us, engine_step_us, worker steps).
"""

from __future__ import annotations

import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # vllm_cpu_env: where the CPU environment is

from connector_tax.config import find_variant, load_config  # noqa: E402
from connector_tax.launch import steptiming  # noqa: E402
from connector_tax.launch.command import launch_spec  # noqa: E402
from connector_tax.serving.process import ServerProcess, free_port  # noqa: E402

CONFIG = REPO / "configs" / "vllm-cpu-tiny.yaml"
INPUT_LEN = 64


def one_request(client: httpx.Client, url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.monotonic_ns()
    arrivals = []
    with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic_ns())
    return {
        "e2e_us": (arrivals[-1] - t0) / 1000.0,
        "itl_us": [(b - a) / 1000.0 for a, b in zip(arrivals, arrivals[1:])],
    }


def bootstrap_ci(diffs: list[float], seed: int = 0, n: int = 10000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    a = np.asarray(diffs)
    meds = np.median(rng.choice(a, size=(n, a.size), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def run_real(args: Any) -> int:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        print("instrumentation_overhead --real: no vLLM CPU environment (run tools/vllm_cpu_env.sh)", file=sys.stderr)
        return 2
    model = Path(args.model_dir)
    model = model if model.is_absolute() else REPO / model
    if not (model / "config.json").is_file():
        print(
            f"instrumentation_overhead --real: --model-dir: {model}: run tools/tiny_model.py {args.model_dir}",
            file=sys.stderr,
        )
        return 2
    config = copy.deepcopy(load_config(CONFIG))
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(python.parent / "vllm")
    variant = find_variant(config, "noop_connector")
    tmp = Path(tempfile.mkdtemp(prefix="ctax-overhead-"))
    servers: dict[str, ServerProcess] = {}
    try:
        for name in ("plain", "instrumented"):  # one at a time: start-up saturates both cores
            port = free_port("127.0.0.1", block=3)
            # --control: neither is instrumented (an A/A run: what the set-up alone shows)
            instrumented = name == "instrumented" and not args.control
            step_log = str(tmp / name / "steps" / "engine_step.jsonl") if instrumented else None
            spec = launch_spec(str(CONFIG), config, variant, port, step_log)
            servers[name] = ServerProcess(spec, f"http://127.0.0.1:{port}", tmp / name, grace_s=30.0)
            servers[name].start()
            servers[name].wait_ready(600)
        load_before = os.getloadavg()
        rng = random.Random(20260526)
        pairs: dict[str, list[float]] = {"itl_us": [], "e2e_us": [], "plain_itl_us": [], "plain_e2e_us": []}
        with httpx.Client(timeout=120) as client:
            for server in servers.values():  # warm-up
                for _ in range(3):
                    one_request(client, server.url, [5] * INPUT_LEN, args.output_len)
            for i in range(args.rounds * args.requests):
                prompt = [rng.randrange(3, 4000) for _ in range(INPUT_LEN)]
                order = ("plain", "instrumented") if i % 2 == 0 else ("instrumented", "plain")
                got = {name: one_request(client, servers[name].url, prompt, args.output_len) for name in order}
                plain_itl, inst_itl = (statistics.median(got[n]["itl_us"]) for n in ("plain", "instrumented"))
                pairs["itl_us"].append(inst_itl - plain_itl)
                pairs["e2e_us"].append(got["instrumented"]["e2e_us"] - got["plain"]["e2e_us"])
                pairs["plain_itl_us"].append(plain_itl)
                pairs["plain_e2e_us"].append(got["plain"]["e2e_us"])
    finally:
        for server in servers.values():
            server.stop()
    log = tmp / "instrumented" / "steps" / "engine_step.jsonl"
    engine = [x for x in steptiming.read_step_records(log) if x["step_duration_us"] is not None]
    workers = steptiming.read_step_records(log, "worker")
    report: dict[str, Any] = {
        "control": bool(args.control),
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "output_len": args.output_len,
        "input_len": INPUT_LEN,
        # the conditions: this host is shared, so say how busy it was
        "cpus": os.cpu_count(),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    for metric in ("itl_us", "e2e_us"):
        diffs = pairs[metric]
        lo, hi = bootstrap_ci(diffs)
        base = statistics.median(pairs[f"plain_{metric}"])
        mid = statistics.median(diffs)
        report[metric] = {
            "pairs": len(diffs),
            "plain_median": round(base, 1),
            "overhead_median": round(mid, 1),
            "ci95": [round(lo, 1), round(hi, 1)],
            "overhead_pct": round(100 * mid / base, 3),
            "ci95_pct": [round(100 * lo / base, 3), round(100 * hi / base, 3)],
        }
    report["instrumented_records"] = {
        "engine_steps": len(engine),
        "step_duration_us_p50": statistics.median(x["step_duration_us"] for x in engine) if engine else None,
        "engine_step_us_p50": statistics.median(x["engine_step_us"] for x in engine) if engine else None,
        "worker_steps": len(workers),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if args.control:
        print("CONTROL (A/A): neither server instrumented; the 'overhead' below is the set-up's own bias")
    print(
        f"vLLM CPU build, tiny dummy model, noop_connector; {args.rounds * args.requests} prompts of "
        f"{INPUT_LEN}->{args.output_len} tokens, each sent to both servers back to back (order alternating)"
    )
    for metric, label in (("itl_us", "per step (ITL, one request in flight)"), ("e2e_us", "end to end")):
        m = report[metric]
        print(
            f"{label:>40}: plain {m['plain_median']:.1f} us, "
            f"overhead {m['overhead_median']:+.1f} us ({m['overhead_pct']:+.3f} %), "
            f"95% CI [{m['ci95'][0]:+.1f}, {m['ci95'][1]:+.1f}] us = "
            f"[{m['ci95_pct'][0]:+.3f}, {m['ci95_pct'][1]:+.3f}] %"
        )
    print(f"instrumented server's records: {json.dumps(report['instrumented_records'])}")
    print(
        f"host: {report['cpus']} CPUs, 1-minute load average {report['loadavg_1m_before_after'][0]} before the "
        f"rounds, {report['loadavg_1m_before_after'][1]} after"
    )
    return 0
