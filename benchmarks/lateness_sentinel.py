"""What a late send says about a cell, read back from finished studies (no server run): each cell's
TTFT p50 and p90 over the same cell's in the other runs (ratio), by its send lateness, and whether
the cells invalid for lateness alone are slower (share above +4 %, one-sided Mann-Whitney).

Backs: ../docs/contention.md#what-the-default-studys-late-sends-are-and-why-they-are-measured-again-2026-12-02

Given the results folders of several runs of one study (`results/<study>` of each clone), for
every cell measured in real time:

- per request, its TTFT against its cell's median, by how late that request itself was sent
  (TTFT is timed from the actual send, so a late send alone does not lengthen it);
- per cell, its TTFT p50 and p90 against the same cell of the other runs (the median of the
  others: leave one out), by the cell's send-lateness p90;
- the cells that stand invalid only for lateness against the valid ones: the share above +4 %
  and a one-sided Mann-Whitney test of their p50 ratios.

If late cells are slower, lateness marks a stall that hit the server as well as the load
generator, and a cell invalid for it is a perturbation, not the instrument's own fault
(docs/contention.md). Cells of one variant and cell name are peers only with at least
`--min-peers` valid runs.

    ctax benchmark lateness_sentinel /tmp/run1/results/default /tmp/run2/results/default ...
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _common import parser, positive_int, write_json
from scipy.stats import mannwhitneyu, spearmanr

from connector_tax.contract.records import RequestRecord, decode_lines
from connector_tax.contract.summary import CellSummary, read_summary_file

LATENESS_CHECKS = {"lateness_ttft_frac", "lateness_gap_frac", "lateness_max_us", "lateness_p99_us"}
REQUEST_BINS_US = (0.0, 50.0, 200.0, 1_000.0, float("inf"))
CELL_BINS_US = (0.0, 50.0, 150.0, 220.0, float("inf"))
SLOWER = 1.04  # a p50 ratio above this is counted as slower (valid cells' spread: ~5 %)


def _cells(roots: list[Path]) -> list[tuple[str, Path, CellSummary]]:
    """(variant/cell, summary path, summary) of every real-time cell of every run."""
    out = []
    for root in roots:
        for path in sorted(root.glob("*/phase_*/summary_*.json")):
            s = read_summary_file(path)
            if s is None or s.host is None or not s.host.measured:
                continue  # virtual time: no send was late
            cell = path.stem.removeprefix("summary_")
            out.append((f"{path.parts[-3]}/{cell}", path, s))
    return out


def _requests(summary_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT / the cell's median, send lateness in µs) of a cell's measured requests."""
    path = summary_path.with_name(summary_path.name.replace("summary_", "requests_").replace(".json", ".jsonl"))
    ttft, late = [], []
    for r in decode_lines(path, RequestRecord):
        if r.warmup or r.status != "ok" or r.t_first_token_ns is None or r.t_send_ns is None:
            continue
        ttft.append((r.t_first_token_ns - r.t_send_ns) / 1e6)
        late.append((r.t_send_ns - r.t_scheduled_ns) / 1e3)
    t = np.asarray(ttft)
    return (t / np.median(t) if len(t) else t), np.asarray(late)


def _describe(x: np.ndarray) -> dict[str, Any]:
    if not len(x):
        return {"n": 0}
    return {"n": len(x), "median": round(float(np.median(x)), 3), "mean": round(float(x.mean()), 3)}


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, json_default=None)
    p.add_argument("roots", type=Path, nargs="+", help="results/<study> folders, one per run")
    p.add_argument("--min-peers", type=positive_int, default=3, help="valid runs a cell needs (default 3)")
    a = p.parse_args(argv)
    for root in a.roots:
        if not root.is_dir():
            p.error(f"roots: {root} is not a folder")
    cells = _cells(a.roots)
    if not cells:
        p.error("roots: no real-time cell summary under them")

    ratio, late = [], []
    for _, path, _ in cells:
        r, lt = _requests(path)
        ratio.append(r)
        late.append(lt)
    ratios, lates = np.concatenate(ratio), np.concatenate(late)
    per_request = {
        f"{lo:g}-{hi:g} us": _describe(ratios[(lates >= lo) & (lates < hi)])
        for lo, hi in zip(REQUEST_BINS_US, REQUEST_BINS_US[1:], strict=False)
    }

    groups: dict[str, list[CellSummary]] = defaultdict(list)
    for key, _, s in cells:
        groups[key].append(s)
    valid_rows, invalid_rows = [], []  # (lateness p90 µs, p50 ratio, p90 ratio)
    for members in groups.values():
        valid = [s for s in members if s.validity.valid]
        for s in members:
            peers = [v for v in valid if v is not s]
            failed = {c.name for c in s.validity.checks if not c.passed}
            if len(peers) < a.min_peers or (not s.validity.valid and not failed <= LATENESS_CHECKS):
                continue  # too few peers, or invalid for something else as well
            p50 = np.median([v.latency_ms.ttft.p50 for v in peers])
            p90 = np.median([v.latency_ms.ttft.p90 for v in peers])
            row = (s.lateness_us.p90 or 0.0, s.latency_ms.ttft.p50 / p50, s.latency_ms.ttft.p90 / p90)
            (valid_rows if s.validity.valid else invalid_rows).append(row)
    v, i = np.asarray(valid_rows).reshape(-1, 3), np.asarray(invalid_rows).reshape(-1, 3)
    per_cell = {
        f"{lo:g}-{hi:g} us": {**_describe(v[(v[:, 0] >= lo) & (v[:, 0] < hi), 1]), "of": "p50 ratio"}
        for lo, hi in zip(CELL_BINS_US, CELL_BINS_US[1:], strict=False)
    }
    out: dict[str, Any] = {
        "runs": len(a.roots),
        "cells": len(cells),
        "per_request_ttft_over_cell_median_by_own_lateness": per_request,
        "valid_cells_p50_ratio_by_lateness_p90": per_cell,
        "valid": {"p50": _describe(v[:, 1]), "p90": _describe(v[:, 2]), "share_slower": _share(v[:, 1])},
        "invalid_for_lateness": {"p50": _describe(i[:, 1]), "p90": _describe(i[:, 2]), "share_slower": _share(i[:, 1])},
    }
    if len(v) > 2 and np.ptp(v[:, 0]) > 0 and np.ptp(v[:, 1]) > 0:
        rho = spearmanr(v[:, 0], v[:, 1])
        out["valid_spearman_lateness_p50_ratio"] = [round(float(rho.statistic), 3), float(rho.pvalue)]
    if len(i) and len(v):
        out["mann_whitney_p_invalid_slower"] = float(mannwhitneyu(i[:, 1], v[:, 1], alternative="greater").pvalue)
    _print(out)
    write_json(a.json, out)
    return 0


def _share(x: np.ndarray) -> float | None:
    return round(float((x > SLOWER).mean()), 3) if len(x) else None


def _print(out: dict[str, Any]) -> None:
    print(f"{out['runs']} runs, {out['cells']} real-time cells")
    print("per request, TTFT / its cell's median, by its own send lateness:")
    for k, d in out["per_request_ttft_over_cell_median_by_own_lateness"].items():
        print(f"  {k:>14}: n {d['n']:6d}  median {d.get('median', '-')}  mean {d.get('mean', '-')}")
    print("per valid cell, TTFT p50 / its peers' median, by the cell's lateness p90:")
    for k, d in out["valid_cells_p50_ratio_by_lateness_p90"].items():
        print(f"  {k:>14}: n {d['n']:4d}  median {d.get('median', '-')}")
    for k in ("valid", "invalid_for_lateness"):
        d = out[k]
        print(
            f"{k}: n {d['p50']['n']}, p50 ratio median {d['p50'].get('median', '-')}, p90 ratio median "
            f"{d['p90'].get('median', '-')}, share of p50 ratios above {SLOWER}: {d['share_slower']}"
        )
    if "mann_whitney_p_invalid_slower" in out:
        print(f"Mann-Whitney, invalid slower than valid: p = {out['mann_whitney_p_invalid_slower']:.2g}")


if __name__ == "__main__":
    sys.exit(main())
