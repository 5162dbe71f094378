"""Coverage of the analysis's 95% intervals against the simulator's truth, over many seeds.

The oracle (connector_tax.oracle.truth) gives the true p90s, taxes and H1-H6 of a study config at
given reference rates; then `--seeds` short virtual-time studies, each configuration's cell
`--requests` long on its own traffic, are analysed with the analysis's own methods (batch-means
p90 intervals, the taxes' delta-method combination, the hypotheses' estimates and calls) and
scored: per tax and per hypothesis, how often the interval covers the true value, the median
half-width, and how often the call agrees with the true verdict. Virtual time: no server, no
HTTP; the statistics, not the instruments.

    ctax benchmark tax_coverage --seeds 200 --jobs 2
    ctax benchmark tax_coverage --seeds 200 --variants noop_connector,mooncake_both,nixl_both  # H1-H3
    ctax benchmark tax_coverage --seeds 200 --arrival gamma:4   # the default study's process
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

from _common import REPO, parser, positive_float, positive_int, write_json

from connector_tax.config import load_config
from connector_tax.oracle.coverage import CoverageSettings, run_coverage
from connector_tax.oracle.truth import TruthSettings, truth


def arrival_process(text: str) -> dict[str, object] | None:
    """--arrival: the arrival process to impose, None for the study's own."""
    process, _, shape = text.partition(":")
    try:
        gamma_shape = positive_float(shape or "1")
    except argparse.ArgumentTypeError:
        process = ""
    if process not in ("poisson", "gamma", "fixed", "config") or (shape and process != "gamma"):
        raise argparse.ArgumentTypeError(f"{text!r} is not poisson, gamma:SHAPE, fixed or config")
    return None if process == "config" else {"process": process, "gamma_shape": gamma_shape}


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument(
        "--config", default=str(REPO / "configs" / "default.yaml"), help="default: the checkout's default study"
    )
    p.add_argument("--ref-safe", type=positive_float, default=16.0)
    p.add_argument("--ref-load", type=positive_float, default=None, help="default: ref_safe (Phase A at one rate)")
    p.add_argument("--variants", help="only these configurations, comma-separated (plain is always added)")
    p.add_argument("--seeds", type=positive_int, default=200)
    p.add_argument("--requests", type=positive_int, default=400, help="measured requests per cell")
    p.add_argument(
        "--arrival",
        type=arrival_process,
        default="poisson",
        help="poisson | gamma:SHAPE | fixed | config (the study's own)",
    )
    p.add_argument("--phase-b", action="store_true", help="also the study's Phase B/B' cells (H5, H6)")
    p.add_argument("--truth-requests", type=positive_int, default=2000)
    p.add_argument("--truth-replications", type=positive_int, default=4)
    p.add_argument("--jobs", type=positive_int, default=2)
    args = p.parse_args(argv)
    if not Path(args.config).is_file():
        p.error(f"argument --config: {args.config}: no such file")

    config = copy.deepcopy(load_config(args.config))
    if args.arrival is not None:
        config["workload"]["arrival"] = args.arrival
    if not args.phase_b:
        config["workload"]["phase_b"] = None
        config["workload"]["phase_b_prime"] = None
    reference = {"ref_safe": args.ref_safe, "ref_load": args.ref_load or args.ref_safe}
    t0 = time.monotonic()
    names = args.variants.split(",") if args.variants else None
    oracle = truth(
        config,
        reference,
        names,
        TruthSettings(
            requests=args.truth_requests,
            warmup=200,
            min_replications=args.truth_replications,
            max_replications=args.truth_replications,
            jobs=args.jobs,
        ),
    )
    t1 = time.monotonic()
    cov = run_coverage(config, oracle, CoverageSettings(requests=args.requests, seeds=args.seeds, jobs=args.jobs))
    t2 = time.monotonic()
    arrival = config["workload"]["arrival"]
    print(
        f"SIMULATED coverage: {args.config}, ref_safe {reference['ref_safe']:g} / ref_load {reference['ref_load']:g} "
        f"req/s, arrivals {arrival['process']}"
        + (f" (shape {arrival['gamma_shape']:g})" if arrival["process"] == "gamma" else "")
        + f", {args.seeds} seeds x {args.requests}-request cells; truth {oracle['replications']} x "
        f"{args.truth_requests} requests ({t1 - t0:.0f} s), coverage {t2 - t1:.0f} s"
    )
    print(f"\n{'tax':52} {'covered':>9} {'coverage':>9} {'median half-width':>18}")
    total = covered = 0
    for key, t in cov["summary"]["taxes"].items():
        total += t["with_ci"]
        covered += t["covered"]
        cover = "-" if t["coverage"] is None else f"{t['coverage']:.1%}"
        half = "-" if t["median_half_width"] is None else f"{t['median_half_width'] * 100:.1f} pp"
        print(f"{key:52} {t['covered']:>4}/{t['with_ci']:<4} {cover:>9} {half:>18}")
    if total:
        print(f"{'all taxes':52} {covered:>4}/{total:<4} {covered / total:>9.1%}")
    print(f"\n{'hypothesis':10} {'true':>10} {'covered':>9} {'coverage':>9} {'calls agree':>12} {'confident':>10}")
    for hid, h in cov["summary"]["hypotheses"].items():
        cover = "-" if h["coverage"] is None else f"{h['coverage']:.1%}"
        print(
            f"{hid:10} {oracle['hypotheses'][hid]['verdict']:>10} {h['covered']:>4}/{h['with_ci']:<4} {cover:>9} "
            f"{h['agrees']:>5}/{h['n']:<6} {h['confident']:>6}/{h['n']}"
        )
    write_json(args.json, {"config": args.config, "truth": oracle, "coverage": cov})
    return 0


if __name__ == "__main__":
    sys.exit(main())
