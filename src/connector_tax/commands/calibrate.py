"""`ctax calibrate`: fit an engine profile from a real study, or check one against a real study.

    ctax calibrate RESULTS_DIR -o PROFILE.yaml [--name NAME] [--json FILE]
    ctax calibrate --check RESULTS_DIR --profile PROFILE.yaml [--json FILE] [--workdir DIR]

calibrate/fit.py fits, calibrate/check.py checks, calibrate/render.py prints either. Bad input is
one line on stderr and exit 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from connector_tax.arguments import unwritable, write_failed
from connector_tax.atomic import write_atomic, write_json
from connector_tax.calibrate.render import render_check, render_fit
from connector_tax.calibrate.study_tables import CalibrationError
from connector_tax.commands.namespace import runs
from connector_tax.config.profile import dump_profile


@dataclass(frozen=True)
class Args:
    """`ctax calibrate`."""

    results: str
    out: str | None
    name: str | None
    check: bool
    profile: str | None
    json: str | None
    workdir: str | None
    launch_speed: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS_DIR", help="a real study's results folder (results/<study>)")
    parser.add_argument("-o", "--out", metavar="PROFILE.yaml", help="where to write the fitted profile")
    parser.add_argument("--name", help="the profile's name (default <study>-calibrated)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="instead of fitting: replay every cell of RESULTS_DIR in virtual time with --profile and print "
        "predicted against measured, per cell and per tax",
    )
    parser.add_argument("--profile", metavar="PROFILE.yaml", help="the profile to check (with --check)")
    parser.add_argument("--json", metavar="FILE", help="also write the fit's quality (or the check) as JSON here")
    parser.add_argument("--workdir", metavar="DIR", help="with --check: keep the virtual cells here (default: removed)")
    parser.add_argument(
        "--launch-speed",
        action="store_true",
        help="with --check, a diagnostic: run each launch at the speed its own engine steps show against the "
        "profile's (a shared host's load on the day), to tell the model's error from the host's",
    )
    runs(parser, Args, main)


def main(args: Args) -> int:
    from connector_tax.config import ConfigError

    try:
        if args.check:
            if not args.profile:
                raise CalibrationError("--check needs --profile PROFILE.yaml (the profile to check)")
            if args.out:
                raise CalibrationError("-o/--out: --check writes no profile (use --json FILE for its numbers)")
            _check_outputs((args.json, "--json", False), (args.workdir, "--workdir", True))
            from connector_tax.calibrate.check import check

            workdir = Path(args.workdir) if args.workdir else None
            result = check(Path(args.results), args.profile, workdir, launch_speed=args.launch_speed).as_dict()
            print(render_check(result), end="")
            return _write(args.json, "--json", lambda path: write_json(path, result))
        if not args.out:
            raise CalibrationError("-o/--out: where to write the profile (e.g. -o configs/profiles/NAME.yaml)")
        if args.profile:
            raise CalibrationError("--profile: only with --check (fitting writes a profile, -o)")
        if args.workdir:
            raise CalibrationError("--workdir: only with --check (it keeps the check's virtual cells)")
        _check_outputs((args.out, "-o", False), (args.json, "--json", False))
        from connector_tax.calibrate.fit import calibrate

        profile = calibrate(Path(args.results), args.name)
    except (CalibrationError, ConfigError) as exc:
        print(f"ctax calibrate: {exc}", file=sys.stderr)
        return 2
    text = (
        f"# Engine profile fitted by `ctax calibrate {args.results}` from the records of study "
        f"{profile.provenance.get('study')} ({profile.provenance.get('served_by')}).\n"
        "# Plain data: a config names it as `sim: {profile: FILE}`. `fit:` holds every term's fit quality;\n"
        "# a term the data did not identify is 0 (a scale: 1) there and in the numbers.\n"
    ) + dump_profile(profile)
    if code := _write(args.out, "-o", lambda path: write_atomic(path, text)):
        return code
    print(render_fit(profile), end="")
    print(f"wrote {args.out}")
    return _write(args.json, "--json", lambda path: write_json(path, profile.fit))


def _check_outputs(*outputs: tuple[str | None, str, bool]) -> None:
    """The outputs named (path, flag, a folder?), each writable, before the work starts."""
    for path, flag, folder in outputs:
        if path and (why := unwritable(path, flag, folder)):
            raise CalibrationError(why)


def _write(path: str | None, flag: str, write: Callable[[Path], None]) -> int:
    """Write an output if one is named: 0, or 2 with one line if it cannot be written after all."""
    if not path:
        return 0
    try:
        write(Path(path))
    except OSError as exc:  # checked before the work; the disk or the folder changed since
        print(f"ctax calibrate: {write_failed(path, flag, exc)}", file=sys.stderr)
        return 2
    return 0
