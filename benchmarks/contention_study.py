"""The default study from empty results, with or without a CPU hog beside it: wall time (s), its six
calls against the truth (right, confident; never wrong and confident), and the contention it
measured (cells busy, invalid, measured again).

Backs: ../docs/performance.md#host-contention
Backs: ../docs/contention.md#the-headline-runs-one-command-each

    ctax benchmark contention_study [--hog none|whole|mid] [--config configs/default.yaml]
        [--attempts N] [--out DIR] [--json FILE]

`--hog whole` starts a busy process (`while True: pass`, named ctax-hog) on every CPU the study
may use before `snakemake --cores 1 all` starts and stops it when the study ends; `--hog mid`
starts it once the study has sealed its first six cells; `--hog none` (the default) runs the
study as it is. Results go to a scratch folder (`--out`, default a new one under /tmp), never to
this checkout's results/. It prints, and writes with --json:

- the wall time of `snakemake --cores 1 all`;
- each call on H1-H6 with its confidence, against the simulator's truth for the default study
  (tests/e2e/test_oracle_truth_default.py: H1, H3, H6 supported; H2, H4, H5 refuted), and whether
  any call is wrong AND confident (the property this study is held to: never);
- the contention the study measured: cells measured while the host was busy, cells that stand
  perturbed, cells measured again, the others' CPU share (median / max over cells), steal, run
  queue; and the host's load average before and after.

The bar on a quiet host with `--hog none`: <= 5 minutes, no invalid cell, six calls right and
confident. Beside a hog: right, or the calls the hog touched say they rest on perturbed cells.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import REPO, Hog, kill_all, parser, snakemake, write_json

# The simulator's own answer for configs/default.yaml (tests/e2e/test_oracle_truth_default.py).
TRUTH = {"H1": "supported", "H2": "refuted", "H3": "supported", "H4": "refuted", "H5": "refuted", "H6": "supported"}


def _sealed(root: Path) -> int:
    return len(list(root.glob("*/phase_*/summary_*.json")))


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default=None)
    p.add_argument("--hog", choices=("none", "whole", "mid"), default="none")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "default.yaml")
    p.add_argument("--attempts", type=int, default=None, help="validity.attempts (default: the config's)")
    p.add_argument("--out", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    a = p.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="ctax-contention-"))
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(a.config.read_text())
    if a.attempts is not None:
        config["validity"] = {**(config.get("validity") or {}), "attempts": a.attempts}
    path = out / "study.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    root = out / "results" / config["study"]
    argv_ = snakemake("all", config=path, directory=out)
    load_before = os.getloadavg()
    hog = Hog() if a.hog == "whole" else None
    hog_started = time.time() if hog else None
    t0 = time.monotonic()
    log = open(out / "snakemake.log", "w")  # noqa: SIM115 - closed below
    try:
        study = subprocess.Popen(argv_, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        while study.poll() is None:
            if a.hog == "mid" and hog is None and _sealed(root) >= 6:
                hog, hog_started = Hog(), time.time()
                print(f"hog started after {time.monotonic() - t0:.0f} s", flush=True)
            time.sleep(0.5)
    finally:
        seconds = time.monotonic() - t0
        if hog is not None:
            hog.close()
        log.close()
        kill_all()
    load_after = os.getloadavg()
    result: dict[str, Any] = {
        "hog": a.hog,
        "out": str(out),
        "returncode": study.returncode,
        "seconds": round(seconds, 1),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "hog_started_after_s": None if hog_started is None else round(hog_started - (time.time() - seconds), 1),
    }
    try:
        hyp = json.loads((root / "analysis" / "hypotheses.json").read_text())
        agg = json.loads((root / "analysis" / "aggregate.json").read_text())
    except (OSError, ValueError) as exc:
        result["error"] = f"no analysis: {exc} (see {out / 'snakemake.log'})"
        print(json.dumps(result, indent=1))
        write_json(a.json, result)
        return 1
    calls = {
        h["id"]: {"verdict": h["verdict"], "confidence": h["confidence"], "truth": TRUTH.get(h["id"])}
        for h in hyp["hypotheses"]
    }
    wrong_confident = [k for k, c in calls.items() if c["confidence"] == "confident" and c["verdict"] != c["truth"]]
    result.update(
        calls=calls,
        right=sum(c["verdict"] == c["truth"] for c in calls.values()),
        confident=sum(c["confidence"] == "confident" for c in calls.values()),
        wrong_and_confident=wrong_confident,
        perturbed_calls=hyp.get("perturbed_calls"),
        reference={k: hyp["reference"].get(k) for k in ("ref_safe", "ref_load", "ref_safe_perturbed")},
        contention={k: v for k, v in (agg.get("contention") or {}).items() if k != "perturbed"},
    )
    print(
        f"default study, hog {a.hog}: {seconds:.0f} s (load {load_before[0]:.1f} -> {load_after[0]:.1f}); results in {out}"
    )
    for k, c in calls.items():
        mark = "" if c["verdict"] == c["truth"] else "  <- not the truth"
        print(f"  {k}: {c['verdict']} ({c['confidence']}); truth {c['truth']}{mark}")
    c = result["contention"]
    print(
        f"  cells {c.get('cells')}: host busy {c.get('host_busy')}, stand invalid {c.get('invalid')}, measured again "
        f"{c.get('measured_again')}; others' CPU median/max {c.get('others_cpu_frac')}; steal max "
        f"{(c.get('steal_frac') or {}).get('max')}; ref_safe {result['reference']['ref_safe']}"
    )
    print(f"  wrong and confident: {wrong_confident or 'none'}")
    write_json(a.json, result)
    return 0 if not wrong_confident and study.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
