"""How closely the waits keep time: wait_until's lateness p50 / max (µs) beside a plain time.sleep's, a
past target's return (µs), a 200 ms wait's CPU (ms), and the simulated engine's wall time over its
modelled steps (ratio).

Backs: ../docs/performance.md#the-load-generators-parts-alone

    ctax benchmark timers [--repeats 3] [--json FILE]

Per repeat: 300 waits of wait_until at the gaps a 100-3,000 req/s schedule has (50 µs, and
400-460 µs: the spin path and the sleep-then-spin path), the same 300 gaps slept with a plain
time.sleep, interleaved, as the reference; a wait whose target is already 1 ms past; the CPU a
200 ms wait costs; and one request of 512 prompt and 50 output tokens through the simulator's
EngineRunner (tiny-fast profile), its wall time over the sum of its steps' modelled durations.

The bars are those the unit tests held before they moved here (a timed unit test on a shared host
measures the host, not the code): wait_until median lateness < 50 µs and max < 10 ms; a past
target returns in < 10 ms; a 200 ms wait costs < 50 ms of CPU; the runner keeps to
modelled <= wall < 1.25 x modelled + 20 ms. Printed per repeat; medians at the end.
"""

from __future__ import annotations

import statistics
import threading
import time

from _common import parser, pct, write_json

from connector_tax.loadgen.worker.timing import wait_until
from connector_tax.sim.costs import CostModel, connector_terms
from connector_tax.sim.engine import EngineCore, EngineSettings, SimRequest, StepResult
from connector_tax.sim.profiles import connector_cost_table, hardware_profile
from connector_tax.sim.runner import EngineRunner


def gaps_ns(n: int = 300) -> list[int]:
    return [50_000 if i % 3 == 0 else 400_000 + 10_000 * (i % 7) for i in range(n)]


def lateness_us() -> tuple[list[float], list[float]]:
    """wait_until's and time.sleep's lateness (µs) over the same gaps, interleaved."""
    ours, plain = [], []
    for gap in gaps_ns():
        target = time.monotonic_ns() + gap
        ours.append((wait_until(target) - target) / 1e3)
        target = time.monotonic_ns() + gap
        time.sleep(gap / 1e9)
        plain.append((time.monotonic_ns() - target) / 1e3)
    return sorted(ours), sorted(plain)


def past_target_us(n: int = 100) -> list[float]:
    out = []
    for _ in range(n):
        now = time.monotonic_ns()
        t = time.perf_counter_ns()
        wait_until(now - 1_000_000)
        out.append((time.perf_counter_ns() - t) / 1e3)
    return sorted(out)


def long_wait_cpu_ms() -> float:
    cpu0 = time.process_time()
    wait_until(time.monotonic_ns() + 200_000_000)
    return (time.process_time() - cpu0) * 1e3


def runner_ratio() -> tuple[float, float]:
    """(wall s, modelled s) of one 512x50 request through EngineRunner."""
    table, role_scale = connector_cost_table()
    core = EngineCore(
        EngineSettings(), CostModel(hardware_profile("tiny-fast", None), connector_terms(None, table, role_scale))
    )
    done = threading.Event()
    results: list[StepResult] = []

    def publish(result: StepResult, t_ns: int) -> None:
        results.append(result)
        if any(o.finished for o in result.outputs):
            done.set()

    runner = EngineRunner(core, publish, on_step=lambda r: None, step_log=None, on_death=print)
    runner.start()
    t0 = time.monotonic()
    runner.submit(SimRequest("rt", list(range(512)), 50, 50))
    done.wait(60)
    wall = time.monotonic() - t0
    runner.stop()
    return wall, sum(r.cost.duration_us for r in results) / 1e6


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, repeats=3)
    args = p.parse_args(argv)
    rows = []
    for k in range(args.repeats):
        ours, plain = lateness_us()
        past = past_target_us()
        cpu = long_wait_cpu_ms()
        wall, modelled = runner_ratio()
        row = {
            "wait_until_lateness_us": {"p50": pct(ours, 50), "p99": pct(ours, 99), "max": round(ours[-1], 1)},
            "time_sleep_lateness_us": {"p50": pct(plain, 50), "p99": pct(plain, 99), "max": round(plain[-1], 1)},
            "past_target_return_us": {"p50": pct(past, 50), "max": round(past[-1], 1)},
            "wait_200ms_cpu_ms": round(cpu, 2),
            "runner_wall_s": round(wall, 4),
            "runner_modelled_s": round(modelled, 4),
            "runner_ratio": round(wall / modelled, 3),
        }
        rows.append(row)
        w, s = row["wait_until_lateness_us"], row["time_sleep_lateness_us"]
        print(
            f"repeat {k + 1}: wait_until lateness p50 {w['p50']} p99 {w['p99']} max {w['max']} us "
            f"(time.sleep: p50 {s['p50']} p99 {s['p99']} max {s['max']} us); past target returns in "
            f"{row['past_target_return_us']['max']} us at most; 200 ms wait: {row['wait_200ms_cpu_ms']} ms CPU; "
            f"runner {wall:.3f} s for {modelled:.3f} s modelled ({row['runner_ratio']}x)",
            flush=True,
        )

    def med(get) -> float:  # type: ignore[no-untyped-def]
        return round(statistics.median(get(r) for r in rows), 3)

    summary = {
        "wait_until_p50_us": med(lambda r: r["wait_until_lateness_us"]["p50"]),
        "wait_until_max_us": med(lambda r: r["wait_until_lateness_us"]["max"]),
        "time_sleep_p50_us": med(lambda r: r["time_sleep_lateness_us"]["p50"]),
        "past_target_max_us": med(lambda r: r["past_target_return_us"]["max"]),
        "wait_200ms_cpu_ms": med(lambda r: r["wait_200ms_cpu_ms"]),
        "runner_ratio": med(lambda r: r["runner_ratio"]),
    }
    print("medians over the repeats:", summary)
    bars = {
        "wait_until median lateness < 50 us": summary["wait_until_p50_us"] < 50,
        "wait_until max lateness < 10 ms": summary["wait_until_max_us"] < 10_000,
        "a past target returns in < 10 ms": summary["past_target_max_us"] < 10_000,
        "a 200 ms wait costs < 50 ms CPU": summary["wait_200ms_cpu_ms"] < 50,
        "runner within 1.25x (+20 ms) of modelled": all(
            r["runner_modelled_s"] <= r["runner_wall_s"] < 1.25 * r["runner_modelled_s"] + 0.02 for r in rows
        ),
    }
    for bar, met in bars.items():
        print(f"{'met' if met else 'NOT MET'}: {bar}")
    write_json(args.json, {"repeats": rows, "medians": summary, "bars": bars})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
