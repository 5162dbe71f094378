"""Figures 6-7: engine step latency and the per-step tax, framework vs implementation."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from connector_tax.analysis.constants import NOOP
from connector_tax.config import PHASE_A
from connector_tax.plots.bars import Bar, axis_cap, draw_bars, limit, mark_totals, stacked_on
from connector_tax.plots.context import Ctx, Skip
from connector_tax.plots.style import new_figure, panels_above_legend, plain_log, stamp


def fig6(ctx: Ctx) -> Figure:
    if not ctx.taxes:
        ctx.need_taxes("fig 6")
    rate = ctx.ref.get("ref_safe")
    cdf = ctx.agg.get("step_cdf") or {}
    pcts = np.array(cdf.get("percentiles") or [], float) / 100.0
    key = f"{PHASE_A}/r{float(rate):g}" if rate is not None else None
    lines = {c: (cdf.get("variants") or {}).get(c, {}).get(key) for c in ctx.variants}
    lines = {c: v for c, v in lines.items() if v}
    if not lines:
        reasons = sorted(
            {
                p.get("step_timing_reason") or "no engine_step file"
                for st in (ctx.agg.get("variant_status") or {}).values()
                for ph, p in (st.get("phases") or {}).items()
                if ph == PHASE_A and not p.get("step_timing_available")
            }
        )
        raise Skip(
            f"no engine step log at ref_safe={rate} (step timing unavailable"
            + (f": {'; '.join(reasons)}" if reasons else "")
            + ")"
        )
    assert rate is not None  # lines are keyed by ref_safe's cell: none without it (Skip above)
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot()
    for c, values in lines.items():
        ax.plot(values, pcts, color=ctx.palette(c), lw=1.6, label=c, drawstyle="steps-post")
    ax.set_xscale("log")
    plain_log(ax.xaxis)
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("step duration: Scheduler.schedule() (µs, log scale)")
    ax.set_ylabel("CDF (fraction of steps)")
    ax.set_title(ctx.title(f"Fig. 6: per-step latency CDF at ref_safe = {float(rate):g} req/s (Phase A)"))
    ax.grid(True, which="both", alpha=0.3)
    # Beside the axes: a variant far to the right (NIXL's steps on CPU) ran under a legend inside them.
    ax.legend(title="variant", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def _step_value(entry: dict[str, Any], c: str, key: str) -> dict[str, Any] | None:
    est = ((entry.get("variants") or {}).get(c) or {}).get(key)
    return est if est and est.get("value") is not None else None


def _value_or_zero(entry: dict[str, Any], c: str, key: str) -> float:
    est = _step_value(entry, c, key)
    return float(est["value"]) if est else 0.0


def _step_tax(entry: dict[str, Any], c: str) -> float:
    """The step-time tax (us) of a configuration that has one (those in fig 7's `with_steps`)."""
    est = _step_value(entry, c, "step_p50_us")
    assert est is not None
    return float(est["value"])


def fig7(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 7")
    safe = taxes["phase_a"].get("ref_safe") or {}
    with_steps = [c for c in ctx.variants if _step_value(safe, c, "step_p50_us")]
    if not with_steps:
        raise Skip(
            f"no step-time tax at ref_safe={safe.get('rate')} (step timing unavailable for the baseline or "
            "every connector config: figs 6-7 need the engine step log)"
        )
    if NOOP not in ctx.variants or NOOP not in with_steps:
        raise Skip(
            f"{NOOP} did not run (or has no step log at ref_safe): framework cost cannot be separated; "
            "the tax is reported as one number per config"
        )
    fw = _step_tax(safe, NOOP)
    names = with_steps
    fig = new_figure(11.0, 5.2)
    (ax1, ax2), holder = panels_above_legend(fig, 2, legend_lines=-(-(6 + len(names)) // 3))
    x = np.arange(len(names))
    total = [_step_tax(safe, c) for c in names]
    impl = [(t - fw) if c != NOOP else 0.0 for c, t in zip(names, total)]
    colours = [ctx.palette(c) for c in names]
    style: dict[str, Any] = {"edgecolor": "0.3", "linewidth": 0.6}
    # An outlier (NIXL's step on CPU) is cut at the axis top with its total written on it; a
    # negative segment hangs from 0, and a black tick marks each stack's sum (plots.bars).
    cap1 = axis_cap(max(fw, t) for t in total)
    fws = [fw] * len(names)
    draw_bars(ax1, x, [Bar(fw)] * len(names), 0.6, cap1, " µs", color="0.75", hatch="..", **style)
    labels = [Bar(t) for t in total]
    draw_bars(ax1, x, [Bar(v) for v in impl], 0.6, cap1, " µs", stacked_on(fws, impl), labels, color=colours, **style)
    mark_totals(ax1, x, total, 0.6, cap1)
    limit(ax1, cap1)
    ax1.set_title("framework (noop_connector) vs implementation")
    # Right: the step split by what is timed inside it. Of the three hooks only build_meta runs in
    # schedule(); get_finished and start_load_kv run after it (the model's execution), so they are
    # drawn beside the stack, not in it: subtracting them from the step (the seed's tax_step -
    # tax_callback) leaves a negative "unattributed" in every study (analysis/taxes.py).
    bm = [_value_or_zero(safe, c, "build_meta_p50_us") for c in names]
    un = [_value_or_zero(safe, c, "unattributed_p50_us") for c in names]
    outside = [_value_or_zero(safe, c, "callback_p50_us") - b for c, b in zip(names, bm)]
    sums = [b + u for b, u in zip(bm, un)]
    cap2 = axis_cap([*(max(b, t) for b, t in zip(bm, sums)), *outside])
    stack, beside = x - 0.13, x + 0.27
    draw_bars(ax2, stack, [Bar(v) for v in bm], 0.46, cap2, " µs", color=colours, **style)
    draw_bars(
        ax2,
        stack,
        [Bar(v) for v in un],
        0.46,
        cap2,
        " µs",
        stacked_on(bm, un),
        [Bar(t) for t in sums],
        color=colours,
        alpha=0.45,
        hatch="//",
        **style,
    )
    draw_bars(ax2, beside, [Bar(v) for v in outside], 0.2, cap2, " µs", color="0.85", hatch="xx", **style)
    mark_totals(ax2, stack, sums, 0.46, cap2)
    limit(ax2, cap2)
    ax2.set_title("inside the step: build_meta vs unattributed")
    for ax in (ax1, ax2):
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax step p50 vs {taxes['baseline']} (µs)")
        ax.grid(True, axis="y", alpha=0.3)
    ax2.set_ylabel(f"µs per step (p50), over {taxes['baseline']}")  # the hooks beside are no step tax
    # Below the axes, never over bars (the tallest bar's height is not known in advance).
    holder.legend(
        handles=[
            Patch(facecolor="0.75", hatch="..", edgecolor="0.3", label="framework = tax(noop_connector)"),
            Patch(facecolor="0.45", label="implementation = tax(X) - tax(noop), config colour"),
            Patch(facecolor="0.45", label="build_meta (p50), the hook inside schedule()"),
            Patch(facecolor="0.45", alpha=0.45, hatch="//", label="unattributed = tax_step - build_meta"),
            Patch(
                facecolor="0.85",
                hatch="xx",
                edgecolor="0.3",
                label="get_finished + start_load_kv (tax_callback - build_meta): after the step",
            ),
            Line2D([], [], color="black", lw=1.6, label="tax_step (the sum; a negative part hangs from 0)"),
        ]
        + [Patch(facecolor=ctx.palette(c), label=c) for c in names],
        loc="center",
        ncol=3,
        fontsize=7,
    )
    fig.suptitle(ctx.title(f"Fig. 7: per-step tax decomposition at ref_safe = {safe.get('rate'):g} req/s"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig
