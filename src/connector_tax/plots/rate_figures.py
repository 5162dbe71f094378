"""Figures 1-3: Phase A latency and throughput against the send rate, saturation marked."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from connector_tax.config import PHASE_A
from connector_tax.plots.context import CRITERION_MARKERS, Ctx, Skip, criterion_labels
from connector_tax.plots.style import new_figure, plain_log, stamp


def _ref_lines(ax: Any, ctx: Ctx) -> None:
    safe, load = ctx.ref.get("ref_safe"), ctx.ref.get("ref_load")
    marks = [("ref_safe = ref_load" if safe == load else "ref_safe", safe, "--")]
    if load is not None and load != safe:
        marks.append(("ref_load", load, ":"))
    for key, v, style in marks:
        if v:
            ax.axvline(v, color="0.35", ls=style, lw=1, zorder=1)
            ax.annotate(
                f"{key} = {v:g}",
                xy=(v, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -6),
                textcoords="offset points",
                fontsize=7,
                color="0.3",
                rotation=90,
                va="top",
            )


def _rate_axis(ax: Any, rates: list[float]) -> None:
    ax.set_xscale("log", base=2)
    if rates:
        ax.set_xticks(rates)
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.minorticks_off()


UNKNOWN_MARKER: dict[str, Any] = dict(marker="D", s=150, facecolors="none", linewidths=1.6)


def _latency_vs_rate(ctx: Ctx, metric: str, label: str, title: str, markers: bool) -> Figure:
    data = ctx.by_variant(PHASE_A)
    series = {c: [r for r in rows if r.get(f"{metric}_p90") is not None and r.get("rate")] for c, rows in data.items()}
    series = {c: v for c, v in series.items() if v}
    if not series:
        raise Skip(f"no Phase A cell with a {label} p90 (no Phase A results, or no successful request)")
    fig = new_figure(10.5, 5.4)
    ax = fig.add_subplot()
    rates: set[float] = set()
    fired_any: set[str] = set()
    for c, rows in series.items():
        x = np.array([r["rate"] for r in rows], float)
        y = np.array([r[f"{metric}_p90"] for r in rows], float)
        lo = np.array(
            [r.get(f"{metric}_p90_ci_lo") if r.get(f"{metric}_p90_ci_lo") is not None else np.nan for r in rows], float
        )
        hi = np.array(
            [r.get(f"{metric}_p90_ci_hi") if r.get(f"{metric}_p90_ci_hi") is not None else np.nan for r in rows], float
        )
        yerr = np.vstack([np.where(np.isnan(lo), 0, y - lo), np.where(np.isnan(hi), 0, hi - y)]).clip(min=0)
        rates.update(x.tolist())
        ax.errorbar(x, y, yerr=yerr, color=ctx.palette(c), marker="o", ms=4, lw=1.6, capsize=2, label=c, zorder=3)
        if markers:
            for crit, kw in CRITERION_MARKERS.items():
                sel = [i for i, r in enumerate(rows) if crit in (r.get("saturation_criteria") or "").split(";")]
                if sel:
                    fired_any.add(crit)
                    style = dict(kw)
                    if style.get("facecolors") == "none":
                        style["edgecolors"] = ctx.palette(c)
                    else:
                        style["color"] = ctx.palette(c)
                    ax.scatter(x[sel], y[sel], zorder=4, **style)
            # Neither saturated nor not: a criterion undecided (or a perturbed cell); never a
            # reference rate, so the reader sees why ref_safe stops below it.
            unknown = [i for i, r in enumerate(rows) if "saturated" in r and r["saturated"] is None]
            if unknown:
                ax.scatter(x[unknown], y[unknown], zorder=4, edgecolors=ctx.palette(c), **UNKNOWN_MARKER)
    _rate_axis(ax, sorted(rates))
    ax.set_yscale("log")
    plain_log(ax.yaxis)
    _ref_lines(ax, ctx)
    ax.set_xlabel("send rate (req/s, log scale)")
    ax.set_ylabel(f"{label} p90 (ms, log scale) with 95% CI")
    ax.set_title(ctx.title(title))
    ax.grid(True, which="major", alpha=0.3)
    first = ax.legend(title="variant", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if markers:
        ax.add_artist(first)
        labels = criterion_labels(ctx.saturation)
        handles = [
            Line2D(
                [],
                [],
                ls="none",
                color="0.2",
                markerfacecolor="none" if kw.get("facecolors") == "none" else "0.2",
                marker=kw["marker"],
                markersize=8,
                label=labels[crit],
            )
            for crit, kw in CRITERION_MARKERS.items()
        ] + [
            Line2D(
                [],
                [],
                ls="none",
                color="0.2",
                markerfacecolor="none",
                marker=UNKNOWN_MARKER["marker"],
                markersize=8,
                label="unknown: undecided, unjudged or perturbed",
            )
        ]
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="lower left",
            bbox_to_anchor=(1.01, 0.0),
            borderaxespad=0,
            title="saturation (criterion fired, or unknown)",
            title_fontsize=7,
        )
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig1(ctx: Ctx) -> Figure:
    return _latency_vs_rate(ctx, "ttft_ms", "TTFT", "Fig. 1: TTFT p90 vs send rate (Phase A)", markers=True)


def fig2(ctx: Ctx) -> Figure:
    return _latency_vs_rate(ctx, "tpot_ms", "TPOT", "Fig. 2: TPOT p90 vs send rate (Phase A)", markers=True)


def fig3(ctx: Ctx) -> Figure:
    data = {
        c: [r for r in rows if r.get("effective_rps") is not None and r.get("rate")]
        for c, rows in ctx.by_variant(PHASE_A).items()
    }
    data = {c: v for c, v in data.items() if v}
    if not data:
        raise Skip("no Phase A cell with an effective throughput")
    fig = new_figure(8.0, 5.6)
    ax = fig.add_subplot()
    all_x: list[float] = []
    per_variant = ctx.ref.get("per_variant") or {}
    for i, (c, rows) in enumerate(data.items()):
        x = [r["rate"] for r in rows]
        y = [r["effective_rps"] for r in rows]
        all_x += x
        ax.plot(x, y, marker="o", ms=4, lw=1.6, color=ctx.palette(c), label=c, zorder=3)
        knee = (per_variant.get(c) or {}).get("saturation_rate")
        if knee is not None:
            at = next((r for r in rows if abs(r["rate"] - knee) < 1e-9), None)
            if at is not None:
                fired = (per_variant.get(c) or {}).get("fired_at_saturation") or []
                ax.annotate(
                    f"knee {c}\n@{knee:g} ({', '.join(fired)})",
                    xy=(knee, at["effective_rps"]),
                    xytext=(-95, 14 + 16 * (i % 5)),
                    textcoords="offset points",
                    fontsize=6.5,
                    color=ctx.palette(c),
                    arrowprops=dict(arrowstyle="->", color=ctx.palette(c), lw=0.8),
                )
    lo, hi = min(all_x), max(all_x)
    ax.plot([lo, hi], [lo, hi], ls="--", color="0.4", lw=1, label="y = x (the requested rate)", zorder=2)
    # What criterion 1 compares with: the rate the schedule offered in the cell's window (random
    # arrivals offer a finite window a few % more or less than requested, every variant alike
    # on common random numbers), and the line below which it fires.
    offered: dict[float, list[float]] = {}
    for rows in data.values():
        for r in rows:
            if r.get("offered_rps"):
                offered.setdefault(r["rate"], []).append(float(r["offered_rps"]))
    if offered:
        xs = sorted(offered)
        mid = [float(np.median(offered[x])) for x in xs]
        ax.plot(xs, mid, ls="none", marker="x", ms=8, color="0.15", label="offered in the window (median)", zorder=4)
        floor = ctx.saturation.throughput_ratio_min
        ax.plot(
            xs,
            [floor * m for m in mid],
            ls=":",
            color="0.3",
            lw=1,
            label=f"{floor:g} x offered: criterion 1 fires below",
        )
    _rate_axis(ax, sorted(set(all_x)))
    ax.set_yscale("log", base=2)
    ax.set_yticks(sorted(set(all_x)))
    ax.set_yticklabels([f"{r:g}" for r in sorted(set(all_x))])
    ax.set_xlabel("requested send rate (req/s, log scale)")
    ax.set_ylabel("achieved (effective) throughput (req/s, log scale)")
    ax.set_title(ctx.title("Fig. 3: achieved vs requested throughput (Phase A), saturation knees"))
    ax.grid(True, alpha=0.3)
    ax.legend(title="variant", fontsize=8, loc="upper left")
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig
