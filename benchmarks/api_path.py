"""SIMULATED: what the client's path (HTTP server, streaming, load generator) adds on the real clock:
its ingress and egress (ms) from real-clock studies' records, and Phase B's TTFT p90 (ms) and taxes
(%) in virtual time without it and with it put back.

Backs: ../docs/simulator.md#the-real-clocks-h5-the-clients-path
Backs: ../docs/calibration.md#the-api-paths-tail

    ctax benchmark api_path --results DIR [DIR ...] [--variants plain,mooncake_both]
        [--requests 2000] [--seeds 3] [--json FILE]

Each DIR is a simulated study's results folder, run on the real clock (`snakemake all` of a
`backend: sim` config, for example ctax benchmark reference_seeds --clock real's s*/results/*):
the simulated engine served it, so its engine is exactly the one the virtual clock steps, and what
differs between a measured cell and the same cell in virtual time is the path between the client
and the engine (the HTTP server, streaming, the load generator, the host). That path is measured
from the studies' own records as `ctax calibrate` measures a real server's (calibrate/study_tables.py:
ingress, send -> the step that takes the request, where the engine was idle; egress, the step that
made the first token -> the client has it), pooled over every cell of every DIR.

Then each Phase B cell of --variants, at the studies' own rates and shapes, in virtual time
(oracle.virtual_cells.run_cell: --seeds cells of --requests requests each, the study's arrival process),
four ways: without the path (what the default study's truth computes), with it drawn from quantiles
on the 5 % grid that profiles fitted before 2026-12-02 store, on the fit's grid (5 % steps and the
tail finer: config/profile.py's QUANTILES), and drawn from the pooled samples themselves. Beside
them the measured TTFT p90, the median over the DIRs (post-warm-up requests), and each variant's
TTFT p90 tax over the first variant at every shape, and its step from the smallest to the largest
input (H5's number for mooncake_both). Cells a study ran past saturation do not compare: a long
virtual run queues longer than a short cell.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _common import comma_list, parser, positive_int, write_json

from connector_tax.calibrate.study_tables import CalibrationError, read_study
from connector_tax.config.profile import LEGACY_QUANTILES, QUANTILES, ApiProfile
from connector_tax.oracle import virtual_cells
from connector_tax.oracle.virtual_cells import run_cell, study_loads
from connector_tax.sim.apidelay import ApiDelays
from connector_tax.sim.settings import resolve

MODES = ("none", "5% grid", "fit grid", "samples")


class SampleDelays(ApiDelays):
    """Draws from the pooled samples themselves (the same per-request seeding as ApiDelays)."""

    ingress: np.ndarray
    egress: np.ndarray

    def draw(self, index: int) -> tuple[float, float, float]:
        rng = random.Random(self.seed * 1_000_003 + index)

        def pick(samples: np.ndarray) -> float:
            return float(samples[int(rng.random() * samples.size)])

        return pick(self.ingress), pick(self.egress), pick(self.egress)


def measured_p90(requests: Any) -> float:
    ok = requests[~requests["warmup"].astype(bool)]  # read_study keeps successful requests only
    return float(np.percentile((ok["t_first_token_ns"] - ok["t_send_ns"]).to_numpy() / 1e6, 90))


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--results", type=Path, nargs="+", required=True, metavar="DIR")
    p.add_argument("--variants", type=comma_list(str, "variant names"), default=["plain", "mooncake_both"])
    p.add_argument("--requests", type=positive_int, default=2000, help="requests of each virtual cell")
    p.add_argument("--seeds", type=positive_int, default=3, help="virtual cells per mode, their p90s averaged")
    args = p.parse_args(argv)
    studies = []
    for d in args.results:
        try:
            studies.append(read_study(d, purpose="api_path", simulated_ok=True))
        except CalibrationError as exc:
            p.error(f"argument --results: {exc}")
    if studies[0].study.settings.backend != "sim":
        p.error(
            f"argument --results: {args.results[0]} is a {studies[0].study.settings.backend} study; this needs a simulated one"
        )
    study = studies[0].study.settings
    unknown = [v for v in args.variants if v not in [x.name for x in study.variants]]
    if unknown:
        p.error(f"argument --variants: {unknown[0]} is not a variant of {study.study}")
    ingress = np.sort(np.concatenate([c.requests["ingress_us"].dropna().to_numpy() for s in studies for c in s.cells]))
    egress = np.sort(np.concatenate([c.requests["egress_us"].dropna().to_numpy() for s in studies for c in s.cells]))
    if min(ingress.size, egress.size) < 100:
        p.error("argument --results: fewer than 100 ingress or egress samples in those studies")
    path = {
        k: {f"q{q:g}": round(float(np.percentile(a, q)), 1) for q in (10, 50, 90, 95, 99, 100)}
        for k, a in (("ingress_us", ingress), ("egress_us", egress))
    }
    print(
        f"the path, pooled over {len(studies)} studies: ingress {path['ingress_us']} (n={ingress.size}), "
        f"egress {path['egress_us']} (n={egress.size})"
    )

    # per (variant, cell), each study's p90 by its index: a tax or step pairs a study with itself
    measured: dict[tuple[str, str], dict[int, float]] = {}
    rates: dict[str, float] = {}
    for i, s in enumerate(studies):
        for c in s.cells:
            if c.variant in args.variants and c.phase in ("phase_b", "phase_b_prime"):
                label = c.label if c.phase == "phase_b" else f"{c.label}'"
                measured.setdefault((c.variant, label), {})[i] = measured_p90(c.requests)
                if c.summary.rate is not None:
                    rates["ref_safe" if c.phase == "phase_b" else "ref_load"] = float(c.summary.rate)

    def settings(name: str, mode: str) -> Any:
        base = resolve(study, study.variant(name), {})
        if mode == "none":  # a calibrated profile's own path too
            return dataclasses.replace(base, api=None)
        grid = LEGACY_QUANTILES if mode == "5% grid" else QUANTILES
        return dataclasses.replace(
            base, api=ApiProfile(*(tuple(float(v) for v in np.quantile(a, grid)) for a in (ingress, egress)))
        )

    virtual: dict[tuple[str, str, str], float] = {}
    SampleDelays.ingress, SampleDelays.egress = ingress, egress
    for name in args.variants:
        for load in study_loads(study, name, rates):
            if load.phase not in ("phase_b", "phase_b_prime"):
                continue
            label = load.label if load.phase == "phase_b" else f"{load.label}'"
            for mode in MODES:
                # run_cell draws through oracle.virtual_cells' ApiDelays: the samples' draws stand in for it
                draws = SampleDelays if mode == "samples" else ApiDelays
                with mock.patch.object(virtual_cells, "ApiDelays", draws):
                    # "samples" keeps the fit grid's profile only so that the cell draws delays at all
                    s = settings(name, "fit grid" if mode == "samples" else mode)
                    p90s = [
                        float(np.percentile(run_cell(s, load, args.requests, k).after(args.requests // 10).ttft_ms, 90))
                        for k in range(args.seeds)
                    ]
                virtual[(name, label, mode)] = statistics.fmean(p90s)

    labels = sorted({lab for (_, lab, _) in virtual}, key=lambda x: (x.endswith("'"), int(x.split("x")[0]), x))
    print(
        f"\nTTFT p90 (ms), virtual cells of {args.requests} requests x {args.seeds} seeds, and measured "
        f"(median of {len(studies)} studies)"
    )
    print(f"  {'variant':24} {'cell':8} " + " ".join(f"{m:>9}" for m in MODES) + f" {'measured':>9}")
    rows = []
    for name in args.variants:
        for lab in labels:
            got = list(measured.get((name, lab), {}).values())
            m = statistics.median(got) if got else None
            vals = [virtual[(name, lab, mode)] for mode in MODES]
            rows.append({"variant": name, "cell": lab, **dict(zip(MODES, vals)), "measured": m, "measured_each": got})
            print(
                f"  {name:24} {lab:8} " + " ".join(f"{v:9.2f}" for v in vals) + (f" {m:9.2f}" if m is not None else "")
            )

    base = args.variants[0]
    taxes = []
    print(f"\nTTFT p90 tax over {base} (%): each mode, and measured (median of the studies' own taxes)")
    for name in args.variants[1:]:
        for lab in labels:
            own, of_base = measured.get((name, lab), {}), measured.get((base, lab), {})
            each = {i: own[i] / of_base[i] - 1 for i in own if i in of_base}
            row = {
                "variant": name,
                "cell": lab,
                **{m: virtual[(name, lab, m)] / virtual[(base, lab, m)] - 1 for m in MODES},
                "measured": statistics.median(each.values()) if each else None,
                "measured_each": each,
            }
            taxes.append(row)
            print(
                f"  {name:24} {lab:8} "
                + " ".join(f"{100 * row[m]:+8.1f}%" for m in MODES)
                + (f" {100 * row['measured']:+8.1f}%" if each else "")
            )
    steps = []
    phase_b = [lab for lab in labels if not lab.endswith("'")]
    out_of = {lab: lab.split("x")[1] for lab in phase_b}
    for name in args.variants[1:]:
        for out in sorted(set(out_of.values()), key=int):
            cells_ = sorted((lab for lab in phase_b if out_of[lab] == out), key=lambda x: int(x.split("x")[0]))
            if len(cells_) < 2:
                continue
            lo, hi = cells_[0], cells_[-1]
            t = {r["cell"]: r for r in taxes if r["variant"] == name}
            step = {m: 100 * (t[hi][m] - t[lo][m]) for m in MODES}
            pp = [
                100 * (t[hi]["measured_each"][i] - a)
                for i, a in t[lo]["measured_each"].items()
                if i in t[hi]["measured_each"]
            ]
            steps.append({"variant": name, "from": lo, "to": hi, **step, "measured_each": pp})
            print(
                f"  step {name} {lo} -> {hi} (pp): "
                + ", ".join(f"{m} {step[m]:+.1f}" for m in MODES)
                + (f"; measured {', '.join(f'{x:+.1f}' for x in pp)}" if pp else "")
            )
    write_json(
        args.json,
        {
            "path": path,
            "rates": rates,
            "p90_ms": rows,
            "taxes": taxes,
            "steps": steps,
            "settings": {
                "results": [str(d) for d in args.results],
                "requests": args.requests,
                "seeds": args.seeds,
                "variants": args.variants,
            },
        },
    )
    return 0
