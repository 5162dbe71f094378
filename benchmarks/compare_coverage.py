"""SIMULATED: `ctax compare`'s 95% intervals against the simulator's truth, launch bias on: coverage
(%) per quantity, an injected change detected (%), false changes (%).

Backs: ../docs/compare.md#does-it-cover-the-truth
Backs: ../docs/performance.md#analysis-figures-simulator

Two scenarios, each over `--seeds` pairs of short virtual-time studies (every variant's cell
`--requests` long, `--replicates` launches each in each study, every launch its own speed factor
exp(N(0, sd^2)), both studies on the same traffic: one study seed): an injected difference (study
B's config has `--inject CONNECTOR:SCALE`, that connector's per-step costs times SCALE; default
mooncake:0.2, a fix that removes four fifths of Mooncake's cost) and an A/A pair (B the same
config: every true change is 0). Each pair is compared with the analysis's own code
(analysis/compare.py) and scored against the oracle's true p90s and taxes of both configs: per
quantity, how often the interval covers the true change B / A - 1, its median half-width, how
often a true change is called "changed" on its side (detected) and how often a quantity that did
not change is (a false change). Virtual time: the statistics, not the instruments.

    ctax benchmark compare_coverage --seeds 200 --jobs 2
    ctax benchmark compare_coverage --seeds 200 --inject mooncake:2   # a slower release instead
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

from _common import REPO, parser, positive_float, positive_int, write_json

from connector_tax.config import StudyConfig, load_config
from connector_tax.oracle.compare_coverage import CompareCoverageSettings, check_pair
from connector_tax.oracle.truth import TruthSettings


def injection(text: str) -> tuple[str, float]:
    connector, _, scale = text.partition(":")
    try:
        return connector, positive_float(scale)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not CONNECTOR:SCALE (e.g. mooncake:0.2)") from None


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    p.add_argument("--ref-safe", type=positive_float, default=16.0, help="the Phase A rate compared (default 16)")
    p.add_argument("--variants", default="plain,noop_connector,mooncake_both,nixl_both")
    p.add_argument("--inject", type=injection, default=("mooncake", 0.2), metavar="CONNECTOR:SCALE")
    p.add_argument("--seeds", type=positive_int, default=200)
    p.add_argument("--requests", type=positive_int, default=400, help="measured requests per cell")
    p.add_argument("--replicates", type=positive_int, default=2, help="launches per variant in each study")
    p.add_argument("--launch-bias-sd", type=float, default=0.05)
    p.add_argument("--truth-replications", type=positive_int, default=4)
    p.add_argument("--jobs", type=positive_int, default=2)
    args = p.parse_args(argv)
    if not Path(args.config).is_file():
        p.error(f"argument --config: {args.config}: no such file")
    config = copy.deepcopy(load_config(args.config))
    config["workload"]["phase_b"] = None
    config["workload"]["phase_b_prime"] = None
    try:
        from connector_tax.oracle.compare_coverage import inject

        inject(config, *args.inject)
    except ValueError as exc:
        p.error(f"argument --inject: {exc}")
    names = args.variants.split(",")
    reps = args.truth_replications
    ts = TruthSettings(requests=2000, warmup=200, min_replications=reps, max_replications=reps, jobs=args.jobs)
    cs = CompareCoverageSettings(
        requests=args.requests,
        seeds=args.seeds,
        jobs=args.jobs,
        replicates=args.replicates,
        launch_bias_sd=args.launch_bias_sd,
    )
    reference = {"ref_safe": args.ref_safe, "ref_load": args.ref_safe}
    print(
        f"SIMULATED compare coverage: {args.config} at {args.ref_safe:g} req/s, {args.seeds} seeds x two studies, "
        f"{args.requests}-request cells, {args.replicates} launches per variant each, launch bias sd "
        f"{args.launch_bias_sd:g}",
        flush=True,
    )
    runs = {}
    for name, injected in ((f"{args.inject[0]} costs x{args.inject[1]:g} in B", args.inject), ("A/A", None)):
        t0 = time.monotonic()
        runs[name] = check_pair(StudyConfig.from_mapping(config), reference, names, injected, ts, cs)
        summary = runs[name]["summary"]
        print(f"\n{name} ({time.monotonic() - t0:.0f} s)")
        print(f"  {'quantity':44} {'true':>8} {'covered':>9} {'median half-width':>18} {'changed':>8}")
        for key, t in summary["changes"].items():
            changed = t["calls"].get("changed", 0)
            print(
                f"  {key:44} {t['true'] * 100:+7.1f}% {t['covered']:>4}/{t['with_ci']:<4} "
                f"{t['median_half_width'] * 100:>15.1f} pp {changed:>5}/{t['n']}"
            )
    print("\n" + render(runs))
    write_json(args.json, {"config": args.config, "runs": runs})
    return 0


def render(runs: dict[str, dict]) -> str:
    lines = [
        "| scenario | seeds | all changes covered | per quantity | injected change detected | false changes |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        o = run["summary"]["overall"]
        per = [t["coverage"] for t in run["summary"]["changes"].values() if t["coverage"] is not None]
        detected = "–" if o["detection"] is None else f"{o['detection']:.1%} ({o['detected']} / {o['injected']})"
        lines.append(
            f"| {name} | {run['settings']['seeds']} | **{o['coverage']:.1%}** ({o['covered']:,} / {o['with_ci']:,}) "
            f"| {min(per):.1%}–{max(per):.1%} | {detected} | {o['false_changes']} / {o['null']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
