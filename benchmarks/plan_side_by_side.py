"""SIMULATED, virtual time: the study's fixed plan against the adaptive and the tax-precision ones:
cells, GPU-hours, reference rates and H1-H6 calls side by side, and the GPU-hours `ctax plan` and
`ctax plan --predict` estimate for each.

Backs: ../docs/virtual-time.md#the-h20-study-the-fixed-plan-against-the-adaptive-one

    ctax benchmark plan_side_by_side [--config configs/h20-qwen3-coder.yaml] [--out DIR] [--json FILE]
                                     [--tax-target 0.05] [--plans fixed,adaptive,tax]

The fixed plan is the one the study was planned with (docs/study-design.md): every cell warm-up
10 s, then max(60 s, the time to 200 completed requests), up to its cap; every Phase A rate
measured; every Phase B shape run like any cell, saturated or not; no precision target. The
adaptive plan is the config as written (knee pruning, the Phase B overload guard, its precision
target and floors). The tax plan is the adaptive one whose cells stop on the precision of the
taxes they feed (workload.precision: {of: tax, target: --tax-target}): the baseline's cells run
the fixed plan's cell rule first, every other variant's cell is paired with them request by
request and ends once both its taxes are within the target (64 completed requests at least), or
every baseline request is paired. Each plan:

1. `ctax plan` and `ctax plan --predict` on the config as the real study (backend vllm): their
   estimates, before anything of the plan's own runs;
2. the whole study through `snakemake all` with backend sim and sim.clock virtual, on the
   config's hardware profile: every cell computed in virtual time, analysed and reported;
3. its cost: the cells' simulated seconds (each + the plan's 1.5 s of fixed cost), one server
   start-up (--launch-s, the plan's assumption for vLLM) per preflight and per phase job that
   measured anything, as GPU-hours on one GPU; its reference rates, H1-H6 calls and the median
   half-width of its TTFT and TPOT tax intervals.
4. its calls against the first plan's (analysis.hypotheses.compare_calls): the same call; no call
   in either (inconclusive: e.g. a ratio of a tax below what the cells resolve); opposite sides
   of which neither is confident (both intervals reach the threshold: no contradiction, but not
   the same call); DIFFERENT (a call in one only, or only one confident); CONTRADICTS (opposite
   confident calls).

Prints the two side by side (Markdown), with the plan's estimate against each run's cost, and
writes it to DIR/side_by_side.md, its numbers to DIR/side_by_side.json (or --json FILE). The simulator is a model: these are simulated hours.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import REPO, parser, positive_float, snakemake, write_json

from connector_tax.analysis.hypotheses import CALLED, compare_calls

FIXED_CELL_RULE = {"warmup_s": 10, "duration_s": 60, "min_completed": 200}  # docs/study-design.md, "The cell rule"
CELL_FIXED_S = 1.5  # as planning/time_estimate.py counts per cell
HYPOTHESES = ("H1", "H2", "H3", "H4", "H5", "H6")


def fixed_plan(config: dict[str, Any]) -> dict[str, Any]:
    fixed = copy.deepcopy(config)
    workload = fixed["workload"]
    workload.update(FIXED_CELL_RULE)
    workload["precision"] = {"target": None}
    workload["phase_a"]["prune_after_knee"] = False
    workload["phase_b"]["overload_guard"] = False
    return fixed


def tax_plan(config: dict[str, Any], target: float) -> dict[str, Any]:
    out = copy.deepcopy(config)
    out["workload"]["precision"] = {**out["workload"].get("precision", {}), "of": "tax", "target": target}
    return out


def as_real(config: dict[str, Any], study: str) -> dict[str, Any]:
    return {**copy.deepcopy(config), "study": study, "backend": "vllm"}


def as_virtual(config: dict[str, Any], study: str) -> dict[str, Any]:
    out = {**copy.deepcopy(config), "study": study, "backend": "sim"}
    out["sim"] = {**out.get("sim", {}), "clock": "virtual"}
    out.pop("vllm", None)
    return out


def write(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def plan_estimate(config: Path, workdir: Path, predict: bool) -> float:
    """`ctax plan [--predict]`'s GPU-hours for the study as a real one (run from `workdir`, which
    holds no results: the plan has no earlier run to lean on)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"plan{'-predict' if predict else ''}.json"
    argv = [sys.executable, "-m", "connector_tax.cli", "plan", "--config", str(config), "--json", str(out)]
    argv += ["--predict", "--workdir", str(workdir / "predict")] if predict else []
    subprocess.run(argv, cwd=workdir, capture_output=True, text=True, check=True)
    return json.loads(out.read_text())["gpu_hours"]


def run_study(config: Path, folder: Path) -> float:
    t0 = time.monotonic()
    done = subprocess.run(snakemake("all", config=config, directory=folder), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed for {config}:\n{done.stderr[-3000:]}")
    return time.monotonic() - t0


def cost(root: Path, launch_s: float) -> dict[str, Any]:
    """Simulated cell seconds per stage and the launches that measured something."""
    stages: dict[str, float] = {}
    cells = pruned = launches = 0
    for index_path in sorted(root.glob("*/*/run.json")):
        index = json.loads(index_path.read_text())
        measured = [c for c in index["cells"] if c["status"] == "complete"]
        pruned += sum(c["status"] == "pruned" for c in index["cells"])
        launches += bool(measured)
        stage = index["phase"]
        for entry in measured:
            summary = json.loads((index_path.parent / f"summary_{entry['phase']}_{entry['label']}.json").read_text())
            stages[stage] = stages.get(stage, 0.0) + summary["wall_s"] + CELL_FIXED_S
            cells += 1
    status = json.loads((root / "preflight" / "preflight_status.json").read_text())
    preflights = sum(1 for v in status.values() if isinstance(v, dict))
    cell_s = sum(stages.values())
    gpu_s = cell_s + launches * launch_s + preflights * (launch_s + 2.0)
    return {
        "cells": cells,
        "pruned": pruned,
        "launches": launches,
        "preflights": preflights,
        "cell_hours": {k: round(v / 3600, 3) for k, v in stages.items()},
        "cell_hours_total": round(cell_s / 3600, 3),
        "gpu_hours": round(gpu_s / 3600, 3),
    }


def calls(root: Path) -> dict[str, dict[str, Any]]:
    """Each hypothesis's judgement (analysis/hypotheses.json): verdict, confidence (and, on
    perturbed cells, what the interval alone says), the number and its interval, or for a ratio
    that gets no call the denominator tax these cells could not resolve."""
    doc = json.loads((root / "analysis" / "hypotheses.json").read_text())
    out = {}
    for h in doc["hypotheses"]:
        if h["id"] not in HYPOTHESES:
            continue
        den = h.get("resolution")
        if den:
            lo, hi = den["ci"]
            number = f"{den['denominator']} tax {_pct(den.get('value'))} [{_pct(lo)}, {_pct(hi)}] covers 0"
        else:
            number = h["reason"].split(": ")[0] if h["verdict"] in CALLED else ""
        out[h["id"]] = {
            "verdict": h["verdict"],
            "confidence": h.get("confidence"),
            "interval_confidence": h.get("interval_confidence"),
            "number": number,
            "value": h.get("value"),
            "ci": h.get("ci"),
        }
    return out


def shown(call: dict[str, Any]) -> str:
    how = call.get("confidence") or ""
    if call.get("interval_confidence"):
        how += f"; interval: {call['interval_confidence']}"
    return f"{call['verdict']}" + (f" ({how})" if how else "") + (f", {call['number']}" if call["number"] else "")


def comparisons(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Every plan's calls against the first plan's, by compare_calls' kinds."""
    names = list(rows)
    out: dict[str, dict[str, list[str]]] = {}
    for n in names[1:]:
        kinds: dict[str, list[str]] = {}
        for h in HYPOTHESES:
            a, b = rows[names[0]]["calls"].get(h), rows[n]["calls"].get(h)
            if a and b:
                kinds.setdefault(compare_calls(a, b)[0], []).append(h)
        out[n] = kinds
    return out


def interval_widths(root: Path) -> dict[str, float | None]:
    """Median half-width (percentage points) of the study's TTFT and TPOT tax intervals, and how
    many taxes have one."""
    taxes = json.loads((root / "analysis" / "aggregate.json").read_text())["taxes"] or {}
    halves: dict[str, list[float]] = {"ttft_p90": [], "tpot_p90": []}
    total = {"ttft_p90": 0, "tpot_p90": 0}
    entries = [e for e in (taxes.get("phase_a") or {}).values()]
    entries += [c for ph in ("phase_b", "phase_b_prime") for c in ((taxes.get(ph) or {}).get("cells") or {}).values()]
    for entry in entries:
        for per in (entry.get("variants") or {}).values():
            for metric in halves:
                est = per.get(metric) or {}
                if est.get("value") is None:
                    continue
                total[metric] += 1
                if est.get("ci") and None not in est["ci"]:
                    halves[metric].append((est["ci"][1] - est["ci"][0]) / 2 * 100)
    out: dict[str, float | None] = {}
    for metric, values in halves.items():
        values.sort()
        out[f"{metric}_median_pp"] = round(values[len(values) // 2], 2) if values else None
        out[f"{metric}_with_ci"] = f"{len(values)}/{total[metric]}"
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument(
        "--config",
        default=str(REPO / "configs" / "h20-qwen3-coder.yaml"),
        help="the study config (default the checkout's configs/h20-qwen3-coder.yaml)",
    )
    p.add_argument(
        "--out", metavar="DIR", default="/tmp/ctax-plan-side-by-side", help="the plans' studies and the table"
    )
    p.add_argument(
        "--launch-s", type=positive_float, default=150.0, help="one vLLM start-up, seconds (the plan's; default 150)"
    )
    p.add_argument(
        "--tax-target",
        type=positive_float,
        default=0.05,
        help="the tax plan's precision target (half-width of the paired log ratio; default 0.05)",
    )
    p.add_argument(
        "--plans", default="fixed,adaptive,tax", help="which plans, comma-separated (default fixed,adaptive,tax)"
    )
    args = p.parse_args(argv)
    if not Path(args.config).is_file():
        p.error(f"argument --config: {args.config}: no such file")
    base = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    out = Path(args.out)
    rows: dict[str, dict[str, Any]] = {}
    plans = {"fixed": fixed_plan(base), "adaptive": base, "tax": tax_plan(base, args.tax_target)}
    wanted = [name.strip() for name in args.plans.split(",") if name.strip()]
    if not wanted or any(name not in plans for name in wanted):
        p.error(f"argument --plans: {args.plans!r}: choose from fixed, adaptive, tax")
    for name in wanted:
        config = plans[name]
        study = f"{base['study']}-{name}"
        folder = out / name
        real = write(folder / "real.yaml", as_real(config, study))
        rules_only, estimate = plan_estimate(real, folder / "plan", False), plan_estimate(real, folder / "plan", True)
        compute_s = run_study(write(folder / "virtual.yaml", as_virtual(config, study)), folder / "run")
        root = folder / "run" / "results" / study
        reference = json.loads((root / "reference_rates.json").read_text())
        rows[name] = {
            **cost(root, args.launch_s),
            "plan_estimate_gpu_hours": estimate,
            "plan_rules_only_gpu_hours": rules_only,
            "computed_in_s": round(compute_s, 1),
            "ref_safe": reference.get("ref_safe"),
            "ref_load": reference.get("ref_load"),
            "calls": calls(root),
            "intervals": interval_widths(root),
            "report": str(root / "analysis" / "report.md"),
        }
        row = rows[name]
        row["plan_error"] = round(estimate / row["gpu_hours"] - 1, 3)
        row["plan_rules_only_error"] = round(rules_only / row["gpu_hours"] - 1, 3)
        print(f"{name}: {row['gpu_hours']} GPU-h simulated, plan {estimate} ({row['plan_error']:+.0%})", flush=True)
    text = render(rows, args.launch_s)
    print(text)
    (out / "side_by_side.md").write_text(text, encoding="utf-8")
    write_json(
        args.json or out / "side_by_side.json",
        {"config": args.config, "launch_s": args.launch_s, "plans": rows, "against_first": comparisons(rows)},
    )
    return 0


def render(rows: dict[str, dict[str, Any]], launch_s: float) -> str:
    titles = {"fixed": "fixed plan (design)", "adaptive": "adaptive plan (config)", "tax": "tax-precision plan"}
    names = list(rows)
    first = rows[names[0]]

    def line(label: str, cell) -> str:
        return f"| {label} | " + " | ".join(cell(rows[n]) for n in names) + " |"

    lines = [
        "| | " + " | ".join(titles[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
        line("cells measured (pruned)", lambda r: f"{r['cells']} ({r['pruned']})"),
        line("cell time, simulated h", lambda r: str(r["cell_hours_total"])),
        line(f"server start-ups x {launch_s:g} s", lambda r: str(r["launches"] + r["preflights"])),
        line("GPU-hours (one GPU)", lambda r: f"**{r['gpu_hours']}**"),
        line(f"share of the {titles[names[0]]}", lambda r: f"{r['gpu_hours'] / first['gpu_hours']:.0%}"),
        line(
            "`ctax plan --predict` estimate",
            lambda r: f"{r['plan_estimate_gpu_hours']} ({r['plan_error']:+.0%})",
        ),
        line(
            "`ctax plan` estimate, rules only",
            lambda r: f"{r['plan_rules_only_gpu_hours']} ({r['plan_rules_only_error']:+.0%})",
        ),
        line("ref_safe / ref_load (req/s)", lambda r: f"{r['ref_safe']:g} / {r['ref_load']:g}"),
        line(
            "median tax half-width, TTFT p90 (with an interval)",
            lambda r: f"{_pp(r['intervals']['ttft_p90_median_pp'])} ({r['intervals']['ttft_p90_with_ci']})",
        ),
        line(
            "median tax half-width, TPOT p90 (with an interval)",
            lambda r: f"{_pp(r['intervals']['tpot_p90_median_pp'])} ({r['intervals']['tpot_p90_with_ci']})",
        ),
    ]
    for h in HYPOTHESES:
        first_call = first["calls"].get(h)
        cells = []
        for n in names:
            call = rows[n]["calls"].get(h)
            text = "-" if call is None else shown(call).replace("|", "/")
            if n != names[0] and call and first_call:
                text += f" (**{compare_calls(first_call, call)[1]}**)"
            cells.append(text)
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    kinds = comparisons(rows)
    lines.append(
        f"| calls against the {titles[names[0]]} | - | " + " | ".join(_tally(kinds[n]) for n in names[1:]) + " |"
    )
    lines.append(line("computed here in", lambda r: f"{r['computed_in_s']:.0f} s"))
    return "\n".join(lines) + "\n"


def _tally(kinds: dict[str, list[str]]) -> str:
    words = {
        "same": "same call",
        "same_no_call": "no call in either",
        "opposite_within_noise": "opposite sides, neither confident",
        "different": "DIFFERENT",
        "contradicts": "CONTRADICTS",
    }
    return "; ".join(f"{words[k]}: {', '.join(kinds[k])}" for k in words if kinds.get(k))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _pp(value: float | None) -> str:
    return "-" if value is None else f"±{value:.2f} pp"


if __name__ == "__main__":
    sys.exit(main())
