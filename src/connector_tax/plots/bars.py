"""Bar panels one variant cannot flatten: an outlier's bar is cut at the axis top and its value written on it.

On the CPU study NIXL's taxes (+150 % TTFT, an engine step ~3x plain's) made every other
variant's bar a sliver of a few pixels: the figure said "NIXL is large" and nothing else. Where
the tallest variants stand far above the rest, the axis is sized for the rest and the tall bars
are drawn to its top, broken (a white slash across them) and labelled with their value and
interval, so every bar stays inside its axes and every number stays readable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from numpy.typing import NDArray

# A variant is an outlier when its bar top (value + upper error) exceeds this many times the next
# variant's; the axis then ends this far above the tallest bar that is not cut.
OUTLIER_RATIO = 3.0
HEADROOM = 1.3


def axis_cap(tops: Iterable[float]) -> float | None:
    """The top of a bar axis that leaves outliers cut, or None when no bar is far above the rest.

    `tops` are the bar tops of each variant (its highest value + upper error across the panel's
    series). At most half of the variants may be cut: the axis is sized for the majority."""
    ordered = sorted((t for t in tops if math.isfinite(t) and t > 0), reverse=True)
    for k in range(1, len(ordered) // 2 + 1):
        if ordered[k] > 0 and ordered[k - 1] > OUTLIER_RATIO * ordered[k]:
            return HEADROOM * ordered[k]
    return None


@dataclass(frozen=True)
class Bar:
    """One bar: its value and its interval (None where it has none), in the axis' units."""

    value: float
    lo: float | None = None
    hi: float | None = None

    @property
    def top(self) -> float:
        """Its highest point (value or upper bound); -inf for a bar with no value."""
        if not math.isfinite(self.value):
            return -math.inf
        return max(self.value, self.hi if self.hi is not None else self.value)

    def yerr(self) -> tuple[float, float]:
        if self.lo is None or self.hi is None or not math.isfinite(self.value):
            return 0.0, 0.0
        return max(self.value - self.lo, 0.0), max(self.hi - self.value, 0.0)

    def label(self, unit: str) -> str:
        text = f"{self.value:,.0f}{unit}"
        if self.lo is not None and self.hi is not None:
            text += f" [{self.lo:,.0f}, {self.hi:,.0f}]"
        return text


def draw_bars(
    ax: Axes,
    x: Sequence[float] | NDArray[np.number],
    bars: Sequence[Bar],
    width: float,
    cap: float | None,
    unit: str,
    bottom: Sequence[float] | None = None,
    labels: Sequence[Bar] | None = None,
    **style: object,
) -> None:
    """ax.bar with error bars, except that a bar reaching past `cap` is drawn to the cap, broken
    and labelled with its value (and interval) instead of an error bar. A stacked segment
    (`bottom`) is labelled with what `labels` gives, e.g. the whole stack's value."""
    base = list(bottom) if bottom is not None else [0.0] * len(bars)
    heights, errs = [], []
    for b, b0 in zip(bars, base):
        cut = cap is not None and math.isfinite(b.value) and b0 + b.top > cap
        heights.append(max(cap - b0, 0.0) if cut and cap is not None else b.value)
        errs.append((0.0, 0.0) if cut else b.yerr())
    # No error bar where no bar has an interval: zero-length bars would still draw their caps.
    yerr = list(zip(*errs)) if any(lo or hi for lo, hi in errs) else None
    ax.bar(x, heights, width, bottom=base, yerr=yerr, capsize=2, **style)  # type: ignore[arg-type]
    if cap is None:
        return
    for xi, b, b0, shown in zip(x, bars, base, labels or bars):
        if not (math.isfinite(b.value) and b0 + b.top > cap):
            continue
        # The break: a white slash across the bar just below the axis top.
        y = 0.9 * cap
        ax.plot(
            [xi - width / 2, xi + width / 2], [y - 0.02 * cap, y + 0.02 * cap], color="white", lw=2.5, gid="bar-break"
        )
        ax.text(
            xi,
            0.86 * cap,
            shown.label(unit),
            rotation=90,
            ha="center",
            va="top",
            fontsize=6.5,
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            gid="bar-cut-label",
        )


def stacked_on(first: Sequence[float], second: Sequence[float]) -> list[float]:
    """Where a second stacked segment starts: on the first segment when both have its sign,
    else from 0 the other way. Stacked on top of the first, a negative segment (callbacks that
    take longer than the step tax they are part of) hid the first's top, and a reader took what
    was left for the first."""
    return [max(a, 0.0) if b >= 0 else min(a, 0.0) for a, b in zip(first, second)]


def mark_totals(
    ax: Axes, x: Sequence[float] | NDArray[np.number], totals: Sequence[float], width: float, cap: float | None
) -> None:
    """A black tick at each stack's sum (the step tax itself) where it is inside the axis."""
    keep = [(xi, t) for xi, t in zip(x, totals) if math.isfinite(t) and (cap is None or t <= cap)]
    for xi, t in keep:
        ax.plot([xi - width / 2, xi + width / 2], [t, t], color="black", lw=1.6, gid="stack-total")


def limit(ax: Axes, cap: float | None) -> None:
    """The axis top at the cap, once every bar of the panel is drawn (the bottom stays automatic)."""
    if cap is not None:
        ax.set_ylim(top=cap)
