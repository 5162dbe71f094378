"""`ctax compare A B [-o DIR] [--margin M]`: what changed between two studies, or two variants of
one (`results/<study>:<variant>`), with launch-aware intervals (analysis/compare.py computes,
plots/compare_figure.py draws, this joins them). Without -o the Markdown goes to stdout."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from connector_tax.analysis.compare import DEFAULT_MARGIN, CompareError, compare
from connector_tax.analysis.compare_report import render, to_csv
from connector_tax.analysis.core import write_json_atomic
from connector_tax.arguments import number, unwritable, write_failed
from connector_tax.atomic import write_atomic
from connector_tax.commands.namespace import runs
from connector_tax.plots.compare_figure import draw


@dataclass(frozen=True)
class Args:
    """`ctax compare`."""

    a: str
    b: str
    out: Path | None
    margin: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="results/<study>, or results/<study>:<variant>")
    parser.add_argument("b", metavar="B", help="the same for the other side (changes are B / A - 1)")
    parser.add_argument(
        "-o", "--out", type=Path, metavar="DIR", help="write compare.md, compare.csv, compare.json and the figure here"
    )
    parser.add_argument(
        "--margin",
        type=number(float, 0, low_open=True),
        default=DEFAULT_MARGIN,
        help=f"the change below which 'no change' is resolved, as a fraction (default {DEFAULT_MARGIN:g} = ±10 %%)",
    )
    runs(parser, Args, main)


# Exit codes: 0 compared; 2 bad input, "nothing compared" among it (no row to judge is never a pass).
BAD_INPUT = 2


def main(args: Args) -> int:
    if args.out is not None and (why := unwritable(args.out, "-o", folder=True)):
        return _fail(why)
    try:
        doc = compare(args.a, args.b, margin=args.margin)
    except CompareError as exc:
        return _fail(str(exc))
    if doc["nothing_compared"]:
        return _fail(f"nothing compared: {doc['nothing_compared']}")
    if args.out is None:
        sys.stdout.write(render(doc))
        return 0
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figure = draw(doc, out)
        write_atomic(out / "compare.csv", to_csv(doc))
        write_json_atomic(out / "compare.json", doc)
        write_atomic(out / "compare.md", render(doc, Path(figure[0]).name if figure else None))
    except OSError as exc:  # checked before the work; the disk or the folder changed since
        return _fail(write_failed(out, "-o", exc))
    counts = {
        c: sum(r["call"] == c for r in doc["rows"]) for c in ("changed", "no change resolved", "below resolution")
    }
    print(
        f"{len(doc['rows'])} comparisons ("
        + ", ".join(f"{n} {c}" for c, n in counts.items())
        + f"), {len(doc['not_comparable'])} not comparable: {out}/compare.md"
    )
    return 0


def _fail(message: str) -> int:
    print(f"ctax compare: {message}", file=sys.stderr)
    return BAD_INPUT
