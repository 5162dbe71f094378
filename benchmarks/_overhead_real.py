"""The instrumentation's overhead on a real engine: vLLM's CPU build, with and without patches/.

Run through `ctax benchmark instrumentation_overhead --real` (needs tools/vllm_cpu_env.sh
and tools/tiny_model.py). Three `vllm serve` launches of configs/vllm-cpu-tiny.yaml's
noop_connector (the configuration with the most hooks wrapped) run side by side, made by the
project's launcher: `plain` and `plain2` without a step log (sitecustomize then loads nothing)
and `instrumented` with one (with --control, none has one). Every seeded prompt goes to all
three back to back, one request at a time, in an order that rotates through the six
permutations, so the host's load (this machine is shared, and its load swings by several times
within a minute) hits a prompt's three requests alike. The A/B comparison (instrumented -
plain) and the A/A one (plain2 - plain) are interleaved request by request, in one sitting: the
A/A says how large a difference two identical launches show, which the A/B must exceed to mean
anything.

Idle servers are frozen (SIGSTOP of their process groups) while another serves, unless
--no-freeze: a vLLM worker keeps spinning on its shared-memory queue for a second after its last
step (vLLM's SpinCondition, busy_loop_s=1), and every launch here binds its worker to the same
core, so a server asked a moment ago competes with the one being measured, and how that
contention falls can differ from server to server.

With one request in flight every streamed chunk is one engine step, so the client's inter-token
latency is the per-step latency, whatever runs inside the step; E2E is the request's whole
latency. Per prompt: the difference of two servers' median ITL and of their E2E; a comparison's
result is the median over prompts with a 95% bootstrap CI over prompts, also relative to the
reference server's median. The instrumented server's own records give the step record's fields for
scale (step_duration_us, engine_step_us, worker steps).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _common import REPO, write_json

sys.path.insert(0, str(REPO / "tests"))  # vllm_cpu_env: where the CPU environment is

from connector_tax.config import StudyConfig, load_config  # noqa: E402
from connector_tax.launch import steptiming  # noqa: E402
from connector_tax.launch.command import launch_spec  # noqa: E402
from connector_tax.serving.server_process import ServerProcess, free_port  # noqa: E402

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


ROLES = ("plain", "plain2", "instrumented")
COMPARISONS = {
    "A/B": ("instrumented", "plain"),
    "A/B vs plain2": ("instrumented", "plain2"),
    "A/A": ("plain2", "plain"),
}


class Freezer:
    """While one server serves, the others are stopped (SIGSTOP to each one's process group)."""

    def __init__(self, servers: dict[str, ServerProcess], active: bool) -> None:
        self.groups = {name: s.proc.pid for name, s in servers.items() if s.proc is not None}
        self.active = active
        self._signal(self.groups, signal.SIGSTOP)

    def _signal(self, groups: Any, sig: int) -> None:
        if not self.active:
            return
        for name in groups:
            try:
                os.killpg(self.groups[name], sig)
            except ProcessLookupError:
                pass

    @contextlib.contextmanager
    def only(self, name: str) -> Iterator[None]:
        self._signal([name], signal.SIGCONT)
        try:
            yield
        finally:
            self._signal([name], signal.SIGSTOP)

    def release(self) -> None:
        self._signal(self.groups, signal.SIGCONT)


def launch_order(rotation: int) -> list[str]:
    """The roles in the order they are launched: a launch's place can be a bias of its own."""
    k = rotation % len(ROLES)
    return list(ROLES[k:] + ROLES[:k])


def _launch(config: dict[str, Any], tmp: Path, control: bool, rotation: int) -> dict[str, ServerProcess]:
    study = StudyConfig.from_mapping(config)
    variant = study.variant("noop_connector")
    servers: dict[str, ServerProcess] = {}
    for name in launch_order(rotation):  # one at a time: start-up saturates both cores
        port = free_port("127.0.0.1", block=3)
        instrumented = name == "instrumented" and not control
        step_log = str(tmp / name / "steps" / "engine_step.jsonl") if instrumented else None
        spec = launch_spec(str(CONFIG), study, variant, port, step_log)
        servers[name] = ServerProcess(spec, f"http://127.0.0.1:{port}", tmp / name, grace_s=30.0)
        servers[name].start()
        servers[name].wait_ready(600)
    return servers


def _measure(servers: dict[str, ServerProcess], args: Any) -> dict[str, dict[str, list[float]]]:
    """{role: {"itl_us": [median ITL per prompt], "e2e_us": [...]}}, prompt by prompt."""
    rng = random.Random(20260526)
    orders = list(itertools.permutations(ROLES))
    got: dict[str, dict[str, list[float]]] = {name: {"itl_us": [], "e2e_us": []} for name in ROLES}
    freezer = Freezer(servers, args.freeze)
    try:
        with httpx.Client(timeout=120) as client:
            for name, server in servers.items():  # warm-up
                with freezer.only(name):
                    for _ in range(3):
                        one_request(client, server.url, [5] * INPUT_LEN, args.output_len)
            for i in range(args.rounds * args.requests):
                prompt = [rng.randrange(3, 4000) for _ in range(INPUT_LEN)]
                for name in orders[i % len(orders)]:
                    with freezer.only(name):
                        answer = one_request(client, servers[name].url, prompt, args.output_len)
                    got[name]["itl_us"].append(statistics.median(answer["itl_us"]))
                    got[name]["e2e_us"].append(answer["e2e_us"])
    finally:
        freezer.release()
    return got


def _compare(got: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, (new, ref) in COMPARISONS.items():
        out[label] = {}
        for metric in ("itl_us", "e2e_us"):
            diffs = [a - b for a, b in zip(got[new][metric], got[ref][metric])]
            lo, hi = bootstrap_ci(diffs)
            base, mid = statistics.median(got[ref][metric]), statistics.median(diffs)
            out[label][metric] = {
                "pairs": len(diffs),
                "reference_median": round(base, 1),
                "difference_median": round(mid, 1),
                "ci95": [round(lo, 1), round(hi, 1)],
                "difference_pct": round(100 * mid / base, 3),
                "ci95_pct": [round(100 * lo / base, 3), round(100 * hi / base, 3)],
            }
    return out


def run_real(args: Any) -> int:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is None:
        print(
            "ctax benchmark instrumentation_overhead: --real: no vLLM CPU environment (run tools/vllm_cpu_env.sh)",
            file=sys.stderr,
        )
        return 2
    model = Path(args.model_dir)
    model = model if model.is_absolute() else REPO / model
    if not (model / "config.json").is_file():
        print(
            f"ctax benchmark instrumentation_overhead: --model-dir: {model}: run tools/tiny_model.py {args.model_dir}",
            file=sys.stderr,
        )
        return 2
    config = copy.deepcopy(load_config(CONFIG))
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(python.parent / "vllm")
    tmp = Path(tempfile.mkdtemp(prefix="ctax-overhead-"))
    servers: dict[str, ServerProcess] = {}
    try:
        servers = _launch(config, tmp, args.control, args.launch_rotation)
        load_before = os.getloadavg()
        got = _measure(servers, args)
        load_after = os.getloadavg()
    finally:
        for server in servers.values():
            server.stop()
    log = tmp / "instrumented" / "steps" / "engine_step.jsonl"
    engine = [x for x in steptiming.read_step_records(log) if x["step_duration_us"] is not None]
    report: dict[str, Any] = {
        "control": bool(args.control),
        "freeze_idle": bool(args.freeze),
        "launch_order": launch_order(args.launch_rotation),
        "prompts": args.rounds * args.requests,
        "output_len": args.output_len,
        "input_len": INPUT_LEN,
        # the conditions: this host is shared, so say how busy it was
        "cpus": os.cpu_count(),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "comparisons": _compare(got),
        "instrumented_records": {
            "engine_steps": len(engine),
            "step_duration_us_p50": statistics.median(x["step_duration_us"] for x in engine) if engine else None,
            "engine_step_us_p50": statistics.median(x["engine_step_us"] for x in engine) if engine else None,
            "worker_steps": len(steptiming.read_step_records(log, "worker")),
        },
    }
    _print(report)
    write_json(args.json, report)
    return 0


def _print(report: dict[str, Any]) -> None:
    if report["control"]:
        print("CONTROL: no server instrumented; every difference below is the set-up's own")
    print(
        f"vLLM CPU build, tiny dummy model, noop_connector; {report['prompts']} prompts of {report['input_len']}->"
        f"{report['output_len']} tokens, each sent to plain, plain2 and instrumented back to back (order rotating); "
        f"idle servers {'frozen' if report['freeze_idle'] else 'left running'}; launched in the order "
        f"{', '.join(report['launch_order'])}"
    )
    for label, by_metric in report["comparisons"].items():
        for metric, name in (("itl_us", "per step (ITL)"), ("e2e_us", "end to end")):
            m = by_metric[metric]
            print(
                f"{label:>14} {name:>15}: reference {m['reference_median']:.1f} us, "
                f"difference {m['difference_median']:+.1f} us ({m['difference_pct']:+.3f} %), "
                f"95% CI [{m['ci95'][0]:+.1f}, {m['ci95'][1]:+.1f}] us = "
                f"[{m['ci95_pct'][0]:+.3f}, {m['ci95_pct'][1]:+.3f}] %"
            )
    print(f"instrumented server's records: {json.dumps(report['instrumented_records'])}")
    print(
        f"host: {report['cpus']} CPUs, 1-minute load average {report['loadavg_1m_before_after'][0]} before the "
        f"prompts, {report['loadavg_1m_before_after'][1]} after"
    )
