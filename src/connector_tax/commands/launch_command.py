"""`ctax launch-command`: a variant's exact server launch (argv JSON or launch.sh), or every
variant's launch script for a GPU host (launch_scripts/launch_<variant>.sh); nothing is launched."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from connector_tax.arguments import number, unwritable
from connector_tax.commands.namespace import runs
from connector_tax.config import ConfigError, load_study
from connector_tax.launch.command import launch_spec
from connector_tax.launch.scripts import write_scripts


@dataclass(frozen=True)
class Args:
    """`ctax launch-command`."""

    config: str
    variant: str | None
    write_scripts: Path | None
    port: int
    step_log: str | None
    script: bool
    sidecar_port: list[str]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="study config YAML")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--variant", metavar="NAME", help="the variant (a configuration of the study)")
    which.add_argument(
        "--write-scripts", metavar="DIR", type=Path, help="write launch_<variant>.sh of every variant into DIR"
    )
    parser.add_argument(
        "--port", type=number(int, 0, 65535), default=8000, help="port the server would bind (default 8000)"
    )
    parser.add_argument("--step-log", metavar="PATH", help="step log path the server would write")
    parser.add_argument("--script", action="store_true", help="print launch.sh instead of the argv JSON")
    parser.add_argument(
        "--sidecar-port",
        action="append",
        default=[],
        metavar="NAME=PORT",
        help="where a sidecar of the variant listens (e.g. lmcache_server=23456); default its planned port",
    )
    runs(parser, Args, main)


def _sidecar_ports(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        name, _, port = pair.partition("=")
        if not name or not port.isdigit():
            raise ValueError(f"--sidecar-port: {pair!r} is not NAME=PORT")
        out[name] = int(port)
    return out


def main(args: Args) -> int:
    try:
        if args.write_scripts is not None:
            if why := unwritable(args.write_scripts, "--write-scripts", folder=True):
                raise ValueError(why)
            for path in write_scripts(args.config, args.write_scripts):
                print(path)
            return 0
        study = load_study(args.config)
        assert args.variant is not None  # --variant or --write-scripts, one of them required
        variant = study.variant(args.variant)
        spec = launch_spec(args.config, study, variant, args.port, args.step_log, _sidecar_ports(args.sidecar_port))
    except (ConfigError, ValueError) as exc:
        print(f"ctax launch-command: {exc}", file=sys.stderr)
        return 2
    print(spec.script() if args.script else json.dumps(spec.argv))
    return 0
