"""`ctax bench`'s flag types: each reads one value or raises argparse's error with one line that
says what is wrong (the parser prints it naming the flag, exit 2), before anything starts."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, NoReturn

from connector_tax.arguments import number
from connector_tax.loadgen.host.affinity import parse_cpulist
from connector_tax.loadgen.schedule.shapes import ShapePair, parse_shapes
from connector_tax.loadgen.worker.urls import parse_url


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one clear line on stderr and exit 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ctax bench: {message}\n")


def positive(kind: type[int] | type[float]) -> Any:
    return number(kind, 0, low_open=True)


def non_negative(kind: type[int] | type[float], noun: str) -> Any:
    return number(kind, 0, noun=noun)


seconds = non_negative(float, "a valid number")
microseconds = non_negative(int, "'off' or a whole number of µs")


rt_priority = number(int, 1, 99, noun="a SCHED_FIFO priority (1..99)")


def cpu_latency(text: str) -> int | None:
    return None if text == "off" else microseconds(text)


def rates(text: str) -> list[float]:
    rates = [positive(float)(item) for item in text.split(",") if item.strip()]
    if not rates:
        raise argparse.ArgumentTypeError(f"{text!r} holds no rate")
    return rates


def url(text: str) -> str:
    try:
        parse_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cpus(text: str) -> tuple[int, ...]:
    """A CPU list as the kernel writes one (0-3,8): which CPUs exist is checked with the options."""
    try:
        found = parse_cpulist(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list (e.g. 0-3,8)") from None
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} holds no CPU")
    return tuple(sorted(set(found)))


def seed(text: str) -> int:
    value: int = non_negative(int, "a whole number")(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"{text} must be < 2^63")
    return value


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file-name-safe name (letters, digits, . _ -)")
    return text


def env_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an environment variable name")
    return text


def file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return text


def shapes(text: str) -> list[ShapePair]:
    try:
        return parse_shapes(text)
    except ValueError as exc:  # argparse shows only an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shapes: ")) from None


def reject_unknown(p: argparse.ArgumentParser) -> None:
    """Unknown flags are this parser's error, in its one-line form: argparse otherwise hands
    a subcommand's leftovers to the top-level parser, which prints its usage and a second line."""
    parse_known = p.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = parse_known(args, namespace)
        if extras:
            p.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    # argparse has no hook for what to do with unknown arguments: this parser's own method is
    # replaced (mypy flags any assignment to a method).
    p.parse_known_args = parse_known_args  # type: ignore[method-assign]
