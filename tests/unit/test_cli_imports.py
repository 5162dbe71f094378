"""`ctax` imports only the command typed: a Snakemake job's `ctax pipeline STEP` builds the parser
of that one command and runs that one step, never importing another command's module or another
step's (the full parser would cost about a second per job on a loaded host; cli.py)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

from connector_tax import cli

STEP_MODULES = {
    "study-config": "studyfolder",
    "preflight": "preflight",
    "phase": "phase",
    "reference": "reference",
    "manifest": "manifest",
}


def imported_running(argv: list[str], step_module: str) -> set[str]:
    """The connector_tax modules a fresh process holds after `ctax argv` parsed and ran, the
    step's own `job` replaced by one that does nothing (its module is imported for that)."""
    code = (
        "import sys\n"
        f"import connector_tax.pipeline.{step_module} as step\n"
        "step.check_job = step.merge_job = step.job = lambda *a, **k: 0\n"
        "from connector_tax import cli\n"
        f"assert cli.main({argv!r}) == 0\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('connector_tax'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_each_pipeline_step_imports_no_other_step_and_no_other_command() -> None:
    argvs = {
        "study-config": ["--config", "c.yaml"],
        "preflight": ["check", "--config", "c.yaml", "--variant", "plain", "--out", "o", "--log-dir", "l"],
        "phase": ["--config", "c.yaml", "--variant", "plain", "--phase", "phase_a"],
        "reference": ["--config", "c.yaml"],
        "manifest": ["--config", "c.yaml"],
    }
    assert sorted(argvs) == sorted(STEP_MODULES)
    for step, module in STEP_MODULES.items():
        loaded = imported_running(["pipeline", step, *argvs[step]], module)
        steps = {m for m in loaded if m.startswith("connector_tax.pipeline.")}
        assert steps == {f"connector_tax.pipeline.{module}"}, (step, steps)
        commands = {m for m in loaded if m.startswith("connector_tax.commands.")}
        assert commands == {"connector_tax.commands.namespace", "connector_tax.commands.pipeline"}, (step, commands)


def test_the_parser_holds_the_chosen_commands_arguments_only() -> None:
    code = (
        "import sys\nfrom connector_tax import cli\n"
        "cli.build_parser(['analyze', 'results/x'])\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('connector_tax.commands.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert set(out.split()) == {"connector_tax.commands.namespace", "connector_tax.commands.analyze"}


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and its actions' parsers, at every depth."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def test_every_command_module_has_the_one_style() -> None:
    """Each module of commands/: add_arguments(parser) says, for the parser or for each action's,
    the frozen dataclass its arguments fill and the main that runs it (commands/namespace.py);
    every `ctax` command is one of them."""
    modules = sorted(p.stem for p in (Path(cli.__file__).parent / "commands").glob("*.py"))
    modules = [m for m in modules if m != "namespace" and not m.startswith("_")]  # _x.py: a command's helper
    assert {c.module for c in cli.COMMANDS.values()} <= set(modules)
    for name in modules:
        module = importlib.import_module(f"connector_tax.commands.{name}")
        parser = argparse.ArgumentParser(prog=name)
        module.add_arguments(parser)
        leaves = [p for p in _parsers(parser) if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]
        for leaf in leaves:
            runs = leaf.get_default("_ctax_runs")
            assert runs is not None, f"{leaf.prog}: no dataclass and main (namespace.runs)"
            assert dataclasses.is_dataclass(runs.args) and runs.args.__dataclass_params__.frozen, leaf.prog
            # one field per option: none the namespace cannot fill, none an option fills unread
            dests = {a.dest for a in leaf._actions if a.dest != "help"}
            assert {f.name for f in dataclasses.fields(runs.args)} == dests, leaf.prog
