"""The `ctax` console script: one subcommand per component, each a module of connector_tax.commands."""

# A command table, as vLLM's CLI and benchmarks/sweep keep theirs: each subcommand is one entry
# naming its module in commands/, which holds its arguments as a dataclass (Args), the function
# that adds them to its parser and the main that runs them (commands/README.md); this file only
# dispatches. Only the chosen command's module is imported (its arguments are added only when it
# is the one typed), so a Snakemake job's `ctax pipeline STEP` or `ctax analyze` pays for nothing
# else: the full parser would import every subcommand, about a second per job on a loaded machine.

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from connector_tax.commands.namespace import run


@dataclass(frozen=True)
class Command:
    """One `ctax` subcommand."""

    name: str
    help: str
    module: str  # its module in connector_tax.commands
    # A bad argument is one line naming the command (`ctax plan: ...`), not argparse's usage block.
    one_line_errors: bool = False
    # Every word after the command's name is its Args' one field, options first included
    # (`ctax benchmark --list`), which argparse's REMAINDER does not hand over.
    argv: bool = False

    def load(self) -> Any:
        return importlib.import_module(f"connector_tax.commands.{self.module}")


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser: argparse takes no error hook, so the one-line error is a subclass."""

    def __init__(self, *args: Any, one_line_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.one_line_errors = one_line_errors

    def error(self, message: str) -> NoReturn:
        if self.one_line_errors:
            self.exit(2, f"{self.prog}: {message}\n")
        super().error(message)


COMMANDS = {
    c.name: c
    for c in (
        Command("config", "study configuration tools", "config"),
        Command("sim", "run the embedded simulated vLLM server", "sim"),
        Command(
            "truth",
            "the simulator's true p90s, taxes and H1-H6 verdicts of a study config (virtual time)",
            "truth",
            one_line_errors=True,
        ),
        Command("launch-command", "print the exact server launch of a config, launch nothing", "launch_command"),
        Command("bench", "drive a server with the open-loop load generator", "bench", one_line_errors=True),
        Command("analyze", "statistics, taxes and verdicts from results/<study> (figures with --figures)", "analyze"),
        Command(
            "compare",
            "what changed between two studies (or two variants of one), with launch-aware intervals",
            "compare",
            one_line_errors=True,
        ),
        Command(
            "calibrate",
            "fit the simulator's engine profile from a real study (-o PROFILE), or check one (--check --profile)",
            "calibrate",
            one_line_errors=True,
        ),
        Command(
            "plan",
            "a study's cells, estimated wall time per stage, GPU-hours, nothing run",
            "plan",
            one_line_errors=True,
        ),
        Command("pipeline", "run one step of the study as its Snakemake rule does", "pipeline"),
        Command("benchmark", "run one of the project's benchmarks (ctax benchmark --list)", "benchmark", argv=True),
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
        if command.name == chosen:
            command.load().add_arguments(own)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = COMMANDS.get(argv[0]) if argv else None
    if command is not None and command.argv:
        module = command.load()
        return int(module.main(module.Args(tuple(argv[1:]))) or 0)
    return run(build_parser(argv).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
