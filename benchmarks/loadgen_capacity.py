"""Capacity of the load generator against a near-zero-cost SSE server, side by side with guidellm.

    ctax benchmark loadgen_capacity [--repeats 3] [--seconds 5] [--json /tmp/loadgen_capacity.json]
        [--competitor-venv /tmp/bench-venv]   # a venv with `pip install 'guidellm[perf]'`

The capacity bar (retired since: benchmarks/README.md): the highest streaming request rate each client sustains against
benchmarks/_sse_null_server.py on loopback (64-token streams, answered at once in one write),
and the SSE events per second at that rate; ours should reach >= 3x the best competitor.

Each repeat steps the requested rate upward for every client in turn (ours with 1 worker, ours
with 2 workers, then the competitor), one fresh client process per cell (warm-up + measured
seconds), until two rates in a row fail; the client's capacity is the highest rate that passed.
The machine is shared, so a failing cell is run once more (--retries) before it counts as
failed, for every client alike. The kernel's CPU wake-up latency limit is held at 0 µs for the
whole run (`--cpu-latency off` leaves it alone), so the competitor gets the same polling CPUs that
ours asks for by default.
The pass rule:

* ours (`ctax bench`, fixed arrival by default, affinity on): achieved dispatch rate >= 99% of
  requested, every post-warm-up request ok (no error, timeout or drop), send lateness
  (t_send - t_scheduled) p99 <= 1 ms.
* guidellm (`guidellm run`, constant rate, its own warm-up): successful requests in its measured
  window / window >= 99% of requested and no errors. Its lateness (request_start -
  targeted_start) is reported but not gated, so the comparison favours it.

SSE events/s = completed requests x events per stream (tokens + usage chunk + [DONE]) / measured
seconds; the server's own count of requests served in each cell is recorded as a cross-check.
CPU use of every process involved (server, client main, client workers) and of the whole machine
is sampled with psutil for each cell, so the table can say what saturated first.

guidellm needs a tokenizer for synthetic prompts and this machine has no model hub: the script
builds a small word-level Hugging Face tokenizer in --tokenizer-dir with the competitor's own
`tokenizers`/`transformers` and runs guidellm offline (HF_HUB_OFFLINE=1). Without the competitor
venv it measures ours only and says so. Every child runs in its own process group and is killed
on any exit.
"""

from __future__ import annotations

import atexit
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from _bench_guidellm import PROMPT_TOKENS, find_competitor, run_guidellm
from _bench_procs import MODEL, CpuMonitor, NullServer, kill_all, kill_tree, on_signal, spawn
from _capacity import Ctx, cell_line, saturated, source_state, summarize
from _common import comma_list, parser, positive_float, positive_int, write_json

from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold

RATES = comma_list(positive_float, "rates above 0")
COUNTS = comma_list(positive_int, "whole numbers of 1 or more")
OURS_RATES = "100,200,400,600,800,1000,1200,1600,2000,2400,3200,4000"
COMPETITOR_RATES = "50,100,150,200,250,300,400,600,800,1200,1600"


# -- one cell of ours -------------------------------------------------------------------------
def run_ours(ctx: Ctx, rate: float, workers: int) -> dict[str, Any]:
    a = ctx.args
    out = ctx.tmp / f"ours-w{workers}-r{rate:g}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "connector_tax.cli",
        "bench",
        "--url",
        ctx.server.url,
        "--model",
        MODEL,
        "--rate",
        f"{rate:g}",
        "--arrival",
        "fixed" if a.arrival == "fixed" else "poisson",
        "--input-len",
        str(PROMPT_TOKENS),
        "--output-len",
        str(a.tokens),
        "--duration",
        f"{a.seconds:g}",
        "--warmup",
        f"{a.warmup:g}",
        "--workers",
        str(workers),
        "--timeout",
        "30",
        "--phase",
        "cap",
        "--out",
        str(out),
        "--seed",
        str(ctx.repeat),
    ]
    if a.no_affinity:
        cmd.append("--no-affinity")
    if a.cpu_latency == "off":
        cmd += ["--cpu-latency-us", "off"]
    limit = a.warmup + a.seconds + 90
    s0 = ctx.server.stats()
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mon = CpuMonitor({"client": proc.pid, "server": ctx.server.proc.pid}).start()
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output = ""
    finally:
        kill_tree(proc)
    # The cell proper: its summary's wall seconds, ending when the summary was written.
    summaries = sorted(out.glob("summary_*.json"))
    window = None
    if summaries:
        end = summaries[0].stat().st_mtime
        window = (end - json.loads(summaries[0].read_text())["wall_s"], end)
    cpu = mon.stop(window)
    s1 = ctx.server.stats()
    cell: dict[str, Any] = {
        "client": f"ours-w{workers}",
        "rate": rate,
        "cpu": cpu,
        "server_requests": s1["requests"] - s0["requests"],
    }
    if proc.returncode not in (0, 1) or not summaries:  # 1: a cell invalid, judged below
        cell.update(passed=False, reason=f"ctax bench exit {proc.returncode}: {output.strip()[-300:]}")
        return cell
    s = json.loads(summaries[0].read_text())
    counts, rates = s["counts"], s["rates"]
    achieved = rates["achieved_dispatch_rps"] or 0.0
    lat_p99 = s["lateness_us"]["p99"] or 0.0
    not_ok = counts["post_warmup"] - counts["ok"]
    reasons = []
    if achieved < 0.99 * rate:
        reasons.append(f"achieved {achieved:.1f} < 99% of {rate:g}")
    if not_ok:
        reasons.append(
            f"{not_ok} not ok (err {counts['error']}, timeout {counts['timeout']}, dropped {counts['dropped']})"
        )
    if lat_p99 > a.lateness_p99_us:
        reasons.append(f"lateness p99 {lat_p99:.0f} us > {a.lateness_p99_us:g}")
    measured_s = a.seconds
    cell.update(
        passed=not reasons,
        reason="; ".join(reasons) or None,
        achieved_rps=round(achieved, 2),
        ok=counts["ok"],
        post_warmup=counts["post_warmup"],
        completed_rps=round(counts["ok"] / measured_s, 2),
        events_per_s=round(counts["ok"] * ctx.events_per_stream / measured_s, 1),
        lateness_us={k: s["lateness_us"][k] for k in ("p50", "p99", "max")},
        ttft_ms_p50=s["latency_ms"]["ttft"]["p50"],
        ttft_ms_p99=s["latency_ms"]["ttft"]["p99"],
        loadgen_cpu_frac=s["cpu_frac"],
        validity=s["validity"]["reasons"],
    )
    return cell


# -- sweeps ---------------------------------------------------------------------------------
def sweep(ctx: Ctx, name: str, rates: list[float], run: Callable[[float], dict[str, Any]]) -> dict[str, Any]:
    cells: list[dict[str, Any]] = []
    fails = 0
    note = None
    for rate in rates:
        if time.monotonic() > ctx.deadline:
            note = "time budget spent: sweep cut short"
            print(f"  {name}: {note}", flush=True)
            break
        cell = run(rate)
        print("  " + cell_line(cell), flush=True)
        tries = [cell]
        # The machine is shared: one retry, so that a burst of someone else's load does not end
        # a sweep. Both clients get it alike; every try is kept in the JSON.
        while not cell["passed"] and len(tries) <= ctx.args.retries and time.monotonic() < ctx.deadline:
            cell = run(rate)
            print("  " + cell_line(cell) + "  (retry)", flush=True)
            tries.append(cell)
        if len(tries) > 1:
            cell = dict(
                cell, tries=[{k: t.get(k) for k in ("passed", "reason", "achieved_rps", "lateness_us")} for t in tries]
            )
        cells.append(cell)
        fails = 0 if cell["passed"] else fails + 1
        if fails >= ctx.args.stop_after_failures:
            break
    else:
        if cells and cells[-1]["passed"]:
            note = "passed the highest rate tried: capacity is at least that"
    best = max((c for c in cells if c["passed"]), key=lambda c: c["rate"], default=None)
    first_fail = next((c for c in cells if not c["passed"] and (best is None or c["rate"] > best["rate"])), None)
    return {
        "client": name,
        "capacity_rps": best["rate"] if best else 0.0,
        "events_per_s": best["events_per_s"] if best else 0.0,
        "lateness_p99_us_at_capacity": best["lateness_us"]["p99"] if best else None,
        "first_failure": {"rate": first_fail["rate"], "reason": first_fail["reason"], "cpu": first_fail["cpu"]}
        if first_fail
        else None,
        "saturated_at_first_failure": saturated(first_fail) if first_fail else None,
        "note": note,
        "cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default="/tmp/loadgen_capacity.json", repeats=3, seconds=5.0)
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell (excluded)")
    p.add_argument("--tokens", type=positive_int, default=64, help="tokens (SSE chunks) per stream")
    p.add_argument(
        "--arrival",
        choices=["fixed", "poisson"],
        default="fixed",
        help="fixed (ours) / constant (guidellm), or poisson for both",
    )
    p.add_argument("--rates", type=RATES, default=OURS_RATES, help="our rate steps (req/s)")
    p.add_argument("--workers", type=COUNTS, default="1,2", help="our worker counts to measure")
    p.add_argument("--no-affinity", action="store_true", help="run ours without CPU pinning")
    p.add_argument("--lateness-p99-us", type=float, default=1000.0)
    p.add_argument(
        "--cpu-latency",
        choices=("held", "off"),
        default="held",
        help="hold /dev/cpu_dma_latency at 0 us for the whole run, for every client alike (ours "
        "holds it by default), or leave it alone",
    )
    p.add_argument("--competitor-venv", default="/tmp/bench-venv")
    p.add_argument("--competitor-rates", type=RATES, default=COMPETITOR_RATES)
    p.add_argument(
        "--competitor-procs",
        type=comma_list(int, "whole numbers"),
        default="0",
        help="guidellm worker-process counts to try (0 = its default); best one counts",
    )
    p.add_argument(
        "--competitor-overhead-s", type=float, default=180.0, help="allowance per guidellm run for start-up and report"
    )
    p.add_argument("--no-competitor", action="store_true")
    p.add_argument("--tokenizer-dir", default="/tmp/bench-tok")
    p.add_argument("--server-cpu", type=int, action="append", help="pin the null server (repeatable)")
    p.add_argument("--stop-after-failures", type=int, default=2, help="rates in a row that fail end a sweep")
    p.add_argument("--retries", type=int, default=1, help="re-runs of a failing cell before it counts as failed")
    p.add_argument("--budget-min", type=float, default=40.0, help="overall time budget")
    args = p.parse_args(argv)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    atexit.register(kill_all)

    ours_rates, comp_rates = args.rates, args.competitor_rates
    worker_counts, comp_procs = args.workers, args.competitor_procs

    with tempfile.TemporaryDirectory(prefix="loadgen-capacity-") as tmp_name:
        ctx = Ctx(args, Path(tmp_name))
        competitor_note = "disabled (--no-competitor)"
        if not args.no_competitor:
            ctx.competitor_bin, competitor_note = find_competitor(args)
        print(f"competitor: {competitor_note}", flush=True)
        print(
            f"cells: {args.warmup:g} s warm-up + {args.seconds:g} s measured, {args.tokens}-token streams, "
            f"{args.arrival} arrival; {psutil.cpu_count()} CPUs; repeats {args.repeats}",
            flush=True,
        )
        started = time.time()
        src_before = source_state()
        repeats: list[dict[str, Any]] = []
        cpu_latency = CpuLatencyHold(0 if args.cpu_latency == "held" else None)
        print(f"cpu latency: {cpu_latency.acquire().detail}", flush=True)
        try:
            for rep in range(args.repeats):
                ctx.repeat = rep
                ctx.server = NullServer(args.server_cpu)
                print(f"repeat {rep + 1}/{args.repeats}: null server at {ctx.server.url}", flush=True)
                try:
                    results = {}
                    for w in worker_counts:
                        name = f"ours-w{w}"
                        results[name] = sweep(ctx, name, ours_rates, lambda r, w=w: run_ours(ctx, r, w))
                    if ctx.competitor_bin is not None:
                        for n in comp_procs:
                            name = f"guidellm-p{n or 'default'}"
                            results[name] = sweep(ctx, name, comp_rates, lambda r, n=n: run_guidellm(ctx, r, n))
                finally:
                    ctx.server.close()
                repeats.append(results)
                for res in results.values():
                    print(
                        f"  => {res['client']}: capacity {res['capacity_rps']:g} req/s, "
                        f"{res['events_per_s']:.0f} SSE events/s; first failure: "
                        f"{res['first_failure'] and res['first_failure']['reason']} "
                        f"(saturated: {res['saturated_at_first_failure']})",
                        flush=True,
                    )
        except KeyboardInterrupt:
            print("interrupted: reporting the repeats finished so far", flush=True)
        finally:
            kill_all()
            cpu_latency.release()

    report = summarize(args, repeats, competitor_note, time.time() - started)
    src_after = source_state()
    report["loadgen_source"] = {"before": src_before, "after": src_after}
    if src_after["loadgen_sha256"] != src_before["loadgen_sha256"]:
        print("WARNING: the load generator's sources changed during the run; repeats may differ")
    print()
    write_json(args.json, report)
    return 0 if repeats else 1


if __name__ == "__main__":
    sys.exit(main())
