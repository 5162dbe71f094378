"""`ctax benchmark NAME [ARGS...]`: the project's benchmarks of itself, run by name.

They are the modules of a checkout's benchmarks/ folder, outside the package (a built wheel has
none): benchmarks/NAME.py with `main(argv) -> int`. Its docstring's first paragraph says what it
measures (the number and its unit), and its lines `Backs: LINK` name the docs sections that quote
that number (links relative to benchmarks/, with the heading's anchor); `--list` shows both.
A module whose name begins with an underscore is a helper of theirs (their parser, servers,
clients), not a benchmark. The checkout is the one the package's other files come from
(connector_tax.resources, $CONNECTOR_TAX_ROOT).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from connector_tax import resources
from connector_tax.commands.namespace import runs

USAGE = "usage: ctax benchmark NAME [ARGS...] | ctax benchmark --list  (ctax benchmark NAME --help: its options)"


@dataclass(frozen=True)
class Args:
    """`ctax benchmark`: every word after it, options first included (the console script hands
    them over whole: argparse's REMAINDER does not take `--list`)."""

    words: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """For `ctax --help` and the docs' parse check only: the console script runs this command
    with Args(words) directly."""
    parser.add_argument("words", nargs=argparse.REMAINDER, help="NAME and its arguments, or --list")
    runs(parser, Args, main)


class BenchmarkError(Exception):
    """A one-line reason why no benchmark can run."""


def folder() -> Path:
    """The checkout's benchmarks/ folder."""
    try:
        root = resources.root()
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None
    found = root / "benchmarks"
    if not found.is_dir():
        raise BenchmarkError(
            f"the benchmarks live in a connector-tax checkout's benchmarks/ folder and {root} has none "
            "(an installed package carries none): set CONNECTOR_TAX_ROOT to a checkout"
        )
    return found


# A docstring's line naming the docs sections whose numbers the benchmark backs.
BACKS = re.compile(r"^\s*Backs:\s*(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark as its docstring describes it (read, not imported: importing them all would
    load pandas and the rest just to list them)."""

    name: str
    measures: str  # the first paragraph, on one line (a sentence that wraps is not cut mid-way)
    backs: tuple[str, ...]  # links relative to benchmarks/: "../docs/performance.md#soaks"

    @classmethod
    def read(cls, path: Path) -> Benchmark:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))) or ""
        first = " ".join(doc.strip().split("\n\n")[0].split())
        backs = tuple(link.strip() for found in BACKS.findall(doc) for link in found.split(",") if link.strip())
        return cls(path.stem, first or "(no description)", backs)

    def where(self) -> str:
        """The backed sections as paths from the checkout's root (docs/performance.md#soaks)."""
        if not self.backs:
            return "(backs no number in docs/)"
        return ", ".join(os.path.normpath(os.path.join("benchmarks", link)) for link in self.backs)


def runnable(where: Path) -> dict[str, Benchmark]:
    """Every benchmark in `where` by name."""
    return {path.stem: Benchmark.read(path) for path in sorted(where.glob("*.py")) if not path.name.startswith("_")}


def listing(where: Path) -> str:
    """One line a benchmark: its name, what it measures, and where docs/ quotes the number."""
    found = runnable(where)
    width = max(map(len, found), default=0)
    lines = [f"benchmarks in {where}: what each measures -> the docs sections that quote it"]
    lines += [f"  {name:<{width}}  {b.measures} -> {b.where()}" for name, b in found.items()]
    lines.append("(ctax benchmark NAME --help: a benchmark's options)")
    return "\n".join(lines) + "\n"


def run(where: Path, name: str, argv: list[str]) -> int:
    """benchmarks/NAME.py's main(argv), in this process, with its helpers importable as they are
    when it runs as a script (its folder first on sys.path)."""
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    spec = importlib.util.spec_from_file_location(name, where / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses and worker processes look it up by name
    spec.loader.exec_module(module)
    return int(module.main(argv) or 0)


def main(args: Args) -> int:
    argv = list(args.words)
    first, rest = (argv[0], argv[1:]) if argv else ("--list", [])
    if first in ("-h", "--help"):
        print(USAGE)
    try:
        where = folder()
        if first in ("--list", "-h", "--help"):
            if rest:
                raise BenchmarkError(f"{first} takes no arguments, got {' '.join(rest)}")
            print(listing(where), end="")
            return 0
        if first.startswith("-"):
            raise BenchmarkError(f"unknown option {first}; {USAGE.removeprefix('usage: ')}")
        if first not in runnable(where):
            raise BenchmarkError(f"no benchmark named {first!r} in {where} (ctax benchmark --list shows them)")
    except BenchmarkError as exc:
        print(f"ctax benchmark: {exc}", file=sys.stderr)
        return 2
    return run(where, first, rest)
