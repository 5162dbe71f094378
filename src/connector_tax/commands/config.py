"""`ctax config check [--static] FILE`: the file (schema and cross-field checks), Phase B cells it
cannot bound (a warning), then, unless --static, what this host would trip over at launch.

config/ validates, planning/resolution.py finds the unbounded cells, launch/hostcheck.py checks
the host; this joins them. Exit 0, or 2 with one line naming the setting.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from connector_tax.commands.namespace import runs
from connector_tax.config import ConfigError, load_config, load_study, ok_line
from connector_tax.launch.hostcheck import check_host
from connector_tax.planning.resolution import unbounded_warnings


@dataclass(frozen=True)
class CheckArgs:
    """`ctax config check`."""

    file: str
    static: bool


def add_arguments(config: argparse.ArgumentParser) -> None:
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a study config file")
    check.add_argument("file", help="path to a study config YAML")
    check.add_argument(
        "--static",
        action="store_true",
        help="the file only; by default a vLLM study on GPUs is also checked against this host "
        "(model downloaded, PYTORCH_CUDA_ALLOC_CONF, RDMA devices)",
    )
    runs(check, CheckArgs, main)


def main(args: CheckArgs) -> int:
    """The ok line only once every check passed: a refusal on this host is its one line on
    stderr, with no ok line on stdout before it."""
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    study = load_study(args.file)
    if not args.static:
        try:
            check_host(study)
        except ConfigError as exc:
            print(f"{args.file}: on this host: {exc}", file=sys.stderr)
            return 2
    print(ok_line(args.file, config))
    for line in unbounded_warnings(study):
        print(f"warning: {line}")
    return 0
