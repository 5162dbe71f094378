"""`ctax truth`: the simulator's true p90s, taxes and H1–H6 for a study config (oracle/truth.py
computes, oracle/truth_render.py prints)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from connector_tax.arguments import number, unwritable, write_failed
from connector_tax.atomic import write_atomic
from connector_tax.commands.namespace import runs
from connector_tax.config import StudyConfig
from connector_tax.oracle.truth import TruthSettings


@dataclass(frozen=True)
class Args:
    """`ctax truth`."""

    config: str
    ref_safe: float | None
    ref_load: float | None
    true_reference: bool
    variants: str | None
    precision: float
    requests: int
    warmup: int
    max_replications: int
    seed: int
    jobs: int
    json: str | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TruthSettings()
    parser.add_argument(
        "--config",
        default="configs/default.yaml",
        metavar="FILE",
        help="study config (default configs/default.yaml); only backend sim has a truth",
    )
    parser.add_argument(
        "--ref-safe",
        type=number(float, 0, low_open=True),
        metavar="RATE",
        help="ref_safe in req/s (default: results/<study>/reference_rates.json)",
    )
    parser.add_argument(
        "--ref-load",
        type=number(float, 0, low_open=True),
        metavar="RATE",
        help="ref_load in req/s (default: the same file, else ref_safe)",
    )
    parser.add_argument(
        "--true-reference",
        action="store_true",
        help="find the reference rates too: the study's saturation criteria on the oracle's cells at every "
        "Phase A rate (oracle/true_reference.py), used unless --ref-safe is given",
    )
    parser.add_argument("--variants", metavar="A,B", help="only these configurations (plain is always added)")
    parser.add_argument(
        "--precision",
        type=number(float, 0, low_open=True),
        default=d.precision,
        metavar="REL",
        help=f"target relative 95%% half-width of every p90 (default {d.precision})",
    )
    parser.add_argument(
        "--requests",
        type=number(int, 0, low_open=True),
        default=d.requests,
        metavar="N",
        help=f"measured requests per replication (default {d.requests})",
    )
    parser.add_argument(
        "--warmup",
        type=number(int, 0, low_open=True),
        default=d.warmup,
        metavar="N",
        help=f"requests discarded at the start of each replication (default {d.warmup})",
    )
    parser.add_argument(
        "--max-replications",
        type=number(int, 0, low_open=True),
        default=d.max_replications,
        metavar="N",
        help=f"stop here even if the precision is not reached (default {d.max_replications})",
    )
    parser.add_argument("--seed", type=number(int), default=d.seed, help="seed of the replications (default 0)")
    parser.add_argument(
        "--jobs", type=number(int, 0, low_open=True), default=1, metavar="N", help="worker processes (default 1)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the whole document here")
    runs(parser, Args, main)


def reference_of(args: Args, study: StudyConfig) -> dict[str, float]:
    """The reference rates the truth is computed at: --ref-safe (and --ref-load), else the
    study's reference_rates.json; empty with --true-reference (main finds them)."""
    from connector_tax.contract import StudyLayout

    if args.ref_safe is not None:
        return {"ref_safe": args.ref_safe, "ref_load": args.ref_load or args.ref_safe}
    if args.true_reference:
        return {}  # found by main, from the oracle's own cells
    path = StudyLayout.of(study.study).reference_rates
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ValueError(
            f"--ref-safe: no reference rates given and none in {path} (run the reference stage, give --ref-safe, or --true-reference for the oracle's own)"
        ) from None
    if doc.get("ref_safe") is None:
        raise ValueError(f"--ref-safe: {path} has no ref_safe")
    ref_load = args.ref_load or doc.get("ref_load") or doc["ref_safe"]
    return {"ref_safe": float(doc["ref_safe"]), "ref_load": float(ref_load)}


def main(args: Args) -> int:
    from connector_tax.config import ConfigError, load_study
    from connector_tax.oracle.truth import truth
    from connector_tax.oracle.truth_render import render

    try:
        study = load_study(args.config)
        if study.backend != "sim":
            raise ValueError(f"backend: {study.backend!r} — only the simulator (backend sim) has a known truth")
        names = study.names
        chosen = args.variants.split(",") if args.variants else None
        unknown = [n for n in chosen or [] if n not in names]
        if unknown:
            raise ValueError(f"--variants: {', '.join(unknown)} not in the study (it has {', '.join(names)})")
        reference = reference_of(args, study)
        if args.json and (why := unwritable(args.json, "--json")):  # before minutes of replications
            raise ValueError(why)
    except (ConfigError, ValueError) as exc:
        print(f"ctax truth: {exc}", file=sys.stderr)
        return 2
    ts = TruthSettings(
        requests=args.requests,
        warmup=args.warmup,
        precision=args.precision,
        max_replications=max(args.max_replications, 2),
        seed=args.seed,
        jobs=args.jobs,
    )
    found = None
    if not reference:
        from connector_tax.oracle.true_reference import true_reference

        found = true_reference(study, ts)  # every variant: ref_safe must hold for all of them
        reference = {"ref_safe": float(found["ref_safe"]), "ref_load": float(found["ref_load"])}
    doc = truth(study, reference, chosen, ts, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if found is not None:
        doc["true_reference"] = found
    print(render(doc), end="")
    if args.json:
        try:
            write_atomic(Path(args.json), json.dumps(doc, indent=1, default=str) + "\n")
        except OSError as exc:  # checked before the work; the disk or the folder changed since
            print(f"ctax truth: {write_failed(args.json, '--json', exc)}", file=sys.stderr)
            return 2
    return 0
