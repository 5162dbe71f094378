"""The one place argparse's Namespace is read: a parser says which dataclass its arguments fill and
which function runs them (`runs`), and `run` hands that function the dataclass, never the
Namespace. A command's `add_arguments` calls `runs` on its own parser, or on each of its actions'
parsers (`ctax config check`, `ctax pipeline STEP`)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

A = TypeVar("A")

# The Namespace attribute that carries what runs the parsed arguments (a name no option takes).
_RUNS = "_ctax_runs"


@dataclass(frozen=True)
class Runs(Generic[A]):
    """A parser's arguments as a dataclass, and the function that runs them."""

    args: type[A]
    main: Callable[[A], int]


def runs(parser: argparse.ArgumentParser, args: type[A], main: Callable[[A], int]) -> None:
    """`parser`'s parsed arguments fill `args` (a dataclass whose fields are the parser's dests) and
    go to `main`. An action's parser overrides its command's (argparse copies a subparser's
    defaults over its parent's)."""
    if not dataclasses.is_dataclass(args):
        raise TypeError(f"{args!r} is not a dataclass")
    parser.set_defaults(**{_RUNS: Runs(args, main)})


def args_of(args: type[A], namespace: argparse.Namespace) -> A:
    """The dataclass `args` from the parsed namespace, each field from the dest of its name. A
    field no option fills is a programming error, said with the parser's dests."""
    names = [f.name for f in dataclasses.fields(args)]  # type: ignore[arg-type]  # a dataclass type, checked in runs()
    missing = [n for n in names if not hasattr(namespace, n)]
    if missing:
        known = sorted(k for k in vars(namespace) if k != _RUNS)
        raise TypeError(f"{args.__name__}: no option fills {', '.join(missing)} (the parser has {', '.join(known)})")
    return args(**{n: getattr(namespace, n) for n in names})


def run(namespace: argparse.Namespace) -> int:
    """Run what the parser that parsed `namespace` runs, with its dataclass."""
    found: Runs[Any] = getattr(namespace, _RUNS)
    return int(found.main(args_of(found.args, namespace)) or 0)
