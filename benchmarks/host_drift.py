"""The host's own speed with nothing of the study running: the sd (%) of a fixed interpreter loop's
rate per few-second block on one core and on both, the two cores' correlation, and how well a 1 %
probe on the other core follows it (correlation).

Backs: ../docs/replicates.md#the-drift-measured-directly-and-a-probe-beside-the-engine-2026-12-03
Backs: ../docs/performance.md#studies

    ctax benchmark host_drift [--seconds 60] [--block 4] [--json FILE]

Three sittings of --seconds each, one after the other, each a fixed interpreter loop (the kind of
work a step of vLLM's CPU build on the tiny model is made of) run busy on its core, its rate taken
per --block seconds:

1. **one core busy**: the loop on the compute core (1), core 0 idle;
2. **both cores busy**: the loop on each core: do the two move together?
3. **a probe beside it**: the loop on core 1 (where the engine computes) and, on core 0 (where the
   study's load generator and the server's other threads run), a light probe: a 0.3 ms piece of the
   same work every 100 ms, timed in its thread's CPU time (a preemption on its core is not counted,
   a slower physical core is), the fastest of three: about 1 % of a core, what a study could afford
   beside its load generator. Does the probe's block mean follow core 1's rate?

Per sitting: the sd of the log rate over blocks, its range, the blocks' lag-1 autocorrelation; the
correlation of the two cores' block means (2) and of the probe's with core 1's (3). docs/replicates.md
has the runs and what they say about the launch variance: could a launch's speed be measured
beside it and taken out of its tax.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import parser, positive_float, write_json
from _launch_probe import SpeedProbe

# A core's loop: its own rate per block, from a shared start, as JSON [[t0_ns, t1_ns, per_s], ...].
_BUSY = r"""
import json, os, sys, time
core, start, blocks, block = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.sched_setaffinity(0, {core})
def work():
    s = 0
    for i in range(5000):
        s += i * i
while time.time() < start:
    time.sleep(0.001)
out = []
for k in range(blocks):
    t0 = time.monotonic_ns()
    n = 0
    while time.monotonic_ns() - t0 < block * 1e9:
        work()
        n += 1
    t1 = time.monotonic_ns()
    out.append([t0, t1, n / ((t1 - t0) / 1e9)])
print(json.dumps(out))
"""
COMPUTE, SERVICE = 1, 0


def _busy(cores: tuple[int, ...], seconds: float, block: float) -> dict[int, list[list[float]]]:
    blocks = max(3, int(seconds // block))
    start = time.time() + 1.0  # every core's loop starts together
    procs = {
        c: subprocess.Popen(
            [sys.executable, "-c", _BUSY, str(c), str(start), str(blocks), str(block)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in cores
    }
    return {c: json.loads(p.communicate()[0]) for c, p in procs.items()}


def _stats(logs: np.ndarray) -> dict[str, Any]:
    rel = 100 * (np.exp(logs - logs.mean()) - 1)
    return {
        "blocks": int(logs.size),
        "sd_log_pct": round(100 * float(logs.std(ddof=1)), 1),
        "range_pct": [round(float(rel.min()), 1), round(float(rel.max()), 1)],
        "lag1": round(float(np.corrcoef(logs[:-1], logs[1:])[0, 1]), 2) if logs.size > 3 else None,
        "blocks_pct": [round(float(x), 1) for x in rel],
    }


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return round(float(np.corrcoef(a, b)[0, 1]), 2)


def measure(seconds: float, block: float) -> dict[str, Any]:
    one = np.log([r for _, _, r in _busy((COMPUTE,), seconds, block)[COMPUTE]])
    both = _busy((SERVICE, COMPUTE), seconds, block)
    a, b = (np.log([r for _, _, r in both[c]]) for c in (SERVICE, COMPUTE))
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "speed.jsonl"
        probe = SpeedProbe(path, SERVICE).start()  # the probe launch_variance runs beside the engine
        try:
            beside = _busy((COMPUTE,), seconds, block)[COMPUTE]
        finally:
            probe.stop()
        ticks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    core1 = np.log([r for _, _, r in beside])
    seen = [[math.log(1e6 / r["work_ns"]) for r in ticks if t0 <= r["t_ns"] <= t1] for t0, t1, _ in beside]
    probe_means = np.array([np.mean(s) if s else np.nan for s in seen])
    ok = np.isfinite(probe_means)
    return {
        "block_s": block,
        "one_core_busy": _stats(one),
        "both_cores_busy": {
            "service_core": _stats(a),
            "compute_core": _stats(b),
            "correlation_of_block_means": _corr(a, b),
        },
        "probe_beside": {
            "compute_core": _stats(core1),
            "probe": _stats(probe_means[ok]),
            "probe_ticks": len(ticks),
            "correlation_of_block_means": _corr(probe_means[ok], core1[ok]),
        },
        "load_after": os.getloadavg(),
    }


def render(r: dict[str, Any]) -> str:
    def line(label: str, s: dict[str, Any]) -> str:
        return (
            f"  {label:34} sd {s['sd_log_pct']:5.1f} %, range {s['range_pct'][0]:+6.1f} .. {s['range_pct'][1]:+6.1f} %, "
            f"lag-1 {s['lag1']}"
        )

    both, beside = r["both_cores_busy"], r["probe_beside"]
    return "\n".join(
        [
            f"the interpreter loop's rate per {r['block_s']:g} s block (against its sitting's mean):",
            line("1. core 1 busy, core 0 idle", r["one_core_busy"]),
            line("2. both busy: core 0", both["service_core"]),
            line("   both busy: core 1", both["compute_core"]),
            f"   the two cores' block means correlate {both['correlation_of_block_means']:+.2f}",
            line("3. core 1 busy", beside["compute_core"]),
            line("   the 1 % probe on core 0", beside["probe"]),
            f"   the probe's block means follow core 1's: correlation {beside['correlation_of_block_means']:+.2f} "
            f"({beside['probe_ticks']} ticks)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--seconds", type=positive_float, default=60.0, help="seconds per sitting (default 60)")
    p.add_argument("--block", type=positive_float, default=4.0, help="seconds per block (default 4)")
    a = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2 or not {COMPUTE, SERVICE} <= os.sched_getaffinity(0):
        print("ctax benchmark host_drift: needs CPUs 0 and 1", file=sys.stderr)
        return 2
    result = measure(a.seconds, a.block)
    print(render(result))
    write_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
