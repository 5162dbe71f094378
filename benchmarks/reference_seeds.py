"""SIMULATED: the default study over many seeds: in how many it picks the truth's reference rates, how
many of its six calls are right and confident, and each study's wall time (s).

Backs: ../docs/performance.md#studies
Backs: ../docs/simulator.md#a-real-run-against-the-truth

    ctax benchmark reference_seeds [--seeds 10] [--clock virtual|real] [--jobs 2]
        [--config configs/default.yaml] [--out DIR] [--json FILE]

The truth first: the true reference rates (`ctax truth --true-reference`: the study's own
saturation criteria on the oracle's steady-state cells at every Phase A rate,
oracle/true_reference.py) and the true H1-H6 at those rates (the oracle, as
tests/e2e/test_oracle_truth_default.py computes them). Then, for each seed, the whole study through
its real entry point (`snakemake --cores 1 all`, in a scratch folder, the study's seed replaced:
other arrival times and prompts), in virtual time by default (`--clock virtual`: minutes for ten
seeds; the statistics of the study's short cells, without HTTP, the load generator or the host) or
in real time (`--clock real`: the user's study, ~5 min a seed, on a quiet host only). Per seed:
the reference rates it picked, each call with its confidence against the truth, and which calls
rest on a tax without an interval.

The goal: the truth's reference rates in >= 9 of 10 seeds, every call right and
confident (so every tax behind it with an interval).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from _common import REPO, parser, positive_int, run_logged, snakemake, write_json

from connector_tax.analysis import constants as K
from connector_tax.config import StudyConfig, load_config
from connector_tax.contract.summary import read_summary_file
from connector_tax.oracle.true_reference import true_reference
from connector_tax.oracle.truth import TruthSettings, truth


def _truth(config_path: Path, jobs: int) -> dict[str, Any]:
    study = StudyConfig.from_mapping(load_config(config_path))
    found = true_reference(study, TruthSettings(requests=2000, warmup=200, min_replications=4, jobs=jobs))
    reference = {"ref_safe": float(found["ref_safe"]), "ref_load": float(found["ref_load"])}
    names = [n for n in study.names if n in (K.PLAIN, K.NOOP, K.MOONCAKE_BOTH, K.NIXL_BOTH, K.LMCACHE_ONLY, K.MULTI)]
    doc = truth(
        study,
        reference,
        names,
        TruthSettings(requests=1000, warmup=100, min_replications=4, max_replications=4, jobs=jobs),
    )
    return {
        "reference": reference,
        "saturation": {n: v["saturation_rate"] for n, v in found["per_variant"].items()},
        "calls": {h: v["verdict"] for h, v in doc["hypotheses"].items()},
    }


def _one(config: dict[str, Any], seed: int, clock: str, out: Path) -> dict[str, Any]:
    """One study from empty results in out/s<seed>: its reference rates, calls and time."""
    folder = out / f"s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**config, "seed": seed, "study": f"{config['study']}-s{seed}"}
    if clock == "virtual":
        cfg["sim"] = {**(cfg.get("sim") or {}), "clock": "virtual"}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rc, seconds = run_logged(snakemake("all", config=path, directory=folder), folder / "snakemake.log")
    root = folder / "results" / cfg["study"]
    try:
        hyp = json.loads((root / "analysis" / "hypotheses.json").read_text())
    except (OSError, ValueError) as exc:
        return {"seed": seed, "returncode": rc, "seconds": round(seconds, 1), "error": f"no analysis: {exc}"}
    ref = hyp["reference"]
    return {
        "seed": seed,
        "returncode": rc,
        "seconds": round(seconds, 1),
        "cell_s": round(_cell_seconds(root), 1),
        "reference": {"ref_safe": ref.get("ref_safe"), "ref_load": ref.get("ref_load")},
        "calls": {h["id"]: {"verdict": h["verdict"], "confidence": h["confidence"]} for h in hyp["hypotheses"]},
    }


def _cell_seconds(root: Path) -> float:
    """The measuring time of a study: its sealed cells' wall times (warm-up, floor, drain), in
    the study's clock. A virtual run's total is what the same cells take in real time, so a change
    to the cell rules can be costed in minutes for ten seeds before the user's clock pays for it."""
    summaries = (read_summary_file(path) for path in root.glob("*/phase_*/summary_*.json"))
    return sum(s.wall_s or 0.0 for s in summaries if s is not None)


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default=None)
    p.add_argument("--seeds", type=positive_int, default=10, help="studies, seeds first-seed.. (default 10)")
    p.add_argument("--first-seed", type=int, default=1, help="the first study seed (default 1)")
    p.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    p.add_argument(
        "--jobs", type=positive_int, default=1, help="studies side by side (virtual only) and truth processes"
    )
    p.add_argument("--config", type=Path, default=REPO / "configs" / "default.yaml")
    p.add_argument("--out", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    a = p.parse_args(argv)
    if a.clock == "real" and a.jobs > 1:
        p.error("--jobs: real-time studies run one at a time (each measures the host)")
    out = a.out or Path(tempfile.mkdtemp(prefix="ctax-refseeds-"))
    config = yaml.safe_load(a.config.read_text())
    load_before = os.getloadavg()
    t0 = time.monotonic()
    true = _truth(a.config, a.jobs)
    print(
        f"truth: ref_safe {true['reference']['ref_safe']:g}, ref_load {true['reference']['ref_load']:g} "
        f"(saturation rates {true['saturation']}); calls {true['calls']} ({time.monotonic() - t0:.0f} s)",
        flush=True,
    )
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    with ThreadPoolExecutor(a.jobs if a.clock == "virtual" else 1) as pool:
        runs = list(pool.map(lambda s: _one(config, s, a.clock, out), seeds))
    rows = []
    for r in runs:
        if "error" in r:
            print(f"  seed {r['seed']}: {r['error']}")
            rows.append({**r, "reference_right": False, "calls_right": 0, "confident": 0})
            continue
        right_ref = all(float(r["reference"][k] or 0) == true["reference"][k] for k in ("ref_safe", "ref_load"))
        right = [h for h, c in r["calls"].items() if c["verdict"] == true["calls"].get(h)]
        confident = [h for h, c in r["calls"].items() if c["confidence"] == "confident"]
        unbounded = [h for h, c in r["calls"].items() if c["confidence"] == "no interval"]
        rows.append(
            {
                **r,
                "reference_right": right_ref,
                "calls_right": len(right),
                "confident": len(confident),
                "no_interval": unbounded,
            }
        )
        print(
            f"  seed {r['seed']}: ref_safe {r['reference']['ref_safe']:g} ref_load {r['reference']['ref_load']:g}"
            f"{'' if right_ref else '  <- not the truth'}; calls right {len(right)}/6, confident {len(confident)}/6"
            f"{'; no interval: ' + ','.join(unbounded) if unbounded else ''}; {r['seconds']:.0f} s "
            f"(cells {r['cell_s']:.0f} s)",
            flush=True,
        )
    summary = {
        "reference_right": sum(r["reference_right"] for r in rows),
        "all_calls_right_and_confident": sum(r["calls_right"] == 6 and r["confident"] == 6 for r in rows),
        "seeds": len(rows),
    }
    print(
        f"{a.clock} time, {len(rows)} seeds: reference rates of the truth in {summary['reference_right']}; "
        f"six calls right and confident in {summary['all_calls_right_and_confident']} "
        f"(load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}; results in {out})"
    )
    write_json(a.json, {"clock": a.clock, "truth": true, "runs": rows, "summary": summary, "out": str(out)})
    return 0 if summary["reference_right"] * 10 >= 9 * len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
