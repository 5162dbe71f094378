"""The prefill-admission A/B (configs/admission-ab.yaml): TTFT of short vs long prompts.

    python writeups/admission_ab.py [results/admission-ab]

Reads the Phase A request records only (no server) of the cells the study's contract vouches
for, and prints, per configuration and rate, TTFT p50/p99 of the short and the long prompts of
the long-short-short-short pattern, post warm-up, status ok. Simulated data: the table says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from connector_tax.analysis.usable_cells import load_study
from connector_tax.config import PHASE_A


def ttft_by_length(path: Path) -> dict[int, np.ndarray]:
    by_len: dict[int, list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            r = json.loads(line)
            if r["warmup"] or r["status"] != "ok" or r["t_first_token_ns"] is None:
                continue
            by_len.setdefault(r["input_len"], []).append((r["t_first_token_ns"] - r["t_send_ns"]) / 1e6)
    return {n: np.asarray(v) for n, v in by_len.items()}


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results/admission-ab")
    study = load_study(results)
    print(f"SIMULATED — prefill admission A/B from {results} (TTFT ms, post-warm-up, ok requests)")
    print(f"{'config':6} {'rate':>5} {'short p50':>10} {'short p99':>10} {'long p50':>9} {'long p99':>9}")
    for cell in study.cells(PHASE_A):
        lengths = ttft_by_length(cell.path("requests"))
        if len(lengths) < 2:
            continue
        short, long = lengths[min(lengths)], lengths[max(lengths)]
        print(
            f"{cell.variant:6} {cell.rate:>5g} {np.percentile(short, 50):10.1f} {np.percentile(short, 99):10.1f} "
            f"{np.percentile(long, 50):9.1f} {np.percentile(long, 99):9.1f}"
        )


if __name__ == "__main__":
    main()
