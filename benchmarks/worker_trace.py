"""Why a send left late: the sends >= 150 µs late in the default study's Phase A, counted per class (no
timer wake-up, woke late, preempted, its own callback, stalled while running), beside a busy-loop
probe of the worker's CPU (share lost, stalls a second).

Backs: ../docs/contention.md#what-the-default-studys-late-sends-are-and-why-they-are-measured-again-2026-12-02

    ctax benchmark worker_trace [--repeats 3] [--targets phase_a_plain phase_a_mooncake_both]
        [--config configs/default.yaml] [--threshold-us 150] [--probe-seconds 20] [--out DIR]

Runs `snakemake --cores 1 TARGETS` (default: Phase A of plain and mooncake_both of the default
study, ~1 minute) `--repeats` times from empty results in a scratch folder, with
_worker_trace_hook.py loaded into the load generator's worker: it logs each send's target and
its last busy-wait, each timer wake-up, each pass of the pre-send spin, each response read and
hand-over, and the thread's run_delay (time runnable but not running). Every send at least
`--threshold-us` late is then put in one class, the first that explains at least half of it:

- **no timer wake-up**: the loop slept through the time its timer was armed for and woke with a
  read (the timer's interrupt came late or not at all);
- **timer wake-up late, runnable in the guest**: the wake-up came after the target and the thread
  had waited on the guest's run queue (another thread had its CPU);
- **timer wake-up late, not queued in the guest**: the wake-up came after the target with no such
  wait (the interrupt's delivery, or a virtual CPU the hypervisor did not run);
- **preempted in the guest after waking**: woke in time, then waited on the run queue;
- **its own callback**: woke in time, then one of its reads or hand-overs ran that long;
- **stalled while running**: woke in time, ran no long callback and was not queued, and still
  sent late: time the guest's scheduler does not see (a stalled virtual CPU, interrupts).

Before the runs a busy loop pinned to the host's last CPU (the worker's, as the pipeline places
it on 2 cores) counts its own stalls for `--probe-seconds`: what that CPU loses with nothing of
the study on it. The trace costs the worker a few µs per logged event and a /proc read at each
wake-up, on the path it measures (a read that stalls is counted as a stall); lateness is the
study's own (its summaries), beside the classes. Results go to the scratch folder, never to results/.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _common import REPO, parser, positive_float, run_logged, snakemake, write_json

from connector_tax.contract.summary import read_summary_file

HOOK = Path(__file__).with_name("_worker_trace_hook.py")
CLASSES = (
    "no timer wake-up",
    "timer wake-up late, runnable in the guest",
    "timer wake-up late, not queued in the guest",
    "preempted in the guest after waking",
    "its own callback",
    "stalled while running",
)
WAKE_WINDOW_NS = 5_000_000  # a wake-up this long before a target can be the one that served it
STALL_BINS_US = (20, 50, 100, 200, 500, 1_000, 2_000)


def probe_stalls(cpu: int, seconds: float) -> dict[str, Any]:
    """A busy loop on `cpu`: how often, and how long, it did not run (gaps between clock reads)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        gaps: list[int] = []
        now = time.monotonic_ns
        t = t0 = now()
        end = t0 + int(seconds * 1e9)
        while t < end:
            t1 = now()
            if t1 - t >= 20_000:
                gaps.append(t1 - t)
            t = t1
    finally:
        os.sched_setaffinity(0, before)
    wall = (t - t0) / 1e9
    g = np.asarray(gaps, dtype=np.float64) / 1e3
    return {
        "cpu": cpu,
        "seconds": round(wall, 1),
        "lost_share": round(float(g.sum()) / 1e6 / wall, 4),
        "max_us": round(float(g.max()), 1) if len(g) else 0.0,
        "per_second_at_least_us": {b: round(float((g >= b).sum()) / wall, 2) for b in STALL_BINS_US},
    }


def classify(events: list[list[Any]], threshold_ns: int) -> tuple[Counter[str], int, list[dict[str, Any]]]:
    """Each send's class (see the module's doc) from one cell's log; (classes, sends, examples)."""
    wakes = sorted((e[2], e[1], e[3]) for e in events if e[0] == "w")  # (woke, armed, run_delay)
    woke = [w[0] for w in wakes]
    calls = [(e[1], e[2]) for e in events if e[0] in ("R", "Z")]
    fires = [e for e in events if e[0] == "f"]
    classes: Counter[str] = Counter()
    examples = []
    last_rd: int | None = None
    for _, t_fire, target, rd_fire in fires:
        late = t_fire - target
        i = bisect.bisect_right(woke, t_fire) - 1
        wake = wakes[i] if i >= 0 and wakes[i][0] > target - WAKE_WINDOW_NS else None
        if late >= threshold_ns:
            half = late / 2
            if wake is None:
                c = CLASSES[0]
            elif wake[0] > target:
                queued = last_rd is not None and wake[2] - last_rd > half
                c = CLASSES[1] if queued else CLASSES[2]
            elif rd_fire - wake[2] > half:
                c = CLASSES[3]
            elif any(end - start > half for start, end in calls if end > wake[0] and start < t_fire):
                c = CLASSES[4]
            else:
                c = CLASSES[5]
            classes[c] += 1
            if len(examples) < 5:
                examples.append(
                    {
                        "class": c,
                        "late_us": round(late / 1e3),
                        "woke_us_after_target": None if wake is None else round((wake[0] - target) / 1e3),
                        "armed_us_before_target": None if wake is None else round((target - wake[1]) / 1e3),
                    }
                )
        last_rd = rd_fire
    return classes, len(fires), examples


def _run(config: Path, targets: list[str], out: Path, threshold_ns: int) -> dict[str, Any]:
    trace = out / "trace"
    trace.mkdir(parents=True)
    hook_dir = out / "hook"
    hook_dir.mkdir()
    shutil.copy(HOOK, hook_dir / "sitecustomize.py")
    env = {**os.environ, "CTAX_WORKER_TRACE_DIR": str(trace)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH")) if p)
    rc, seconds = run_logged(snakemake(*targets, config=config, directory=out), out / "snakemake.log", env)
    classes: Counter[str] = Counter()
    sends, examples = 0, []
    for path in sorted(trace.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            c, n, ex = classify(json.loads(line), threshold_ns)
            classes.update(c)
            sends += n
            examples += ex
    cells = {}
    for path in sorted(out.glob("results/*/*/phase_*/summary_*.json")):
        s = read_summary_file(path)
        if s is not None:
            cells[f"{path.parts[-3]}/{path.stem.removeprefix('summary_')}"] = {
                "lateness_p90_us": s.lateness_us.p90,
                "lateness_p99_us": s.lateness_us.p99,
                "valid": s.validity.valid,
            }
    return {
        "returncode": rc,
        "seconds": round(seconds, 1),
        "sends_traced": sends,
        "late_sends": sum(classes.values()),
        "classes": {c: classes.get(c, 0) for c in CLASSES},
        "cells": cells,
        "examples": examples[:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default=None, repeats=3)
    p.add_argument("--targets", nargs="+", default=["phase_a_plain", "phase_a_mooncake_both"])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "default.yaml")
    p.add_argument("--threshold-us", type=positive_float, default=150.0, help="a late send (default 150)")
    p.add_argument("--probe-seconds", type=float, default=20.0, help="the stall probe's time (0: none)")
    p.add_argument("--out", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    a = p.parse_args(argv)
    if not a.config.is_file():
        p.error(f"--config: {a.config} is not a file")
    out = a.out or Path(tempfile.mkdtemp(prefix="ctax-worker-trace-"))
    result: dict[str, Any] = {"load_average_before": os.getloadavg()}
    if a.probe_seconds > 0:
        result["probe"] = probe_stalls((os.cpu_count() or 1) - 1, a.probe_seconds)
        print(f"stall probe: {json.dumps(result['probe'])}", flush=True)
    runs = []
    for i in range(a.repeats):
        run = _run(a.config, a.targets, out / f"run{i + 1}", int(a.threshold_us * 1000))
        runs.append(run)
        late = [c["lateness_p90_us"] for c in run["cells"].values() if c["lateness_p90_us"] is not None]
        print(
            f"run {i + 1}: rc {run['returncode']}, {run['seconds']} s, cells' lateness p90 "
            f"{min(late, default=0):.0f}-{max(late, default=0):.0f} us, {run['late_sends']} of "
            f"{run['sends_traced']} sends >= {a.threshold_us:g} us late: {json.dumps(run['classes'])}",
            flush=True,
        )
    total = Counter[str]()
    for run in runs:
        total.update(run["classes"])
    late_sends = sum(total.values())
    result |= {
        "runs": runs,
        "out": str(out),
        "late_sends": late_sends,
        "sends_traced": sum(r["sends_traced"] for r in runs),
        "classes": {c: total.get(c, 0) for c in CLASSES},
        "load_average_after": os.getloadavg(),
    }
    print(f"all runs: {late_sends} of {result['sends_traced']} sends >= {a.threshold_us:g} us late")
    for c in CLASSES:
        print(f"  {total.get(c, 0):4d} ({100 * total.get(c, 0) / max(late_sends, 1):3.0f} %)  {c}")
    write_json(a.json, result)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
