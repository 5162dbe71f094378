"""`ctax plan`: a study's cells, estimated wall time per stage and GPU-hours, nothing run.

planning/time_estimate.py computes the estimates, planning/predict.py (`--predict`) first computes
Phase A and Phase B in the simulator's virtual time, planning/resolution.py says what each
predicted tax can resolve; this module reads the command's arguments, checks them (one line
naming the flag, exit 2) and prints.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from connector_tax.arguments import number, unwritable, write_failed
from connector_tax.atomic import write_json
from connector_tax.commands.namespace import runs
from connector_tax.config import ConfigError, StudyConfig, load_study
from connector_tax.config.profile import EngineProfile, check_model, check_study_profile, read_profile
from connector_tax.planning.predict import predict, predictable
from connector_tax.planning.resolution import TaxResolution, resolution, unbounded_cells, with_launches
from connector_tax.planning.resolution import render as render_resolution
from connector_tax.planning.time_estimate import Estimate, Timing, as_dict, plan_study, render


@dataclass(frozen=True)
class Args:
    """`ctax plan`."""

    config: str
    gpus: int
    launch_s: float | None
    predict: bool
    profile: str | None
    launch_sd: dict[str, float] | None
    workdir: str | None
    json: str | None


_LAUNCH_SD = number(float, 0, 5, high_open=True)


def _launch_sd(text: str) -> dict[str, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not TTFT,TPOT (two numbers, e.g. 0.08,0.03)")
    try:
        ttft, tpot = (_LAUNCH_SD(x.strip()) for x in parts)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: each sd a number in [0, 5) ({exc})") from None
    return {"ttft_p90": ttft, "tpot_p90": tpot}


def add_arguments(plan: argparse.ArgumentParser) -> None:
    plan.add_argument(
        "--config", default="configs/default.yaml", metavar="FILE", help="study config (default configs/default.yaml)"
    )
    plan.add_argument(
        "--gpus",
        type=number(int, 1),
        default=1,
        metavar="N",
        help="N GPUs side by side: print the snakemake command that runs N phase jobs at once (its --cores) "
        "and the wall time with it",
    )
    plan.add_argument(
        "--launch-s",
        type=number(float, 0),
        metavar="SECONDS",
        help="a server launch's start-up as timed on the host (default: vLLM on a GPU 150, on a CPU 24, the simulator 3)",
    )
    plan.add_argument(
        "--predict",
        action="store_true",
        help="find the knees, reference rates and Phase B cell lengths first, by computing Phase A and "
        "Phase B in the simulator's virtual time (needs sim.hardware_profile, sim.profile or --profile; "
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
    runs(plan, Args, main)


def _fail(message: str, code: int = 2) -> int:
    print(f"ctax plan: {message}", file=sys.stderr)
    return code


def main(args: Args) -> int:
    try:
        study = load_study(args.config)
        profile = _profile(args, study)
    except ConfigError as exc:
        return _fail(str(exc))
    timing = None
    if profile is not None and study.backend == "vllm":
        timing = Timing.from_profile(profile.provenance.get("timing") or {}, profile.describe())
    # A profile the config names is one its server is modelled by; the schema's default is not.
    named = study.hardware_profile_named or profile is not None
    if profile is not None and args.profile:  # the plan's own view of the study: as if the config named it
        study = _with_profile(study, profile)
    if args.launch_sd and not args.predict:
        return _fail("--launch-sd: only with --predict (it widens the predicted intervals)")
    if args.workdir and not args.predict:
        return _fail("--workdir: only with --predict (it keeps the prediction's scratch study)")
    # Outputs the user names, checked before the work (a prediction takes minutes).
    for where, flag, folder in ((args.json, "--json", False), (args.workdir, "--workdir", True)):
        if where and (why := unwritable(where, flag, folder)):
            return _fail(why)
    if not args.predict:
        estimates, notes = plan_study(study, timing=timing, launch_s=args.launch_s)
        return _out(args, study, estimates, notes)
    why = predictable(study, named)
    if why:
        return _fail(f"--predict: {why}")
    return _predicted(args, study, profile, timing)


def _predicted(args: Args, study: StudyConfig, profile: EngineProfile | None, timing: Timing | None) -> int:
    """`--predict`: the plan from the study's Phase A and baseline Phase B computed in virtual
    time, then what each predicted tax can resolve."""
    with tempfile.TemporaryDirectory(prefix="ctax-plan-") as scratch:
        workdir = Path(args.workdir or scratch)
        print(f"predicting in the simulator's virtual time under {workdir} ...", file=sys.stderr, flush=True)
        try:
            layout = predict(study, workdir)
        except RuntimeError as exc:
            return _fail(str(exc), 1)
        estimates, notes = plan_study(study, layout, timing=timing, launch_s=args.launch_s)
        resolved = resolution(layout.root)
        unbounded = unbounded_cells(layout.root, resolved)
        if args.launch_sd:
            pooled = {e.variant for e in resolved if e.at.startswith("phase_a")}  # the measured variants
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
    notes.append(f"predicted: Phase A and Phase B computed in the simulator's virtual time (profile {used})")
    code = _out(args, study, estimates, notes, resolved)
    print(render_resolution(resolved, unbounded), end="")
    return code


def _profile(args: Args, study: StudyConfig) -> EngineProfile | None:
    """The calibrated profile the plan uses: --profile, else the config's sim.profile (or None)."""
    if args.profile:
        profile = read_profile(args.profile)
        check_model(profile, study.raw, where="--profile")
        return profile
    return check_study_profile(study.raw)


def _with_profile(study: StudyConfig, profile: EngineProfile) -> StudyConfig:
    """The study with `sim.profile` naming the profile (what the prediction computes with)."""
    raw = copy.deepcopy(dict(study.raw))
    raw["sim"] = {**raw.get("sim", {}), "profile": str(profile.source)}
    return StudyConfig.from_mapping(raw)


def _out(
    args: Args,
    study: StudyConfig,
    estimates: list[Estimate],
    notes: list[str],
    resolved: list[TaxResolution] | None = None,
) -> int:
    print(render(study, estimates, notes, args.gpus, args.config), end="")
    if args.json:
        doc = as_dict(study, estimates, notes, args.gpus, args.config)
        if resolved is not None:
            doc["resolution"] = [asdict(e) for e in resolved]
        try:
            write_json(Path(args.json), doc)
        except OSError as exc:  # checked before the work; the disk or the folder changed since
            return _fail(write_failed(args.json, "--json", exc))
    return 0
