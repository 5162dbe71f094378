"""Send precision and TTFT fidelity of the load generator, on loopback: send lateness p50 / p99 (µs) at
100 and 1,000 req/s against the null server, TTFT excess over the simulator's own (µs, median /
p99), and the generator's CPU per request (ms).

Backs: ../docs/performance.md#load-generator
Backs: ../docs/loadgen.md#the-measurements-behind-its-decisions

    ctax benchmark loadgen_precision [--repeats 5] [--seconds 10] [--cpu-latency held|off|both]
        [--spin adaptive|off|both] [--json FILE]

* Send precision: |t_send - t_scheduled| p50/p99/max at 100 and 1,000 req/s Poisson while
  streaming 64-token responses (bars: p99 <= 100 us and <= 1 ms), against the near-zero-cost
  SSE server (benchmarks/_sse_null_server.py), so the server's CPU does not compete.
* Fidelity: measured TTFT minus the server's own (the simulator's --request-log first-token
  time, joined by request id) at 32 req/s with 256-token streams (bars: median <= 200 us,
  p99 <= 1 ms).

Each measurement is repeated; medians across repeats are printed (the machine is shared).
For fidelity the simulator runs a fast profile so that it keeps up. Servers are placed as the
pipeline places them, on the load generator's plan's server CPUs (off the worker's core);
`--server-cpus any` leaves them unpinned, for comparison. The load generator holds the kernel's
CPU wake-up latency limit at 0 µs as it does by default (`--cpu-latency off` leaves it alone,
`both` measures the two side by side, alternating in every repeat). `--spin off` fires every
request from its timer's wake-up with no spin before it (`spin_us` 0), `both` alternates it with
the worker's adaptive spin: what the spin buys in precision, and what it costs — the load
generator's CPU (its process and its workers, not the server's) per request over each send
precision cell.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import yaml
from _common import REPO, NullServer, SimServer, parser, write_json

from connector_tax.config import Cell
from connector_tax.loadgen.host.affinity import plan_affinity
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions

MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct"


LATENCIES = {"held": 0, "off": None}  # the CPU-latency limit (µs), or None: left alone
SPINS = {"adaptive": LoadgenOptions.spin_us, "off": 0.0}  # the worker's spin budget (µs), or none


@dataclass(frozen=True)
class Arm:
    """One side of a side by side: the CPU-latency limit and the spin, by their names."""

    latency: str
    spin: str

    @property
    def name(self) -> str:
        return f"cpu latency {self.latency}, spin {self.spin}"

    @property
    def tag(self) -> str:  # in the cells' labels and file names
        return f"{self.latency}-{self.spin}"


def start_sim(tmp: Path, request_log: Path, cpus: tuple[int, ...]) -> SimServer:
    """`ctax sim` on a fast profile (so that it keeps up), each request's first-token time logged."""
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    config["sim"] = {
        "hardware_profile": "tiny-fast",
        "hardware": {"step_base_us": 2000, "prefill_token_us": 1, "decode_seq_us": 2},
    }
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return SimServer(["--config", str(path), "--variant", "plain", "--request-log", str(request_log)], cpus)


def generator_cpu_s(servers: set[int]) -> float:
    """CPU seconds used so far by this process and its children, the servers' trees left out."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            if proc.pid in servers or any(parent.pid in servers for parent in proc.parents()):
                continue
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def run(
    url: str,
    out: Path,
    rate: float,
    output_len: int,
    seconds: float,
    label: str,
    arm: Arm,
    model: str = MODEL,
    servers: frozenset[int] = frozenset(),
) -> tuple[list[dict], float]:
    """The cell's records, and the generator's CPU per request over the cell (ms; warm-up and
    drain included alike in every arm)."""
    options = LoadgenOptions(
        url=url,
        model=model,
        inflight_cap=4096,
        timeout_s=60,
        seed=1,
        cpu_latency_us=LATENCIES[arm.latency],
        spin_us=SPINS[arm.spin],
    )
    cell = Cell(
        phase="bench",
        label=label,
        rate=rate,
        shape={"input": 64, "output": output_len},
        warmup_s=1.0,
        duration_s=seconds,
    )
    with LoadGenerator(options) as gen:
        cpu0 = generator_cpu_s(set(servers))
        summary = gen.run_cell(cell, out)
        cpu = generator_cpu_s(set(servers)) - cpu0
    if LATENCIES[arm.latency] is not None and not summary.cpu_latency.held:
        print(f"warning: {summary.cpu_latency.detail}", flush=True)
    records = [json.loads(line) for line in open(out / f"requests_bench_{label}.jsonl")]
    return records, cpu * 1e3 / max(1, len(records))


def lateness(records: list[dict]) -> tuple[float, float, float]:
    lat = np.array([abs(r["t_send_ns"] - r["t_scheduled_ns"]) / 1e3 for r in records if r["t_send_ns"]])
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), float(lat.max())


def fidelity(records: list[dict], request_log: Path) -> tuple[float, float]:
    server = {}
    for line in open(request_log):
        r = json.loads(line)
        server[r["request_id"]] = r["t_first_token_ns"]
    diffs = np.array(
        [
            (r["t_first_token_ns"] - server[r["request_id"]]) / 1e3
            for r in records
            if r["status"] == "ok" and server.get(r["request_id"])
        ]
    )
    return float(np.percentile(diffs, 50)), float(np.percentile(diffs, 99))


def measure(tag: str, cpus: tuple[int, ...], seconds: float, arm: Arm) -> dict[str, tuple]:
    """One repeat of the three measurements in one arm (CPU-latency limit, spin)."""
    row: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        request_log = tmp / "server_requests.jsonl"
        with NullServer(cpus) as null:
            for rate in (100, 1000):
                records, cpu_ms = run(
                    null.url, tmp, rate, 64, seconds, f"p{rate}-{tag}", arm, "null-model", frozenset({null.proc.pid})
                )
                row[str(rate)] = (*lateness(records), cpu_ms)
        with start_sim(tmp, request_log, cpus) as sim:
            records, _ = run(sim.url, tmp, 32, 256, seconds, f"f32-{tag}", arm, servers=frozenset({sim.proc.pid}))
            row["fidelity"] = fidelity(records, request_log)
    return row


def medians(rows: list[dict[str, tuple]]) -> dict[str, dict[str, float]]:
    """Per measurement, the median across repeats of each of its numbers."""
    names = {
        "100": ("p50_us", "p99_us", "max_us", "cpu_ms_per_request"),
        "1000": ("p50_us", "p99_us", "max_us", "cpu_ms_per_request"),
        "fidelity": ("median_us", "p99_us"),
    }
    return {
        key: {n: round(statistics.median(r[key][i] for r in rows), 1) for i, n in enumerate(fields)}
        for key, fields in names.items()
    }


def report(name: str, rows: list[dict[str, tuple]]) -> None:
    med = lambda key, i: statistics.median(r[key][i] for r in rows)  # noqa: E731
    each = ", ".join(f"{r['100'][1]:.0f}" for r in rows)
    print(f"[{name}] medians of {len(rows)} repeats")
    print(
        f"  send lateness at  100 req/s (64-token streams): p50 {med('100', 0):.0f} us, "
        f"p99 {med('100', 1):.0f} us, max {med('100', 2):.0f} us (bar p99 <= 100 us); "
        f"p99 of each repeat: {each}; generator CPU {med('100', 3):.3f} ms/request"
    )
    print(
        f"  send lateness at 1000 req/s (64-token streams): p50 {med('1000', 0):.0f} us, "
        f"p99 {med('1000', 1):.0f} us, max {med('1000', 2):.0f} us (bar p99 <= 1000 us); "
        f"generator CPU {med('1000', 3):.3f} ms/request"
    )
    print(
        f"  TTFT fidelity at 32 req/s (256-token streams): measured - server median {med('fidelity', 0):.0f} us, "
        f"p99 {med('fidelity', 1):.0f} us (bars 200 us / 1000 us)"
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, repeats=5, seconds=10.0, seconds_help="measured seconds per cell")
    p.add_argument(
        "--server-cpus",
        choices=("plan", "any"),
        default="plan",
        help="the servers on the load generator's plan's server CPUs, or unpinned (default plan)",
    )
    p.add_argument(
        "--cpu-latency",
        choices=("held", "off", "both"),
        default="held",
        help="hold /dev/cpu_dma_latency at 0 us (the load generator's default), leave it alone, "
        "or alternate the two in every repeat",
    )
    p.add_argument(
        "--spin",
        choices=("adaptive", "off", "both"),
        default="adaptive",
        help="the worker's adaptive spin before each send (the default), none (fire from the timer's "
        "wake-up), or alternate the two in every repeat",
    )
    args = p.parse_args(argv)
    cpus = plan_affinity(1).server_cpus if args.server_cpus == "plan" else ()
    print(f"servers on CPUs {list(cpus) or 'any'}; load generator plan: {plan_affinity(1)}", flush=True)
    arms = {
        arm.name: arm
        for arm in (
            Arm(latency, spin)
            for latency in (list(LATENCIES) if args.cpu_latency == "both" else [args.cpu_latency])
            for spin in (list(SPINS) if args.spin == "both" else [args.spin])
        )
    }
    names = list(arms)
    rows: dict[str, list[dict[str, tuple]]] = {name: [] for name in names}
    for rep in range(args.repeats):
        # Alternate which goes first, so that a slow minute of the shared machine hits both.
        for name in names if rep % 2 == 0 else names[::-1]:
            rows[name].append(measure(f"{arms[name].tag}-{rep}", cpus, args.seconds, arms[name]))
            print(
                f"repeat {rep} [{name}]: "
                + ", ".join(f"{k} {tuple(round(v, 1) for v in row)}" for k, row in rows[name][-1].items()),
                flush=True,
            )
    for name in names:
        report(name, rows[name])
    write_json(
        args.json,
        {
            "server_cpus": list(cpus),
            "seconds": args.seconds,
            "medians": {name: medians(rows[name]) for name in names},
            "repeats": {
                name: [{k: [round(v, 3) for v in row] for k, row in r.items()} for r in rows[name]] for name in names
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
