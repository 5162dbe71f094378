"""Figures 4, 4b, 5 and 8: taxes against the baseline at the reference rates and per shape."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from connector_tax.analysis.constants import CONFIDENCE, H4_MAX_REL_DEV, LMCACHE_ONLY, MOONCAKE_BOTH, MULTI
from connector_tax.analysis.quantiles import tax_combination
from connector_tax.analysis.report_format import pct
from connector_tax.config import PHASE_B, PHASE_B_PRIME
from connector_tax.plots.bars import Bar, axis_cap, draw_bars, limit, stacked_on
from connector_tax.plots.context import Ctx, Skip
from connector_tax.plots.style import new_figure, panels_above_legend, stamp


def _bar(est: dict[str, Any] | None, scale: float = 100.0) -> Bar:
    """An estimate as a bar in percent, its interval where it has one."""
    if not est or est.get("value") is None:
        return Bar(np.nan)
    ci = est.get("ci")
    if not ci or None in ci:
        return Bar(est["value"] * scale)
    return Bar(est["value"] * scale, ci[0] * scale, ci[1] * scale)


def fig4(ctx: Ctx, skipped: dict[str, str]) -> Figure:
    taxes = ctx.need_taxes("fig 4")
    safe = taxes["phase_a"].get("ref_safe") or {}
    load = taxes["phase_a"].get("ref_load") or {}
    names = [c for c in ctx.variants if c in (safe.get("variants") or {}) or c in (load.get("variants") or {})]
    if not safe.get("variants"):
        raise Skip(
            "no tax at ref_safe: "
            + (
                "; ".join(f"{k}: {v}" for k, v in (safe.get("missing") or {}).items())
                or f"no Phase A cell at ref_safe={safe.get('rate')}"
            )
        )
    has_load = bool(load.get("variants"))
    if not has_load:
        skipped["fig4_ref_load_bars"] = "no tax at ref_load: " + (
            "; ".join(f"{k}: {v}" for k, v in (load.get("missing") or {}).items())
            or f"no Phase A cell at {load.get('rate')}"
        )
    fig = new_figure(12.0, 4.8)
    axes = fig.subplots(1, 2)
    width = 0.38 if has_load else 0.6
    x = np.arange(len(names))
    series = [(safe, None, 0.95)] + ([(load, "//", 0.55)] if has_load else [])
    for ax, metric, label in ((axes[0], "ttft_p90", "TTFT p90"), (axes[1], "tpot_p90", "TPOT p90")):
        bars = [
            [_bar(((entry.get("variants") or {}).get(c) or {}).get(metric)) for c in names] for entry, _, _ in series
        ]
        cap = axis_cap(max(b.top for b in col) for col in zip(*bars))
        for j, ((_, hatch, alpha), row) in enumerate(zip(series, bars)):
            off = (j - 0.5) * width if has_load else 0.0
            draw_bars(
                ax,
                x + off,
                row,
                width,
                cap,
                " %",
                color=[ctx.palette(c) for c in names],
                alpha=alpha,
                hatch=hatch,
                edgecolor="0.2",
                linewidth=0.6,
            )
        limit(ax, cap)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax {label} vs {taxes['baseline']} (%) with 95% CI")
        ax.set_title(f"{label}")
        ax.grid(True, axis="y", alpha=0.3)
    handles = [Patch(facecolor="0.6", edgecolor="0.2", label=f"ref_safe = {safe.get('rate'):g} req/s (pure tax)")]
    if has_load:
        handles.append(
            Patch(
                facecolor="0.6",
                edgecolor="0.2",
                hatch="//",
                alpha=0.55,
                label=f"ref_load = {load.get('rate'):g} req/s (tax + queueing)",
            )
        )
    handles += [Patch(facecolor=ctx.palette(c), label=c) for c in names]
    axes[1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(ctx.title("Fig. 4: substrate tax at ref_safe and ref_load (Phase A)"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig4b(ctx: Ctx) -> Figure:
    """Phase B' (ref_load) next to Phase B (ref_safe) on the shapes both ran."""
    taxes = ctx.need_taxes("fig 4b")
    prime = (taxes.get(PHASE_B_PRIME) or {}).get("cells") or {}
    base = (taxes.get(PHASE_B) or {}).get("cells") or {}
    shared = [s for s in prime if s in base and prime[s]["variants"]]
    if not shared:
        raise Skip(
            "no Phase B' taxes (Phase B' did not run: ref_load == ref_safe, or no phase_b_prime cells "
            "for the baseline and another config)"
        )
    names = [c for c in ctx.variants if any(c in prime[s]["variants"] for s in shared)]
    fig = new_figure(max(8.0, 4.0 + 2.6 * len(shared)), 4.6)  # the title fits at one shape
    axes = np.atleast_1d(fig.subplots(1, len(shared), sharey=True))
    x = np.arange(len(names))
    bars = {
        s: [[_bar(((cells[s]["variants"].get(c)) or {}).get("ttft_p90")) for c in names] for cells in (base, prime)]
        for s in shared
    }
    # One cap for every shape: the panels share their y axis.
    cap = axis_cap(max(row[i].top for rows in bars.values() for row in rows) for i in range(len(names)))
    for ax, s in zip(axes, shared):
        for j, (row, hatch, alpha) in enumerate(zip(bars[s], (None, "//"), (0.95, 0.55))):
            draw_bars(
                ax,
                x + (j - 0.5) * 0.38,
                row,
                0.38,
                cap,
                " %",
                hatch=hatch,
                alpha=alpha,
                color=[ctx.palette(c) for c in names],
                edgecolor="0.2",
                linewidth=0.6,
            )
        limit(ax, cap)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"shape {s}")
        ax.set_xlabel("configuration")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel(f"tax TTFT p90 vs {taxes['baseline']} (%)")
    rs, rl = taxes[PHASE_B].get("rates") or [], taxes[PHASE_B_PRIME].get("rates") or []
    axes[-1].legend(
        handles=[
            Patch(facecolor="0.6", label=f"Phase B (ref_safe {', '.join(f'{r:g}' for r in rs)} req/s)"),
            Patch(
                facecolor="0.6",
                hatch="//",
                alpha=0.55,
                label=f"Phase B' (ref_load {', '.join(f'{r:g}' for r in rl)} req/s)",
            ),
        ]
        + [Patch(facecolor=ctx.palette(c), label=c) for c in names],
        fontsize=7,
    )
    fig.suptitle(ctx.title("Fig. 4b: TTFT p90 tax per shape, ref_safe (Phase B) vs ref_load (Phase B')"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


# The two rows of fig 5: the metric H5 reads along input, and the one H6 reads along output.
_SHAPE_METRICS = (("ttft_p90", "TTFT p90"), ("tpot_p90", "TPOT p90"))


def fig5(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 5")
    cells = (taxes.get(PHASE_B) or {}).get("cells") or {}
    shaped = [v for v in cells.values() if v.get("input") is not None and v.get("output") is not None]

    def est(v: dict[str, Any], c: str, metric: str) -> dict[str, Any]:
        return (v["variants"].get(c) or {}).get(metric) or {}

    def drawn(c: str, metric: str) -> bool:
        return any(est(v, c, metric).get("value") is not None for v in shaped)

    metrics = [(m, label) for m, label in _SHAPE_METRICS if any(drawn(c, m) for c in ctx.variants if c != ctx.baseline)]
    names = [c for c in ctx.variants if c != ctx.baseline and any(drawn(c, m) for m, _ in metrics)]
    if not names:
        raise Skip(
            "no Phase B tax on an input x output shape grid (Phase B missing for the baseline or every other "
            "config, or shapes are mixes/patterns)"
        )
    inputs = sorted({v["input"] for v in shaped})
    outputs = sorted({v["output"] for v in shaped})
    ncols = min(4, len(names))
    block = -(-len(names) // ncols)  # rows of panels per metric
    fig = new_figure(2.0 + 3.0 * ncols, 0.8 + 3.0 * block * len(metrics))
    grid = np.atleast_1d(fig.subplots(block * len(metrics), ncols, squeeze=False))
    for k, (metric, label) in enumerate(metrics):
        panels = grid[k * block : (k + 1) * block].ravel()
        for ax in panels[len(names) :]:
            ax.set_visible(False)
        axes = panels[: len(names)]
        grids, texts = {}, {}
        for c in names:
            g = np.full((len(inputs), len(outputs)), np.nan)
            t = np.full((len(inputs), len(outputs)), "n/a", dtype=object)
            for v in shaped:
                e = est(v, c, metric)
                if e.get("value") is not None:
                    g[inputs.index(v["input"]), outputs.index(v["output"])] = e["value"] * 100
                    t[inputs.index(v["input"]), outputs.index(v["output"])] = pct(e, digits=0, sep="\n")
            grids[c], texts[c] = g, t
        # One colour scale per metric (a TPOT tax can be a different size from a TTFT tax), sized as
        # fig 4's axes are: a variant far above the rest saturates the colour, its number stays true.
        tops = [float(np.nanmax(np.abs(g))) for g in grids.values() if not np.isnan(g).all()]
        vmax = axis_cap(tops) or max(tops, default=0.0) or 1.0
        im: Any = None  # the last panel's image: the colour bar's scale (every panel of the metric shares it)
        for ax, c in zip(axes, names):
            im = ax.imshow(
                np.ma.masked_invalid(grids[c]), cmap="RdBu_r", vmin=-vmax, vmax=vmax, origin="lower", aspect="auto"
            )
            for i in range(len(inputs)):
                for j in range(len(outputs)):
                    dark = abs(grids[c][i, j]) > 0.6 * vmax  # NaN compares False: "n/a" stays black
                    ax.text(
                        j,
                        i,
                        texts[c][i, j],
                        ha="center",
                        va="center",
                        fontsize=6.5,
                        linespacing=1.1,
                        color="white" if dark else "black",
                    )
            ax.set_xticks(range(len(outputs)))
            ax.set_xticklabels([str(o) for o in outputs], fontsize=7)
            ax.set_yticks(range(len(inputs)))
            ax.set_yticklabels([str(i) for i in inputs], fontsize=7)
            ax.set_xlabel("output length (tokens)")
            ax.set_ylabel(f"{label} tax: input (tokens)")
            ax.set_title(c, color=ctx.palette(c), fontsize=9, fontweight="bold")
        cb = fig.colorbar(im, ax=list(axes), shrink=0.85, extend="both" if vmax < max(tops, default=0.0) else "neither")
        cb.set_label(f"tax {label} vs {taxes['baseline']} (%)")
    rates = (taxes.get(PHASE_B) or {}).get("rates") or []
    fig.suptitle(
        ctx.title(
            f"Fig. 5: {' and '.join(label for _, label in metrics)} tax by shape, {CONFIDENCE:.0%} interval below\n"
            f"(Phase B at {', '.join(f'{r:g}' for r in rates)} req/s; H5 reads {MOONCAKE_BOTH}'s TTFT along "
            f"input, H6 its TPOT along output)"
        )
    )
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig8(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 8")
    safe = taxes["phase_a"].get("ref_safe") or {}
    need = [MOONCAKE_BOTH, LMCACHE_ONLY, MULTI]
    missing = [c for c in need if c not in (safe.get("variants") or {})]
    if missing:
        why = "; ".join(f"{c}: {(safe.get('missing') or {}).get(c) or 'not in the study or skipped'}" for c in missing)
        raise Skip(f"H4 needs {', '.join(need)} at ref_safe; missing {why}")
    h4: dict[str, Any] = next((h for h in ctx.hyp.get("hypotheses") or [] if h["id"] == "H4"), {})
    fig = new_figure(9.0, 5.2)
    axes, holder = panels_above_legend(fig, 2, legend_lines=2)
    for ax, metric, label in ((axes[0], "ttft_p90", "TTFT p90"), (axes[1], "tpot_p90", "TPOT p90")):
        mb = safe["variants"][MOONCAKE_BOTH][metric]
        lm = safe["variants"][LMCACHE_ONLY][metric]
        mu = safe["variants"][MULTI][metric]
        # Not cut at an outlier (plots.bars): the sum is read against multi on one true scale.
        (v1, e1), (v2, e2), (v3, e3) = ((b.value, b.yerr()) for b in (_bar(mb), _bar(lm), _bar(mu)))
        ax.bar(0, v1, 0.6, yerr=np.array([e1]).T, capsize=3, color=ctx.palette(MOONCAKE_BOTH), edgecolor="0.2")
        ax.bar(1, v2, 0.6, yerr=np.array([e2]).T, capsize=3, color=ctx.palette(LMCACHE_ONLY), edgecolor="0.2")
        ax.bar(2, v1, 0.6, color=ctx.palette(MOONCAKE_BOTH), edgecolor="0.2", alpha=0.7)
        ax.bar(2, v2, 0.6, bottom=stacked_on([v1], [v2]), color=ctx.palette(LMCACHE_ONLY), edgecolor="0.2", alpha=0.7)
        # The sum's own interval: the analysis's combination over the one shared baseline, as H4's.
        summed = _bar(tax_combination([(1.0, mb), (1.0, lm)]))
        ax.errorbar(2, summed.value, yerr=np.array([summed.yerr()]).T, fmt="none", ecolor="black", capsize=3)
        ax.bar(3, v3, 0.6, yerr=np.array([e3]).T, capsize=3, color=ctx.palette(MULTI), edgecolor="0.2")
        total = v1 + v2
        if np.isfinite(total) and total > 0:  # |multi - sum| <= d multi  <=>  sum/(1+d) <= multi <= sum/(1-d)
            ax.axhspan(total / (1 + H4_MAX_REL_DEV), total / (1 - H4_MAX_REL_DEV), color="0.85", zorder=0)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(range(4))
        ax.set_xticklabels(["mooncake_both", "lmcache_only", "sum", "multi"], rotation=20, fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax {label} vs {taxes['baseline']} (%)")
        ax.set_title(label)
        ax.grid(True, axis="y", alpha=0.3)
    rel_dev = (h4.get("numbers") or {}).get("rel_dev") or {}
    rel, rel_ci = rel_dev.get("value"), rel_dev.get("ci")
    holder.legend(
        handles=[Patch(facecolor=ctx.palette(c), label=c) for c in need]
        + [Patch(facecolor="0.85", label=f"additive band for multi: |multi - sum| <= {H4_MAX_REL_DEV:.2f} multi")],
        loc="center",
        ncol=2,
        fontsize=7,
    )
    fig.suptitle(
        ctx.title(
            f"Fig. 8: H4 additivity at ref_safe = {safe.get('rate'):g} req/s\n"
            f"verdict {h4.get('verdict', 'n/a')}"
            + (f" ({h4['confidence']})" if h4.get("confidence") else "")
            + (f", rel. dev. {rel:+.2f}" if rel is not None else "")
            + (f" [{rel_ci[0]:+.2f}, {rel_ci[1]:+.2f}]" if rel is not None and rel_ci else "")
            + (" on TTFT p90" if rel is not None else "")
        )
    )
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig
