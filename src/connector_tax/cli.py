"""The `ctax` console script: one subcommand per component, each implemented in its module."""

# A command table, as vLLM's CLI and benchmarks/sweep keep theirs: each subcommand is one entry
# naming the function that adds its arguments and the one that runs it, both in the module that
# owns the command; this file only dispatches. Only the chosen command's module is imported (its
# arguments are added only when it is the one typed), so a Snakemake job's `ctax pipeline STEP`
# or `ctax analyze` pays for nothing else: the full parser would import every subcommand, about
# a second per job on a loaded machine.

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn


def _lazy(target: str) -> Callable[..., Any]:
    """`module:function`, imported when it is first called."""
    module, _, name = target.partition(":")

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args)

    return call


@dataclass(frozen=True)
class Command:
    """One `ctax` subcommand."""

    name: str
    help: str
    add: Callable[[argparse.ArgumentParser], None]  # adds its arguments to its parser
    run: Callable[[Any], Any]  # runs it: the parsed arguments (or, with argv, the argument list) -> exit code
    # A bad argument is one line naming the command (`ctax plan: ...`), not argparse's usage block.
    one_line_errors: bool = False
    # Its own parser takes every argument after the command's name, options first included
    # (`ctax benchmark --list`), which argparse's REMAINDER does not hand over.
    argv: bool = False


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser: argparse takes no error hook, so the one-line error is a subclass."""

    def __init__(self, *args: Any, one_line_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.one_line_errors = one_line_errors

    def error(self, message: str) -> NoReturn:
        if self.one_line_errors:
            self.exit(2, f"{self.prog}: {message}\n")
        super().error(message)


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


def _add_config(config: argparse.ArgumentParser) -> None:
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    _lazy("connector_tax.planning.config_check:add_arguments")(
        actions.add_parser("check", help="validate a study config file")
    )


def _add_pipeline(pipeline: argparse.ArgumentParser) -> None:
    steps = "\n".join(f"  {name:13} {text}" for name, (_, text) in PIPELINE_STEPS.items())
    pipeline.description = f"steps:\n{steps}"
    pipeline.formatter_class = argparse.RawDescriptionHelpFormatter
    pipeline.add_argument("step", choices=list(PIPELINE_STEPS), metavar="STEP")
    pipeline.add_argument("args", nargs=argparse.REMAINDER, help="the step's own arguments (ctax pipeline STEP --help)")


def _run_pipeline(args: argparse.Namespace) -> int:
    return int(importlib.import_module(PIPELINE_STEPS[args.step][0]).main(args.args) or 0)


def _add_benchmark(benchmark: argparse.ArgumentParser) -> None:
    benchmark.add_argument("args", nargs=argparse.REMAINDER, help="NAME and its arguments, or --list")


COMMANDS = {
    c.name: c
    for c in (
        Command("config", "study configuration tools", _add_config, _lazy("connector_tax.planning.config_check:main")),
        Command(
            "sim",
            "run the embedded simulated vLLM server",
            _lazy("connector_tax.sim.cli_args:add_sim_arguments"),
            _lazy("connector_tax.sim.server:main"),
        ),
        Command(
            "truth",
            "the simulator's true p90s, taxes and H1-H6 verdicts of a study config (virtual time)",
            _lazy("connector_tax.oracle.truth_cli:add_arguments"),
            _lazy("connector_tax.oracle.truth_cli:main"),
            one_line_errors=True,
        ),
        Command(
            "launch-command",
            "print the exact server launch of a config, launch nothing",
            _lazy("connector_tax.launch.cli:add_arguments"),
            _lazy("connector_tax.launch.cli:main"),
        ),
        Command(
            "bench",
            "drive a server with the open-loop load generator",
            _lazy("connector_tax.loadgen.cli:add_bench_arguments"),
            _lazy("connector_tax.loadgen.cli:main"),
            one_line_errors=True,
        ),
        Command(
            "analyze",
            "statistics, taxes and verdicts from results/<study> (figures with --figures)",
            _lazy("connector_tax.pipeline.analyze:add_arguments"),
            _lazy("connector_tax.pipeline.analyze:main"),
        ),
        Command(
            "compare",
            "what changed between two studies (or two variants of one), with launch-aware intervals",
            _lazy("connector_tax.pipeline.compare:add_arguments"),
            _lazy("connector_tax.pipeline.compare:main"),
            one_line_errors=True,
        ),
        Command(
            "calibrate",
            "fit the simulator's engine profile from a real study (-o PROFILE), or check one (--check --profile)",
            _lazy("connector_tax.calibrate.cli:add_arguments"),
            _lazy("connector_tax.calibrate.cli:main"),
            one_line_errors=True,
        ),
        Command(
            "plan",
            "a study's cells, estimated wall time per stage, GPU-hours, nothing run",
            _lazy("connector_tax.planning.plan_cli:add_arguments"),
            _lazy("connector_tax.planning.plan_cli:main"),
            one_line_errors=True,
        ),
        Command("pipeline", "run one step of the study as its Snakemake rule does", _add_pipeline, _run_pipeline),
        Command(
            "benchmark",
            "run one of the project's benchmarks (ctax benchmark --list)",
            _add_benchmark,
            _lazy("connector_tax.benchmark:main"),
            argv=True,
        ),
    )
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """`ctax` with every command listed, and the arguments of the one `argv` names (the first of
    its words that names one: the top-level parser has no option that takes a value)."""
    chosen = next((word for word in argv if word in COMMANDS), None)
    parser = argparse.ArgumentParser(prog="ctax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS.values():
        own = sub.add_parser(command.name, help=command.help, one_line_errors=command.one_line_errors)
        own.set_defaults(run=command.run)
        if command.name == chosen:
            command.add(own)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = COMMANDS.get(argv[0]) if argv else None
    if command is not None and command.argv:
        return int(command.run(argv[1:]) or 0)
    args = build_parser(argv).parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
