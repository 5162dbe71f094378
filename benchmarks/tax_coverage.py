"""SIMULATED: coverage (%) of the analysis's 95% intervals against the simulator's truth, launch bias
off and on, per tax and hypothesis, with the median half-width (pp) and the calls that agree with
the truth.

Backs: ../docs/simulator.md#with-launch-bias-intervals-that-include-the-launch
Backs: ../docs/performance.md#analysis-figures-simulator

The oracle (connector_tax.oracle.truth) gives the true p90s, taxes and H1-H6 of a study config at
given reference rates (the nominal engine: a launch's median). Then, for each `--launch-bias-sd`,
`--seeds` short virtual-time studies (every variant's cell `--requests` long, `--replicates`
launches each, every launch its own speed factor exp(N(0, sd^2)), common random numbers, an A/A
control) are analysed twice with the analysis's own code and scored: the reference method (each
variant's first launch, batch-means p90 intervals, the taxes' delta-method combination of two
cells: the intervals before launch-aware ones) and the launch method (analysis/launch_intervals.py:
paired by request, every launch, the launch-to-launch variance in the interval). Per tax and per
hypothesis: how often the interval covers the true value, the median half-width, how often the
call agrees with the true verdict, how often it makes no call (inconclusive) where the truth makes
one, and how often it makes the opposite call (wrong). Virtual time: no server, no HTTP; the statistics, not the
instruments.

    ctax benchmark tax_coverage --seeds 200 --jobs 2                 # bias 0 and 0.05, two launches
    ctax benchmark tax_coverage --seeds 200 --variants noop_connector,mooncake_both,nixl_both  # H1-H3
    ctax benchmark tax_coverage --seeds 200 --arrival config         # the default study's process
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

from _common import REPO, parser, positive_float, positive_int, write_json

from connector_tax.config import StudyConfig, load_config
from connector_tax.oracle.coverage import AA, METHODS, CoverageSettings, overall, run_coverage
from connector_tax.oracle.truth import TruthSettings, truth


def bias_list(text: str) -> list[float]:
    """--launch-bias-sd: comma-separated sds of the log speed factor, each in [0, 1]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers in [0, 1]")
    return values


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
        help="poisson (the study's, the default) | gamma:SHAPE | fixed | config (the study's own)",
    )
    p.add_argument("--replicates", type=positive_int, default=2, help="launches per variant (default 2)")
    p.add_argument(
        "--launch-bias-sd",
        type=bias_list,
        default=[0.0, 0.05],
        metavar="SD[,SD...]",
        help="the per-launch speed factor's sd of log, one run each (default 0,0.05)",
    )
    p.add_argument("--no-aa-control", action="store_true", help="no A/A control among the launch method's variants")
    p.add_argument("--phase-b", action="store_true", help="also the study's Phase B/B' cells (H5, H6)")
    p.add_argument("--truth-requests", type=positive_int, default=2000)
    p.add_argument(
        "--truth-replications",
        type=positive_int,
        default=16,
        help="the truth's replications (default 16: paired intervals without bias are a few tenths of a percent wide)",
    )
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
    study = StudyConfig.from_mapping(config)
    oracle = truth(
        study,
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
    arrival = study.workload.arrival
    print(
        f"SIMULATED coverage: {args.config}, ref_safe {reference['ref_safe']:g} / ref_load {reference['ref_load']:g} "
        f"req/s, arrivals {arrival.process}"
        + (f" (shape {arrival.gamma_shape:g})" if arrival.process == "gamma" else "")
        + f", {args.seeds} seeds x {args.requests}-request cells, {args.replicates} launches per variant"
        + ("" if args.no_aa_control else " and an A/A control")
        + f"; truth {oracle['replications']} x {args.truth_requests} requests ({t1 - t0:.0f} s)",
        flush=True,
    )
    runs = {}
    for sd in args.launch_bias_sd:
        t2 = time.monotonic()
        cs = CoverageSettings(
            requests=args.requests,
            seeds=args.seeds,
            jobs=args.jobs,
            replicates=args.replicates,
            launch_bias_sd=sd,
            aa_control=not args.no_aa_control,
        )
        cov = run_coverage(study, oracle, cs)
        runs[sd] = cov
        print(f"\nlaunch bias sd {sd:g} ({time.monotonic() - t2:.0f} s)", flush=True)
        for method in METHODS:
            print(f"\n  {method} method: {'tax':46} {'covered':>9} {'coverage':>9} {'median half-width':>18}")
            for key, t in cov["summary"][method]["taxes"].items():
                cover = "-" if t["coverage"] is None else f"{t['coverage']:.1%}"
                half = "-" if t["median_half_width"] is None else f"{t['median_half_width'] * 100:.1f} pp"
                print(f"  {'':16}{key:46} {t['covered']:>4}/{t['with_ci']:<4} {cover:>9} {half:>18}")
            for hid, h in cov["summary"][method]["hypotheses"].items():
                cover = "-" if h["coverage"] is None else f"{h['coverage']:.1%}"
                print(
                    f"  {'':16}{hid:10} true {oracle['hypotheses'][hid]['verdict']:>10}: interval covers "
                    f"{h['covered']}/{h['with_ci']} ({cover}), calls agree {h['agrees']}/{h['n']} "
                    f"(no call {h['no_call']}, wrong {h['wrong']}), confident {h['confident']}/{h['n']}"
                )
    print("\n" + render(runs, args.replicates))
    write_json(args.json, {"config": args.config, "truth": oracle, "coverage": {str(sd): c for sd, c in runs.items()}})
    return 0


def render(runs: dict[float, dict], replicates: int) -> str:
    """The side-by-side table: per launch bias, both methods' overall coverage, per-tax range,
    median half-width and hypotheses."""
    lines = [
        "| launch bias (sd of log) | intervals | launches per variant | all taxes covered | per tax | "
        "median half-width | H1-H3 intervals cover | calls agree (no call, wrong) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sd, cov in runs.items():
        for method in METHODS:
            summary = cov["summary"][method]
            connector = {k: t for k, t in summary["taxes"].items() if not k.startswith(AA)}
            total = overall({"taxes": connector})
            per = [t["coverage"] for t in connector.values() if t["coverage"] is not None]
            halves = sorted(t["median_half_width"] for t in connector.values() if t["median_half_width"] is not None)
            hyps = summary["hypotheses"].values()
            covered, judged = sum(h["covered"] for h in hyps), sum(h["with_ci"] for h in hyps)
            agree, n = sum(h["agrees"] for h in hyps), sum(h["n"] for h in hyps)
            no_call, wrong = sum(h["no_call"] for h in hyps), sum(h["wrong"] for h in hyps)
            name = "reference (one launch, two cells)" if method == "reference" else "launch (paired)"
            if not per:
                lines.append(f"| {sd:g} | {name} | - | no interval | - | - | - | - |")
                continue
            lines.append(
                f"| {sd:g} | {name} | {1 if method == 'reference' else replicates} "
                f"| **{total['coverage']:.1%}** ({total['covered']:,} / {total['with_ci']:,}) "
                f"| {min(per):.1%}-{max(per):.1%} "
                f"| {halves[0] * 100:.1f}-{halves[-1] * 100:.1f} pp "
                f"| {f'{covered / judged:.1%}' if judged else '-'} "
                f"| {f'{agree} / {n} ({no_call}, {wrong})' if n else '-'} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
