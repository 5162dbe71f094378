"""The report's number formatting: estimates with their intervals, Markdown tables (report.md)."""

from __future__ import annotations

from typing import Any

from connector_tax.analysis.launch_intervals import MIN_P90_SAMPLES


def num(v: Any, fmt: str = ".1f") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and fmt.endswith("f"):
        return str(v)
    if isinstance(v, (int, float)):
        return format(v, fmt)
    return str(v)


def pct(est: dict[str, Any] | None, digits: int = 1, sep: str = " ") -> str:
    """A relative estimate in percent, its interval after `sep` where it has one: "+12.3% [+4.1, +20.9]"."""
    if not est or est.get("value") is None:
        return "–"
    s = f"{est['value'] * 100:+.{digits}f}%"
    ci = est.get("ci")
    if ci and None not in ci:
        s += f"{sep}[{ci[0] * 100:+.{digits}f}, {ci[1] * 100:+.{digits}f}]"
    return s


def us(est: dict[str, Any] | None) -> str:
    if not est or est.get("value") is None:
        return "–"
    s = f"{est['value']:+.1f}"
    ci = est.get("ci")
    if ci and None not in ci:
        s += f" [{ci[0]:+.1f}, {ci[1]:+.1f}]"
    return s


def ratio(est: dict[str, Any] | None) -> str:
    if not est or est.get("value") is None:
        return "–"
    ci = est.get("ci")
    return f"{est['value']:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and None not in ci else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def ci_text(lo: Any, hi: Any, n: Any = None) -> str:
    if lo is not None and hi is not None:
        return f" [{num(lo)}, {num(hi)}]"
    if isinstance(n, int) and 0 < n < MIN_P90_SAMPLES:
        return f" (n {n} < {MIN_P90_SAMPLES}: too few to bound the p90)"
    return ""


def launch_share(est: dict[str, Any] | None) -> str:
    """The share of a tax's variance that is launch to launch, or why there is none."""
    if not est or est.get("value") is None:
        return "–"
    if est.get("launch_share") is not None:
        return f"{est['launch_share'] * 100:.0f}%"
    return "not estimated" if (est.get("replicates") or 1) < 2 else "–"
