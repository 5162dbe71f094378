"""The `ctax` console script: one subcommand per component, each implemented in its module."""

from __future__ import annotations

import argparse
import sys


def _config_check(args: argparse.Namespace) -> int:
    from connector_tax.config import check_file

    return check_file(args.file)


def _sim(args: argparse.Namespace) -> int:
    from connector_tax.sim.server import main

    return main(args)


def _launch_command(args: argparse.Namespace) -> int:
    from connector_tax.launch.command import main

    return main(args)


def _bench(args: argparse.Namespace) -> int:
    from connector_tax.loadgen.cli import main

    return main(args)


def _analyze(args: argparse.Namespace) -> int:
    from connector_tax.analysis.cli import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="study configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", help="validate a study config file")
    check.add_argument("file", help="path to a study config YAML")
    check.set_defaults(func=_config_check)

    from connector_tax.sim.cli_args import add_sim_arguments

    sim = sub.add_parser("sim", help="run the embedded simulated vLLM server")
    add_sim_arguments(sim)
    sim.set_defaults(func=_sim)

    from connector_tax.launch.command import add_arguments as add_launch_arguments

    launch = sub.add_parser("launch-command", help="print the exact server launch of a config, launch nothing")
    add_launch_arguments(launch)
    launch.set_defaults(func=_launch_command)

    from connector_tax.loadgen.cli import add_bench_arguments

    bench = sub.add_parser("bench", help="drive a server with the open-loop load generator")
    add_bench_arguments(bench)
    bench.error = lambda message: bench.exit(2, f"ctax bench: {message}\n")  # type: ignore[method-assign]
    bench.set_defaults(func=_bench)

    from connector_tax.analysis.cli import add_arguments as add_analyze_arguments

    analyze = sub.add_parser("analyze", help="statistics, taxes, verdicts and figures from results/<study>")
    add_analyze_arguments(analyze)
    analyze.set_defaults(func=_analyze)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
