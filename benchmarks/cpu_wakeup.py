"""What a halted CPU costs a write that wakes a process on it: the write's and the round trip's p50 /
p99 (µs), with and without the load generator's CPU wake-up latency hold.

Backs: ../docs/performance.md#the-load-generators-parts-alone

    ctax benchmark cpu_wakeup [--rounds 3000] [--repeats 2] [--json FILE]

Two processes pinned to different CPUs play ping-pong over pipes; before every round the
sender sleeps 2 ms so that the other CPU goes idle, as it does between a load generator's
requests. Printed per variant: the cost of the write itself (it wakes the reader) and the
round trip, p50/p99/max in µs. "held" holds /dev/cpu_dma_latency at 0 µs the way the load
generator does (connector_tax.loadgen.host.cpu_latency); the variants alternate, repeats times.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from _common import parser, positive_int, write_json

from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold


def ping_pong(rounds: int, cpus: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpus[1]})
        while (byte := os.read(to_child_r, 1)) != b"q":
            os.write(to_parent_w, byte)
        os._exit(0)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    write_us, round_us = np.empty(rounds), np.empty(rounds)
    try:
        for i in range(rounds):
            time.sleep(0.002)
            t0 = time.perf_counter_ns()
            os.write(to_child_w, b"x")
            t1 = time.perf_counter_ns()
            os.read(to_parent_r, 1)
            t2 = time.perf_counter_ns()
            write_us[i], round_us[i] = (t1 - t0) / 1e3, (t2 - t0) / 1e3
    finally:
        os.write(to_child_w, b"q")
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, before)
        for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
            os.close(fd)
    return write_us, round_us


def quantiles(values: np.ndarray) -> dict[str, float]:
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1), "max": round(float(values.max()), 1)}


def line(q: dict[str, float]) -> str:
    return f"p50 {q['p50']:.1f} p99 {q['p99']:.1f} max {q['max']:.0f} us"


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, repeats=2, repeats_help="rounds of both variants, alternating which goes first")
    p.add_argument(
        "--rounds", type=positive_int, default=3000, metavar="N", help="ping-pongs per variant (default 3000)"
    )
    args = p.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        print(f"{p.prog}: needs two CPUs, this process may use {len(allowed)}", file=sys.stderr)
        return 2
    cpus = (allowed[0], allowed[1])
    rows = []
    for rep in range(args.repeats):
        for max_us in (None, 0) if rep % 2 == 0 else (0, None):
            with CpuLatencyHold(max_us) as state:
                write_us, round_us = ping_pong(args.rounds, cpus)
            name = "not held" if max_us is None else "held" if state.held else state.detail
            row = {
                "repeat": rep,
                "variant": name,
                "write_us": quantiles(write_us),
                "round_trip_us": quantiles(round_us),
            }
            rows.append(row)
            print(
                f"repeat {rep} [{name}]: write {line(row['write_us'])} | round trip {line(row['round_trip_us'])}",
                flush=True,
            )
    write_json(args.json, {"cpus": list(cpus), "rounds": args.rounds, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
