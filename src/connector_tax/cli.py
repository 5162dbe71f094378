"""The `ctax` console script: one subcommand per component, each implemented in its module."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _config_check(args: argparse.Namespace) -> int:
    from connector_tax.config import ConfigError, StudyConfig, check_file, load_config
    from connector_tax.launch.hostcheck import check_host
    from connector_tax.pipeline.resolution import unbounded_warnings

    if check_file(args.file) != 0:
        return 2
    config = load_config(args.file)
    for line in unbounded_warnings(StudyConfig.from_mapping(config)):
        print(f"warning: {line}")
    if args.static:
        return 0
    try:
        check_host(config)
    except ConfigError as exc:
        print(f"{args.file}: on this host: {exc}", file=sys.stderr)
        return 2
    return 0


def _sim(args: argparse.Namespace) -> int:
    from connector_tax.sim.server import main

    return main(args)


def _truth(args: argparse.Namespace) -> int:
    from connector_tax.oracle.truth_cli import main

    return main(args)


def _launch_command(args: argparse.Namespace) -> int:
    from connector_tax.launch.cli import main

    return main(args)


def _bench(args: argparse.Namespace) -> int:
    from connector_tax.loadgen.cli import main

    return main(args)


def _calibrate(args: argparse.Namespace) -> int:
    from connector_tax.calibrate.cli import main

    return main(args)


def _analyze(args: argparse.Namespace) -> int:
    from connector_tax.pipeline.analyze import main

    return main(args)


def _compare(args: argparse.Namespace) -> int:
    from connector_tax.pipeline.compare import main

    return main(args)


# `ctax pipeline STEP ...`: the logic behind each Snakemake rule, the same command the rule runs.
PIPELINE_STEPS = {
    "study-config": (
        "connector_tax.pipeline.studyfolder",
        "write the validated study config and the study folder's stamp",
    ),
    "preflight": ("connector_tax.pipeline.preflight", "one variant's readiness (check), or merge the results"),
    "phase": (
        "connector_tax.pipeline.phase",
        "one variant's phase: reuse what provably belongs, measure the rest",
    ),
    "reference": ("connector_tax.pipeline.reference", "saturation of Phase A cells, then ref_safe and ref_load"),
    "manifest": ("connector_tax.pipeline.manifest", "MANIFEST.md and MANIFEST.tsv"),
}


def _plan(args: argparse.Namespace) -> int:
    from connector_tax.config import ConfigError, load_study
    from connector_tax.pipeline.estimate import Timing, plan_study

    try:
        study = load_study(args.config)
        profile = _plan_profile(args, study)
    except ConfigError as exc:
        print(f"ctax plan: {exc}", file=sys.stderr)
        return 2
    if args.gpus < 1:
        print(f"ctax plan: --gpus: {args.gpus} is not a number of GPUs (1 or more)", file=sys.stderr)
        return 2
    if args.launch_s is not None and not args.launch_s >= 0:
        print(f"ctax plan: --launch-s: {args.launch_s} is not a number of seconds (0 or more)", file=sys.stderr)
        return 2
    timing = None
    if profile is not None and study.backend == "vllm":
        timing = Timing.from_profile(profile.provenance.get("timing") or {}, profile.describe())
    if profile is not None and args.profile:  # the plan's own view of the study: as if the config named it
        study = _with_profile(study, profile)
    if args.launch_sd and not args.predict:
        print("ctax plan: --launch-sd: only with --predict (it widens the predicted intervals)", file=sys.stderr)
        return 2
    if not args.predict:
        estimates, notes = plan_study(study, timing=timing, launch_s=args.launch_s)
        _plan_out(args, study, estimates, notes)
        return 0
    import tempfile
    from pathlib import Path

    import yaml

    from connector_tax.pipeline.predict import predict, predictable
    from connector_tax.pipeline.resolution import render as render_resolution
    from connector_tax.pipeline.resolution import resolution, unbounded_cells

    raw = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
    named = "hardware_profile" in (raw.get("sim") or {}) or profile is not None
    why = predictable(study, named)
    if why:
        print(f"ctax plan: --predict: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ctax-plan-") as scratch:
        workdir = Path(args.workdir or scratch)
        print(f"predicting in the simulator's virtual time under {workdir} ...", file=sys.stderr, flush=True)
        try:
            layout = predict(study, workdir)
        except RuntimeError as exc:
            print(f"ctax plan: {exc}", file=sys.stderr)
            return 1
        estimates, notes = plan_study(study, layout, timing=timing, launch_s=args.launch_s)
        resolved = resolution(layout.root)
        unbounded = unbounded_cells(layout.root, resolved, study.baseline)
        if args.launch_sd:
            from connector_tax.pipeline.resolution import with_launches

            pooled = {e["variant"] for e in resolved if e["at"].startswith("phase_a")}  # the measured variants
            with_launches(resolved, args.launch_sd, len(pooled) + 1)
            notes.append(
                f"launch-to-launch sd of a log p90 (measured): TTFT {args.launch_sd['ttft_p90']:.3f}, "
                f"TPOT {args.launch_sd['tpot_p90']:.3f}; half-widths given at k launches per variant"
            )
    notes = [n for n in notes if not n.startswith("no rate assumed pruned")]
    used = profile.describe() if profile is not None else f"{study.sim['hardware_profile']} (hand-set)"
    if profile is not None:
        unfitted = [v.name for v in study.variants if v.connector and profile.variant_for(v.name, v.connector) is None]
        if unfitted:
            notes.append(f"not in the profile, so on the hand-set connector model: {', '.join(unfitted)}")
    notes.append(
        "predicted: Phase A and the baseline's Phase B computed in the simulator's virtual time "
        f"(profile {used}); other configurations' Phase B cells at the baseline's lengths"
    )
    _plan_out(args, study, estimates, notes, resolved)
    print(render_resolution(resolved, unbounded), end="")
    return 0


def _launch_sd(text: str) -> dict[str, float]:
    try:
        ttft, tpot = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not TTFT,TPOT (two numbers, e.g. 0.08,0.03)") from None
    if not (0 <= ttft < 5 and 0 <= tpot < 5):
        raise argparse.ArgumentTypeError(f"{text!r}: each sd must be in [0, 5)")
    return {"ttft_p90": ttft, "tpot_p90": tpot}


def _plan_profile(args: argparse.Namespace, study: Any) -> Any:
    """The calibrated profile the plan uses: --profile, else the config's sim.profile (or None)."""
    from connector_tax.config.profile import check_model, check_study_profile, read_profile

    if args.profile:
        profile = read_profile(args.profile)
        check_model(profile, study.raw, where="--profile")
        return profile
    return check_study_profile(study.raw)


def _with_profile(study: Any, profile: Any) -> Any:
    """The study with `sim.profile` naming the profile (what the prediction computes with)."""
    import copy

    from connector_tax.config import StudyConfig

    raw = copy.deepcopy(dict(study.raw))
    raw["sim"] = {**raw.get("sim", {}), "profile": str(profile.source)}
    return StudyConfig.from_mapping(raw)


def _plan_out(
    args: argparse.Namespace, study: Any, estimates: list[Any], notes: list[str], resolved: Any = None
) -> None:
    from pathlib import Path

    from connector_tax.atomic import write_json
    from connector_tax.pipeline.estimate import as_dict, render

    print(render(study, estimates, notes, args.gpus, args.config), end="")
    if args.json:
        doc = as_dict(study, estimates, notes, args.gpus, args.config)
        if resolved is not None:
            doc["resolution"] = resolved
        write_json(Path(args.json), doc)


def _pipeline(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(PIPELINE_STEPS[args.step][0])
    return int(module.main(args.args) or 0)


def _benchmark(args: argparse.Namespace) -> int:
    from connector_tax.benchmark import main

    return main(args.args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="study configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", help="validate a study config file")
    check.add_argument("file", help="path to a study config YAML")
    check.add_argument(
        "--static",
        action="store_true",
        help="the file only; by default a vLLM study on GPUs is also checked against this host "
        "(model downloaded, PYTORCH_CUDA_ALLOC_CONF, RDMA devices)",
    )
    check.set_defaults(func=_config_check)

    from connector_tax.sim.cli_args import add_sim_arguments

    sim = sub.add_parser("sim", help="run the embedded simulated vLLM server")
    add_sim_arguments(sim)
    sim.set_defaults(func=_sim)

    from connector_tax.oracle.truth_cli import add_arguments as add_truth_arguments

    truth = sub.add_parser(
        "truth", help="the simulator's true p90s, taxes and H1-H6 verdicts of a study config (virtual time)"
    )
    add_truth_arguments(truth)
    # argparse's sub-parsers take no error hook: each one's method is replaced, so that a bad
    # argument is one line naming the command (mypy flags any assignment to a method).
    truth.error = lambda message: truth.exit(2, f"ctax truth: {message}\n")  # type: ignore[method-assign]
    truth.set_defaults(func=_truth)

    from connector_tax.launch.cli import add_arguments as add_launch_arguments

    launch = sub.add_parser("launch-command", help="print the exact server launch of a config, launch nothing")
    add_launch_arguments(launch)
    launch.set_defaults(func=_launch_command)

    from connector_tax.loadgen.cli import add_bench_arguments

    bench = sub.add_parser("bench", help="drive a server with the open-loop load generator")
    add_bench_arguments(bench)
    bench.error = lambda message: bench.exit(2, f"ctax bench: {message}\n")  # type: ignore[method-assign]  # as truth's
    bench.set_defaults(func=_bench)

    from connector_tax.pipeline.analyze import add_arguments as add_analyze_arguments

    analyze = sub.add_parser("analyze", help="statistics, taxes, verdicts and figures from results/<study>")
    add_analyze_arguments(analyze)
    analyze.set_defaults(func=_analyze)

    from connector_tax.pipeline.compare import add_arguments as add_compare_arguments

    compare = sub.add_parser(
        "compare", help="what changed between two studies (or two variants of one), with launch-aware intervals"
    )
    add_compare_arguments(compare)
    compare.error = lambda message: compare.exit(2, f"ctax compare: {message}\n")  # type: ignore[method-assign]
    compare.set_defaults(func=_compare)

    from connector_tax.calibrate.cli import add_arguments as add_calibrate_arguments

    calibrate = sub.add_parser(
        "calibrate",
        help="fit the simulator's engine profile from a real study (-o PROFILE), or check one (--check --profile)",
    )
    add_calibrate_arguments(calibrate)
    calibrate.error = lambda message: calibrate.exit(2, f"ctax calibrate: {message}\n")  # type: ignore[method-assign]  # as truth's
    calibrate.set_defaults(func=_calibrate)

    plan = sub.add_parser("plan", help="a study's cells, estimated wall time per stage, GPU-hours, nothing run")
    plan.add_argument(
        "--config", default="configs/default.yaml", metavar="FILE", help="study config (default configs/default.yaml)"
    )
    plan.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="N GPUs side by side: print the snakemake command that runs N phase jobs at once (its --cores) "
        "and the wall time with it",
    )
    plan.add_argument(
        "--launch-s",
        type=float,
        metavar="SECONDS",
        help="a server launch's start-up as timed on the host (default: vLLM 150, the simulator 3)",
    )
    plan.add_argument(
        "--predict",
        action="store_true",
        help="find the knees, reference rates and Phase B cell lengths first, by computing Phase A and the "
        "baseline's Phase B in the simulator's virtual time (needs sim.hardware_profile, sim.profile or --profile; "
        "takes minutes); also prints each tax's predicted interval half-width",
    )
    plan.add_argument(
        "--profile",
        metavar="FILE",
        help="an engine profile (`ctax calibrate`) to plan with instead of the config's: its fitted engine for "
        "--predict, and for a vLLM study the job times it measured on its host",
    )
    plan.add_argument(
        "--launch-sd",
        type=_launch_sd,
        metavar="TTFT,TPOT",
        help="with --predict: the measured sd of one launch's log p90 (TTFT, TPOT; `ctax benchmark launch_variance`, "
        "or a replicated study's taxes' launch_sd): each tax's half-width at k launches per variant",
    )
    plan.add_argument("--workdir", metavar="DIR", help="keep the prediction's scratch study here (default: removed)")
    plan.add_argument("--json", metavar="FILE", help="also write the estimates here (seconds per stage and job)")
    plan.error = lambda message: plan.exit(2, f"ctax plan: {message}\n")  # type: ignore[method-assign]
    plan.set_defaults(func=_plan)

    steps = "\n".join(f"  {name:13} {text}" for name, (_, text) in PIPELINE_STEPS.items())
    pipeline = sub.add_parser(
        "pipeline",
        help="run one step of the study as its Snakemake rule does",
        description=f"steps:\n{steps}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pipeline.add_argument("step", choices=list(PIPELINE_STEPS), metavar="STEP")
    pipeline.add_argument("args", nargs=argparse.REMAINDER, help="the step's own arguments (ctax pipeline STEP --help)")
    pipeline.set_defaults(func=_pipeline)

    # Listed here for `ctax --help`; main() hands `ctax benchmark ...` over whole (--list, a
    # benchmark's own --help), which argparse's REMAINDER does not when an option comes first.
    benchmark = sub.add_parser("benchmark", help="run one of the project's benchmarks (ctax benchmark --list)")
    benchmark.add_argument("args", nargs=argparse.REMAINDER, help="NAME and its arguments, or --list")
    benchmark.set_defaults(func=_benchmark)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A rule's `ctax pipeline STEP ...` or `ctax analyze ...` goes straight to its step: the full
    # parser imports every subcommand, about a second per job on a loaded machine.
    if len(argv) >= 2 and argv[0] == "pipeline" and argv[1] in PIPELINE_STEPS:
        return _pipeline(argparse.Namespace(step=argv[1], args=argv[2:]))
    if argv[:1] == ["analyze"]:
        from connector_tax.pipeline.analyze import add_arguments
        from connector_tax.pipeline.analyze import main as analyze

        parser = argparse.ArgumentParser(prog="ctax analyze")
        add_arguments(parser)
        return analyze(parser.parse_args(argv[1:]))
    if argv[:1] == ["benchmark"]:
        return _benchmark(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
