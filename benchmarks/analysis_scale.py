"""Analysis at scale: wall time (s) and peak RSS (GiB) of the analysis, figures included, over 1 M
request + 10 M engine-step records (bars <= 60 s, <= 4 GiB).

Backs: ../docs/performance.md#analysis-figures-simulator

Generates a synthetic study (tests/synthetic_study.py for the layout: study config,
preflight, run.json, summaries, metrics; then large request and step logs written with
pandas and sealed as the pipeline seals a cell), runs `analyze(results_dir, make_figures)` in a child process, and prints the
child's wall time and peak RSS (resource.getrusage(RUSAGE_CHILDREN).ru_maxrss).

    ctax benchmark analysis_scale                 # temp dir, removed afterwards
    ctax benchmark analysis_scale --dir /tmp/big  # keep the data (re-used when present)
    ctax benchmark analysis_scale --requests 100000 --steps 1000000   # smaller

Exit status 1 when a budget is exceeded.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _common import REPO, parser, positive_int, write_json

from connector_tax.analysis.usable_cells import load_study
from connector_tax.contract import CellFiles, StudyLayout
from connector_tax.contract.index import seal_cell

sys.path.insert(0, str(REPO / "tests"))  # the test-data generator lives with the tests
from synthetic_study import SyntheticSpec, write_study  # noqa: E402

BUDGET_S = 60.0
BUDGET_RSS_GIB = 4.0


def _cells(root: Path) -> list[tuple[CellFiles, CellFiles, str]]:
    """(sealed files, a staging folder for them, fingerprint) of every cell of the study."""
    study = load_study(root)
    layout = StudyLayout(root)
    return [
        (c.files, layout.phase(c.variant, c.phase).staging(c.label), c.summary["fingerprint"]) for c in study.cells()
    ]


def _reseal(final: CellFiles, staging: CellFiles, fingerprint: str) -> None:
    """The bigger records replace the small ones the way the pipeline writes a cell: into
    staging, then sealed (the summary vouches for the new sizes)."""
    staging.folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(final.summary, staging.summary)
    seal_cell(staging, final, fingerprint)


def generate(root: Path, n_requests: int, n_steps: int, seed: int = 7) -> dict[str, int]:
    spec = SyntheticSpec(study="analysis-scale", n_requests=20, n_steps=20, write_reference=True, seed=seed)
    write_study(root, spec)
    cells = _cells(root)
    per_req = -(-n_requests // len(cells))
    per_step = -(-n_steps // len(cells))
    rng = np.random.default_rng(seed)
    total_req = total_steps = 0
    for i, (final, staging, fingerprint) in enumerate(cells):
        phase, label, config = final.phase, final.label, final.folder.parent.name
        tax = spec.ttft_tax.get(config, 0.0)
        warm = per_req // 10
        t0 = 2_000_000_000_000 + i * 10**12
        sched = t0 + np.arange(per_req, dtype=np.int64) * 5_000_000
        send = sched + 40_000
        first = send + (rng.lognormal(np.log(200.0 * (1 + tax)), 0.2, per_req) * 1e6).astype(np.int64)
        last = first + (rng.lognormal(np.log(20.0), 0.2, per_req) * 1e6 * 255).astype(np.int64)
        status = np.where(rng.random(per_req) < 0.002, "error", "ok")
        req = pd.DataFrame(
            {
                "request_id": [f"{phase}_{label}-{k}" for k in range(per_req)],
                "t_scheduled_ns": sched,
                "t_send_ns": send,
                "t_first_token_ns": first,
                "t_last_token_ns": last,
                "prompt_tokens": 4096,
                "completion_tokens": 256,
                "inflight_at_send": rng.integers(0, 64, per_req),
                "warmup": np.arange(per_req) < warm,
                "status": status,
                "error": None,
                "input_len": 4096,
                "output_len": 256,
                "chunks": 256,
                "http_status": 200,
                "worker": rng.integers(0, 4, per_req),
            }
        )
        staging.folder.mkdir(parents=True, exist_ok=True)
        req.to_json(staging.requests, orient="records", lines=True)
        total_req += per_req
        t_steps = np.linspace(sched[0], sched[-1], per_step).astype(np.int64)
        has_conn = config != "plain"
        cb = spec.callback_us.get(config, 0.0) / 3
        steps = pd.DataFrame(
            {
                "t_ns": t_steps,
                "step_id": np.arange(per_step),
                "step_duration_us": np.round(
                    rng.lognormal(np.log(5000.0), 0.2, per_step) + spec.step_tax_us.get(config, 0.0), 3
                ),
                "build_meta_us": np.round(cb * rng.lognormal(0, 0.05, per_step), 3) if has_conn else None,
                "get_finished_us": np.round(cb * rng.lognormal(0, 0.05, per_step), 3) if has_conn else None,
                "start_load_kv_us": np.round(cb * rng.lognormal(0, 0.05, per_step), 3) if has_conn else None,
                "num_running": rng.integers(0, 64, per_step),
                "num_waiting": rng.integers(0, 3, per_step),
                "prefill_tokens": rng.integers(0, 8192, per_step),
                "decode_tokens": rng.integers(0, 64, per_step),
                "forward_us": np.round(rng.lognormal(np.log(4800.0), 0.2, per_step), 3),
                "num_preempted": 0,
                "kv_cache_usage": np.round(rng.random(per_step), 6),
                "source": "sim",
            }
        )
        steps.to_json(staging.engine_step, orient="records", lines=True)
        total_steps += per_step
        # metrics at 1 Hz over the cell's window
        t_m = np.arange(sched[0], sched[-1], 1_000_000_000, dtype=np.int64)
        pd.DataFrame(
            {
                "t_ns": t_m,
                "vllm:num_requests_running": 8.0,
                "vllm:num_requests_waiting": 0.0,
                "vllm:kv_cache_usage_perc": 0.3,
            }
        ).to_json(staging.metrics, orient="records", lines=True)
        _reseal(final, staging, fingerprint)
    (root / ".scale.json").write_text(json.dumps({"requests": total_req, "steps": total_steps, "cells": len(cells)}))
    return {"requests": total_req, "steps": total_steps, "cells": len(cells)}


def run_child(root: Path, figures: bool) -> tuple[float, float, str]:
    code = (
        "import sys, json; from pathlib import Path; from connector_tax.analysis import analyze; "
        "from connector_tax.plots import make_figures; "
        f"out = analyze(Path({str(root)!r}), {'make_figures' if figures else 'None'}); "
        "print(json.dumps({'seconds': out['seconds'], 'figures': len(out['figures']), 'skipped': len(out['skipped_figures'])}))"
    )
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"analysis failed with exit code {proc.returncode}")
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    return wall, rss_kib / (1024 * 1024), proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--dir", type=Path, help="study folder to generate into / re-use (default: a temp dir, removed)")
    p.add_argument(
        "--requests", type=positive_int, default=1_000_000, metavar="N", help="request records (default 1,000,000)"
    )
    p.add_argument(
        "--steps", type=positive_int, default=10_000_000, metavar="N", help="engine-step records (default 10,000,000)"
    )
    p.add_argument("--no-figures", action="store_true", help="analysis only, no figures")
    args = p.parse_args(argv)
    tmp = None
    root = args.dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="ctax-scale-")
        root = Path(tmp) / "analysis-scale"
    try:
        marker = root / ".scale.json"
        if (
            marker.is_file()
            and json.loads(marker.read_text()).get("requests", 0) >= args.requests
            and json.loads(marker.read_text()).get("steps", 0) >= args.steps
        ):
            sizes = json.loads(marker.read_text())
            print(f"re-using {root}: {sizes}")
        else:
            if root.exists():
                shutil.rmtree(root)
            t0 = time.perf_counter()
            sizes = generate(root, args.requests, args.steps)
            print(
                f"generated {sizes['requests']:,} request records and {sizes['steps']:,} step records in "
                f"{sizes['cells']} cells under {root} in {time.perf_counter() - t0:.1f} s"
            )
        size_gib = sum(f.stat().st_size for f in root.rglob("*.jsonl")) / 2**30
        print(f"raw JSONL on disk: {size_gib:.2f} GiB")
        wall, rss_gib, child = run_child(root, figures=not args.no_figures)
        print(f"analysis child: {child}")
        print(
            f"wall time: {wall:.1f} s (budget {BUDGET_S:g} s); peak RSS: {rss_gib:.2f} GiB (budget {BUDGET_RSS_GIB:g} GiB)"
        )
        ok = wall <= BUDGET_S and rss_gib <= BUDGET_RSS_GIB
        print("PASS" if ok else "FAIL")
        write_json(
            args.json,
            {
                "records": sizes,
                "raw_jsonl_gib": round(size_gib, 3),
                "figures": not args.no_figures,
                "wall_s": round(wall, 2),
                "peak_rss_gib": round(rss_gib, 3),
                "budget": {"wall_s": BUDGET_S, "peak_rss_gib": BUDGET_RSS_GIB},
                "passed": ok,
                "analysis_child": json.loads(child),
            },
        )
        return 0 if ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
