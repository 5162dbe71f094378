"""What every benchmark shares: its argument parser and its JSON output.

The parser is `ctax benchmark NAME`'s: the module's docstring as the description, a bad argument
as one line naming it (exit 2), `--json FILE` for every benchmark, and `--repeats` / `--seconds`
for those that repeat a measurement or run one for a set time, so that the same word means the
same thing in every benchmark. The JSON carries the numbers with the conditions they were
measured in (host, CPUs, load average at the start and the end, versions, the command line):
this machine is shared, and a number without them cannot be judged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import connector_tax
from connector_tax.atomic import write_atomic

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# The running benchmark's command line and the host's state when it parsed its arguments (one
# benchmark runs per process; write_json adds the state at the end).
_run: dict[str, Any] = {}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        _run.clear()
        _run.update(
            benchmark=self.prog.removeprefix("ctax benchmark "),
            argv=list(sys.argv[1:] if args is None else args),
            start=_host_state(),
        )
        return parsed


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def comma_list(cast: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """An argument type: comma-separated values, each read by `cast` ("what" names one)."""

    def read(text: str) -> list[T]:
        try:
            values = [cast(x.strip()) for x in text.split(",") if x.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}")
        return values

    return read


def parser(
    file: str,
    doc: str | None,
    *,
    json_default: str | None = None,
    repeats: int | None = None,
    repeats_help: str = "repeats of the whole measurement (the machine is shared: read the medians)",
    seconds: float | None = None,
    seconds_help: str = "measured seconds per cell",
) -> argparse.ArgumentParser:
    """The parser of the benchmark in `file` (its __file__), described by `doc` (its __doc__);
    --repeats and --seconds only where a default is given: the benchmark has them."""
    p = _Parser(
        prog=f"ctax benchmark {Path(file).stem}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        default=Path(json_default) if json_default else None,
        help="write the numbers here as JSON, with the conditions they were measured in"
        + (f" (default {json_default})" if json_default else ""),
    )
    if repeats is not None:
        p.add_argument(
            "--repeats", type=positive_int, default=repeats, metavar="N", help=f"{repeats_help} (default {repeats})"
        )
    if seconds is not None:
        p.add_argument(
            "--seconds", type=positive_float, default=seconds, metavar="S", help=f"{seconds_help} (default {seconds:g})"
        )
    return p


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """The results under "results", beside the benchmark's command line and conditions; nothing
    when no --json was given."""
    if path is None:
        return
    record = {
        "benchmark": _run.get("benchmark"),
        "argv": _run.get("argv"),
        "conditions": {"start": _run.get("start"), "end": _host_state(), "versions": _versions()},
        "results": results,
    }
    write_atomic(path, json.dumps(record, indent=1, default=str) + "\n")  # default=str: paths among the settings
    print(f"wrote {path}", flush=True)


def pct(xs: list[float], q: float) -> float | None:
    """The q-th percentile of sorted xs by nearest rank, to 0.1 (None for no values)."""
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1)], 1)


def _host_state() -> dict[str, Any]:
    return {
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()],
    }


def _versions() -> dict[str, Any]:
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain")
    return {
        "python": platform.python_version(),
        "connector_tax": connector_tax.__version__,
        "git_head": git("rev-parse", "--short", "HEAD"),
        "git_uncommitted_files": None if status is None else len(status.splitlines()),
    }
