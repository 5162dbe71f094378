"""Where the launch-to-launch variance of the real CPU engine comes from: plain vLLM launched N times
in two placements, the decode and prefill step's sd between launches (%), and the share of it (R²)
each candidate cause explains.

Backs: ../docs/replicates.md#what-the-launch-variance-is-made-of-on-this-host
Backs: ../docs/performance.md#studies

    ctax benchmark launch_variance [--launches 8] [--rate 8] [--seconds 20]
        [--config configs/vllm-cpu-tiny.yaml] [--out DIR] [--json FILE]
    ctax benchmark launch_variance --analyze DIR     # the tables again from a finished run

Two configurations of plain vLLM on this host's CPU, each launched `--launches` times, interleaved
(round i: today, pinned; round i+1: pinned, today), every launch one Phase A cell at `--rate` of
the CPU study's shape through the study's own pipeline (`snakemake ... phase_a_plain_rep<i>`, a
scratch folder per configuration), so every launch sends the same requests (common random
numbers: the same seed, cell and replicate):

* **today**: the CPU study as configured (the worker's OpenMP threads bound to core 1, everything
  else where the kernel puts it);
* **pinned**: the same with `vllm.cpu.service_cpus: "0"` (serving/placement.py: every other server
  thread, and the load generator, on core 0).

Per launch, from the instrumentation's engine steps (thousands): the decode step and the prefill
step against the pooled median of their batch composition (decoding sequences; prefill tokens),
as a log index with its within-launch standard error (steps are correlated: lag-1 corrected);
TTFT and TPOT p90 and means. Beside them the candidate causes, from the probe
(benchmarks/_launch_probe.py) over the cell's window: CPU-seconds per second that anything but
the model's compute thread ran on the compute core (the server's API, engine core and worker
threads each, and the rest of the host), whether the compute thread stayed on its core, the
worker's huge pages and NUMA pages, steal, the CPUs' frequency, the launch's position in the
sitting, the host's process count and its youngest other process; and the host's speed over the
cell (`host_speed_log`: a 1 % probe of interpreter work on core 0, _launch_probe.SpeedProbe; the
drift it follows: `ctax benchmark host_drift`).

The decomposition: each configuration's launch-to-launch spread of the decode and prefill index
(its variance, less the mean within-launch variance: the part launches add), and per candidate the
share of the launches' variance it explains (R² of the index on it across launches, within
configuration, and its slope), the configuration itself included.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _common import REPO, parser, positive_float, positive_int, run_logged, snakemake, write_json
from _launch_probe import Probe, SpeedProbe, host_speed

from connector_tax.analysis.batchmeans import t975

CONFIGS = ("today", "pinned")
COMPUTE_CORE = "1"
SERVICE_CORE = "0"  # where the pinned configuration puts the server's other threads and the load generator


def _configs(base: dict[str, Any], launches: int, rate: float, seconds: float) -> dict[str, dict[str, Any]]:
    out = {}
    for name in CONFIGS:
        c = copy.deepcopy(base)
        c["study"] = f"launch-variance-{name}"
        c["variants"] = [{"name": "plain"}]
        if c["model"].get("local"):
            c["model"]["name"] = str((REPO / c["model"]["name"]).resolve())
        w = c["workload"]
        w.update(replicates=launches, aa_control=False, duration_s=seconds, min_completed=64)
        w.pop("phase_b_prime", None)
        w["phase_a"] = {**w["phase_a"], "rates": [rate], "prune_after_knee": False}
        if name == "pinned" and c.get("backend") == "vllm":  # (the simulator: a dry run of the benchmark)
            c["vllm"]["cpu"]["service_cpus"] = "0"
        out[name] = c
    return out


def _run_launch(folder: Path, config_path: Path, replicate: int) -> tuple[int, float]:
    target = "phase_a_plain" if replicate == 1 else f"phase_a_plain_rep{replicate}"
    return run_logged(snakemake(target, config=config_path, directory=folder), folder / "snakemake.log")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _phase_dir(out: Path, name: str, rep: int) -> Path:
    return out / name / "results" / f"launch-variance-{name}" / "plain" / ("phase_a" if rep == 1 else f"phase_a.r{rep}")


def _index(values: np.ndarray) -> tuple[float, float]:
    """(mean log ratio, its standard error with lag-1 correlation)."""
    n = values.size
    if n < 10:
        return math.nan, math.nan
    phi = float(np.corrcoef(values[:-1], values[1:])[0, 1]) if n > 2 else 0.0
    phi = min(max(phi, 0.0), 0.95)
    se = float(values.std(ddof=1)) / math.sqrt(n) * math.sqrt((1 + phi) / (1 - phi))
    return float(values.mean()), se


def _steps(folder: Path) -> list[dict[str, Any]]:
    files = sorted(folder.glob("engine_step_phase_a_*.jsonl"))
    return [s for s in _jsonl(files[0]) if s.get("engine_step_us")] if files else []


def _cell(folder: Path) -> dict[str, Any]:
    reqs = [r for f in folder.glob("requests_phase_a_*.jsonl") for r in _jsonl(f)]
    ok = [r for r in reqs if r.get("status") == "ok" and not r.get("warmup") and r.get("t_first_token_ns")]
    if not ok:
        return {}
    ttft = np.array([(r["t_first_token_ns"] - r["t_send_ns"]) / 1e6 for r in ok])
    tpot = np.array(
        [
            (r["t_last_token_ns"] - r["t_first_token_ns"]) / 1e6 / (r["completion_tokens"] - 1)
            for r in ok
            if (r.get("completion_tokens") or 0) > 1
        ]
    )
    return {
        "window_ns": [min(r["t_send_ns"] for r in ok), max(r["t_last_token_ns"] for r in ok)],
        "requests": len(ok),
        "ttft_p90_ms": float(np.percentile(ttft, 90)),
        "tpot_p90_ms": float(np.percentile(tpot, 90)),
        "ttft_mean_ms": float(ttft.mean()),
        "tpot_mean_ms": float(tpot.mean()),
    }


def _probe_window(records: list[dict[str, Any]], window: list[int]) -> dict[str, Any]:
    """The candidates over [t0, t1] from the probe's records."""
    recs = [r for r in records if "cpus" in r and window[0] <= r["t_ns"] <= window[1]]
    if len(recs) < 3:
        return {}
    secs = (recs[-1]["t_ns"] - recs[0]["t_ns"]) / 1e9
    clk = next((r["clk_tck"] for r in records if "clk_tck" in r), 100)
    on_compute: dict[str, float] = {}
    compute_off = compute_samples = 0
    prev: dict[int, tuple[int, str]] = {}
    for rec in recs:
        for proc in rec["procs"]:
            for t in proc["threads"]:
                is_compute = t["allowed"] == COMPUTE_CORE and proc["role"] == "worker"
                key = "compute" if is_compute else proc["role"]
                if is_compute:
                    compute_samples += 1
                    compute_off += str(t["cpu"]) != COMPUTE_CORE
                last = prev.get(t["tid"])
                prev[t["tid"]] = (t["ticks"], key)
                if last is not None and str(t["cpu"]) == COMPUTE_CORE:
                    on_compute[key] = on_compute.get(key, 0.0) + (t["ticks"] - last[0]) / clk
    cpu = f"cpu{COMPUTE_CORE}"
    busy = (recs[-1]["cpus"][cpu][0] - recs[0]["cpus"][cpu][0]) / clk
    steal = sum(recs[-1]["cpus"][c][1] - recs[0]["cpus"][c][1] for c in recs[0]["cpus"]) / clk
    server_on = sum(on_compute.values())
    slow = [r for r in records if "memory" in r and window[0] - 10e9 <= r["t_ns"] <= window[1]]
    worker_mem = [
        m for r in slow for p in r["procs"] if p["role"] == "worker" for m in [r["memory"].get(str(p["pid"]))] if m
    ]
    freq = [f for r in slow for f in (r.get("freq_mhz") or [])]
    others = next((r["others"] for r in slow if r.get("others")), {})
    out = {f"{k}_on_compute_core": v / secs for k, v in on_compute.items() if k != "compute"}
    out.update(
        compute_thread_off_core=compute_off / compute_samples if compute_samples else None,
        compute_core_busy=busy / secs,
        host_on_compute_core=max(0.0, busy - server_on) / secs,
        steal=steal / secs,
        worker_anon_huge_mb=worker_mem[-1]["kb"].get("AnonHugePages", 0) / 1024 if worker_mem else None,
        worker_numa_nodes=len(worker_mem[-1]["numa_pages"]) if worker_mem else None,
        freq_mhz=float(np.mean(freq)) if freq else None,
        host_processes=others.get("count"),
        youngest_other_s=others.get("youngest_s"),
    )
    return out


def analyze(out: Path, order: list[tuple[str, int]]) -> dict[str, Any]:
    records = _jsonl(out / "probe.jsonl")
    speed = _jsonl(out / "speed.jsonl")
    launches = []
    for position, (name, rep) in enumerate(order, 1):
        folder = _phase_dir(out, name, rep)
        cell, steps = _cell(folder), _steps(folder)
        if not cell or not steps:
            launches.append(
                {"config": name, "replicate": rep, "position": position, "error": f"no records in {folder}"}
            )
            continue
        run = json.loads((folder / "run.json").read_text())
        launches.append(
            {
                "config": name,
                "replicate": rep,
                "position": position,
                **cell,
                "steps": steps,
                "placement": (run.get("placement") or {}).get("server_threads"),
                "candidates": {
                    "position": position,
                    **_probe_window(records, cell["window_ns"]),
                    "host_speed_log": host_speed(speed, cell["window_ns"]),
                },
            }
        )
    good = [x for x in launches if "error" not in x]
    # step indices against the pooled median of each composition
    for kind, key in (
        ("decode", lambda s: (0, s["decode_tokens"])),
        ("prefill", lambda s: (min(s["prefill_tokens"] // 256, 8), 0)),
    ):
        pool: dict[Any, list[float]] = {}
        pick = (
            (lambda s: not s.get("prefill_tokens") and s.get("decode_tokens"))
            if kind == "decode"
            else (lambda s: s.get("prefill_tokens"))
        )
        for x in good:
            for s in x["steps"]:
                if pick(s):
                    pool.setdefault(key(s), []).append(s["engine_step_us"])
        med = {k: float(np.median(v)) for k, v in pool.items() if len(v) >= 20}
        for x in good:
            logs = np.array(
                [math.log(s["engine_step_us"] / med[key(s)]) for s in x["steps"] if pick(s) and key(s) in med]
            )
            x[f"{kind}_steps"], (x[f"{kind}_index"], x[f"{kind}_se"]) = int(logs.size), _index(logs)
    for x in good:
        x.pop("steps")
    return {"launches": launches, "decomposition": decompose(good), "aa": aa_widths(good)}


def _r2(y: np.ndarray, x: np.ndarray) -> tuple[float, float] | None:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 4 or np.std(x[ok]) == 0:
        return None
    slope, _ = np.polyfit(x[ok], y[ok], 1)
    r = float(np.corrcoef(x[ok], y[ok])[0, 1])
    return r * r, float(slope)


def decompose(launches: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("decode_index", "prefill_index"):
        se = metric.replace("index", "se")
        per: dict[str, Any] = {}
        for name in CONFIGS:
            y = np.array([x[metric] for x in launches if x["config"] == name and math.isfinite(x[metric])])
            w = np.array([x[se] ** 2 for x in launches if x["config"] == name and math.isfinite(x[metric])])
            if y.size >= 2:
                total = float(y.var(ddof=1))
                per[name] = {
                    "launches": int(y.size),
                    "sd_between_launches_pct": 100 * math.sqrt(total),
                    "within_launch_sd_pct": 100 * math.sqrt(float(w.mean())),
                    "launch_sd_pct": 100 * math.sqrt(max(0.0, total - float(w.mean()))),
                    "range_pct": [100 * (math.exp(y.min() - y.mean()) - 1), 100 * (math.exp(y.max() - y.mean()) - 1)],
                }
        # candidates: y demeaned within configuration, so a candidate explains launches, not the config
        ys = np.array([x[metric] for x in launches])
        names = sorted({k for x in launches for k, v in x["candidates"].items() if isinstance(v, (int, float))})
        demean = ys.copy()
        for name in CONFIGS:
            m = np.array([x["config"] == name for x in launches])
            if m.any():
                demean[m] = ys[m] - np.nanmean(ys[m])
        cand = {}
        for k in names:
            xs = np.array(
                [float(x["candidates"].get(k)) if x["candidates"].get(k) is not None else np.nan for x in launches]
            )
            fit = _r2(demean, xs)
            if fit:
                cand[k] = {"r2_within_config": round(fit[0], 3), "slope_pct_per_unit": round(100 * fit[1], 3)}
        config_dummy = np.array([1.0 if x["config"] == "pinned" else 0.0 for x in launches])
        fit = _r2(ys, config_dummy)
        out[metric] = {"per_config": per, "candidates": cand, "config_r2": round(fit[0], 3) if fit else None}
    return out


AA_VARIANTS = 7  # the replicated CPU study: six measured variants and the A/A control (df (V-1)(k-1))
TARGETS = {"ttft_p90_ms": 0.10, "tpot_p90_ms": 0.05}  # the A/A half-widths sought at ref_safe (docs/replicates.md)


def aa_widths(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration and metric: the sd of one launch's log p90 across its launches (every
    launch the same requests, so this is what two launches of plain differ by: the A/A control's
    paired log ratio has variance 2 sd²), and the A/A half-width the analysis would give at k
    launches per variant (analysis/launch_intervals.py: t at (V-1)(k-1) df times sqrt(2 sd²/k)),
    with the fewest k that reach TARGETS."""
    out: dict[str, Any] = {}
    for name in CONFIGS:
        per: dict[str, Any] = {}
        for metric, target in TARGETS.items():
            logs = np.log([x[metric] for x in launches if x["config"] == name])
            if logs.size < 3:
                continue
            sd = float(logs.std(ddof=1))
            half = {k: math.expm1(t975((AA_VARIANTS - 1) * (k - 1)) * math.sqrt(2 * sd**2 / k)) for k in range(2, 17)}
            reach = next((k for k, h in half.items() if h <= target), None)
            per[metric] = {
                "launch_sd_log": round(sd, 4),
                "aa_half_width_k2": round(half[2], 4),
                "launches_for_target": reach,
                "target": target,
            }
        out[name] = per
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default=None)
    p.add_argument("--launches", type=positive_int, default=8, help="launches per configuration (default 8)")
    p.add_argument("--rate", type=positive_float, default=8.0, help="the cell's rate, req/s (default 8)")
    p.add_argument("--seconds", type=positive_float, default=20.0, help="the cell's duration floor (default 20)")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "vllm-cpu-tiny.yaml")
    p.add_argument("--out", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    p.add_argument("--analyze", type=Path, default=None, metavar="DIR", help="only the analysis of a finished run")
    a = p.parse_args(argv)
    if a.analyze:
        state = json.loads((a.analyze / "order.json").read_text())
        result = analyze(a.analyze, [tuple(x) for x in state["order"]])
        print(render(result))
        write_json(a.json, result)
        return 0
    out = a.out or Path(tempfile.mkdtemp(prefix="ctax-launch-variance-"))
    out.mkdir(parents=True, exist_ok=True)
    configs = _configs(yaml.safe_load(a.config.read_text()), a.launches, a.rate, a.seconds)
    paths = {}
    for name, c in configs.items():
        (out / name).mkdir(exist_ok=True)
        paths[name] = out / name / "study.yaml"
        paths[name].write_text(yaml.safe_dump(c, sort_keys=False))
    order = [(n, i) for i in range(1, a.launches + 1) for n in (CONFIGS if i % 2 else CONFIGS[::-1])]
    (out / "order.json").write_text(json.dumps({"order": order, "load_before": os.getloadavg()}))
    probe = Probe(out / "probe.jsonl").start()
    speed = SpeedProbe(out / "speed.jsonl", int(SERVICE_CORE)).start()
    times = []
    try:
        for name, rep in order:
            rc, secs = _run_launch(out / name, paths[name], rep)
            times.append({"config": name, "replicate": rep, "returncode": rc, "seconds": round(secs, 1)})
            print(f"  {name} launch {rep}: rc {rc}, {secs:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        probe.stop()
        speed.stop()
    result = analyze(out, order)
    result.update(runs=times, out=str(out), load_after=os.getloadavg())
    print(render(result))
    write_json(a.json, result)
    return 0


def render(result: dict[str, Any]) -> str:
    lines = []
    for x in result["launches"]:
        if "error" in x:
            lines.append(f"  {x['config']:7} {x['replicate']:2}: {x['error']}")
            continue
        c = x["candidates"]
        lines.append(
            f"  {x['config']:7} {x['replicate']:2}: decode {100 * (math.exp(x['decode_index']) - 1):+6.1f}% "
            f"({x['decode_steps']} steps, se {100 * x['decode_se']:.1f}%), prefill {100 * (math.exp(x['prefill_index']) - 1):+6.1f}% "
            f"({x['prefill_steps']}), TTFT p90 {x['ttft_p90_ms']:.1f} ms, TPOT p90 {x['tpot_p90_ms']:.2f} ms; on the compute "
            f"core: api {c.get('api_on_compute_core', 0):.3f}, engine {c.get('engine_on_compute_core', 0):.3f}, worker "
            f"{c.get('worker_on_compute_core', 0):.3f}, host {c.get('host_on_compute_core') or 0:.3f} cores; steal "
            f"{c.get('steal') or 0:.3f}; huge pages {c.get('worker_anon_huge_mb')} MB"
        )
    for metric, d in result["decomposition"].items():
        lines.append(f"{metric}: config R² {d['config_r2']}")
        for name, v in d["per_config"].items():
            lines.append(
                f"  {name}: between launches sd {v['sd_between_launches_pct']:.2f}% (within-launch {v['within_launch_sd_pct']:.2f}%,"
                f" launch part {v['launch_sd_pct']:.2f}%), range {v['range_pct'][0]:+.1f}..{v['range_pct'][1]:+.1f}%"
            )
        for k, v in sorted(d["candidates"].items(), key=lambda kv: -kv[1]["r2_within_config"]):
            lines.append(f"    {k:32} R² {v['r2_within_config']:.2f}, slope {v['slope_pct_per_unit']:+.2f}% per unit")
    for name, per in result.get("aa", {}).items():
        for metric, v in per.items():
            lines.append(
                f"A/A {name} {metric}: one launch's sd {100 * v['launch_sd_log']:.1f}% (log), half-width at 2 launches "
                f"per variant ±{100 * v['aa_half_width_k2']:.1f}% (target ±{100 * v['target']:.0f}%: "
                f"{v['launches_for_target'] or '>16'} launches)"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
