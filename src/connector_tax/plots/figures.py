"""Figures 1-8 of the design, each built from the analysis documents (aggregate + hypotheses).

Every builder returns a matplotlib Figure or raises Skip(reason): a figure whose data is
missing is never drawn empty; the reason goes to figures/skipped.json and the report.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.lines import Line2D

from connector_tax.plots.style import Palette, new_figure, stamp

PHASE_A, PHASE_B, PHASE_B_PRIME = "phase_a", "phase_b", "phase_b_prime"
NOOP, MOONCAKE_BOTH, LMCACHE_ONLY, MULTI = "noop_connector", "mooncake_both", "lmcache_only", "multi_mooncake_lmcache"

CRITERION_MARKERS = {  # design: saturation markers by criterion
    "throughput": dict(marker="X", s=70, label="saturated: throughput < 0.95 x offered"),
    "waiting": dict(marker="s", s=140, facecolors="none", linewidths=1.3, label="saturated: waiting p50 > 1"),
    "ttft_growth": dict(marker="^", s=190, facecolors="none", linewidths=1.3, label="saturated: TTFT p90 x1.5 vs r/2"),
}


class Skip(Exception):
    """The figure's data is missing; str(exc) says which and why."""


class Ctx:
    def __init__(self, agg: dict[str, Any], hyp: dict[str, Any] | None) -> None:
        self.agg, self.hyp = agg, hyp or {}
        self.configs: list[str] = list(agg.get("configs") or [])
        self.palette = Palette(self.configs)
        self.simulated = bool(agg.get("simulated"))
        self.served_by = agg.get("served_by")
        self.ref = agg.get("reference") or {}
        self.taxes = agg.get("taxes")
        self.baseline = agg.get("baseline")

    def rows(self, phase: str) -> list[dict[str, Any]]:
        return [r for r in self.agg.get("rows") or [] if r["phase"] == phase]

    def by_config(self, phase: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows(phase):
            out.setdefault(r["config"], []).append(r)
        for v in out.values():
            v.sort(key=lambda r: (r.get("rate") or 0))
        return {c: out[c] for c in self.configs if c in out} | {c: v for c, v in out.items() if c not in self.configs}

    def title(self, text: str) -> str:
        return text + (" — SIMULATED" if self.simulated else "")

    def need_taxes(self, what: str) -> dict[str, Any]:
        if not self.taxes:
            raise Skip(f"{what}: no baseline config {self.agg.get('baseline_requested')!r} in this study "
                       "(connector-specific figure not applicable)")  # fmt: skip
        return self.taxes


def _ref_lines(ax: Any, ctx: Ctx) -> None:
    safe, load = ctx.ref.get("ref_safe"), ctx.ref.get("ref_load")
    marks = [("ref_safe = ref_load" if safe == load else "ref_safe", safe, "--")]
    if load is not None and load != safe:
        marks.append(("ref_load", load, ":"))
    for key, v, style in marks:
        if v:
            ax.axvline(v, color="0.35", ls=style, lw=1, zorder=1)
            ax.annotate(f"{key} = {v:g}", xy=(v, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -6),
                        textcoords="offset points", fontsize=7, color="0.3", rotation=90, va="top")  # fmt: skip


def _rate_axis(ax: Any, rates: list[float]) -> None:
    ax.set_xscale("log", base=2)
    if rates:
        ax.set_xticks(rates)
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.minorticks_off()


def _latency_vs_rate(ctx: Ctx, metric: str, label: str, title: str, markers: bool) -> Figure:
    data = ctx.by_config(PHASE_A)
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
        lo = np.array([r.get(f"{metric}_p90_ci_lo") if r.get(f"{metric}_p90_ci_lo") is not None else np.nan for r in rows], float)
        hi = np.array([r.get(f"{metric}_p90_ci_hi") if r.get(f"{metric}_p90_ci_hi") is not None else np.nan for r in rows], float)
        yerr = np.vstack([np.where(np.isnan(lo), 0, y - lo), np.where(np.isnan(hi), 0, hi - y)]).clip(min=0)
        rates.update(x.tolist())
        ax.errorbar(x, y, yerr=yerr, color=ctx.palette(c), marker="o", ms=4, lw=1.6, capsize=2, label=c, zorder=3)
        if markers:
            for crit, kw in CRITERION_MARKERS.items():
                sel = [i for i, r in enumerate(rows) if crit in (r.get("saturation_criteria") or "").split(";")]
                if sel:
                    fired_any.add(crit)
                    style = {k: v for k, v in kw.items() if k != "label"}
                    if style.get("facecolors") == "none":
                        style["edgecolors"] = ctx.palette(c)
                    else:
                        style["color"] = ctx.palette(c)
                    ax.scatter(x[sel], y[sel], zorder=4, **style)
    _rate_axis(ax, sorted(rates))
    ax.set_yscale("log")
    _ref_lines(ax, ctx)
    ax.set_xlabel("send rate (req/s, log scale)")
    ax.set_ylabel(f"{label} p90 (ms, log scale) with 95% CI")
    ax.set_title(ctx.title(title))
    ax.grid(True, which="major", alpha=0.3)
    first = ax.legend(title="config", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if markers:
        ax.add_artist(first)
        handles = [Line2D([], [], ls="none", color="0.2", markerfacecolor="none" if kw.get("facecolors") == "none" else "0.2",
                          marker=kw["marker"], markersize=8, label=kw["label"]) for crit, kw in CRITERION_MARKERS.items()]  # fmt: skip
        ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0), borderaxespad=0,
                  title="saturation criterion (fired)", title_fontsize=7)  # fmt: skip
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig1(ctx: Ctx) -> Figure:
    return _latency_vs_rate(ctx, "ttft_ms", "TTFT", "Fig. 1: TTFT p90 vs send rate (Phase A)", markers=True)


def fig2(ctx: Ctx) -> Figure:
    return _latency_vs_rate(ctx, "tpot_ms", "TPOT", "Fig. 2: TPOT p90 vs send rate (Phase A)", markers=True)


def fig3(ctx: Ctx) -> Figure:
    data = {c: [r for r in rows if r.get("effective_rps") is not None and r.get("rate")]
            for c, rows in ctx.by_config(PHASE_A).items()}  # fmt: skip
    data = {c: v for c, v in data.items() if v}
    if not data:
        raise Skip("no Phase A cell with an effective throughput")
    fig = new_figure(8.0, 5.6)
    ax = fig.add_subplot()
    all_x: list[float] = []
    per_config = ctx.ref.get("per_config") or {}
    for i, (c, rows) in enumerate(data.items()):
        x = [r["rate"] for r in rows]
        y = [r["effective_rps"] for r in rows]
        all_x += x
        ax.plot(x, y, marker="o", ms=4, lw=1.6, color=ctx.palette(c), label=c, zorder=3)
        knee = (per_config.get(c) or {}).get("saturation_rate")
        if knee is not None:
            at = next((r for r in rows if abs(r["rate"] - knee) < 1e-9), None)
            if at is not None:
                fired = (per_config.get(c) or {}).get("fired_at_saturation") or []
                ax.annotate(f"knee {c}\n@{knee:g} ({', '.join(fired)})", xy=(knee, at["effective_rps"]),
                            xytext=(-95, 14 + 16 * (i % 5)), textcoords="offset points", fontsize=6.5,
                            color=ctx.palette(c), arrowprops=dict(arrowstyle="->", color=ctx.palette(c), lw=0.8))  # fmt: skip
    lo, hi = min(all_x), max(all_x)
    ax.plot([lo, hi], [lo, hi], ls="--", color="0.4", lw=1, label="y = x (keeps up)", zorder=2)
    _rate_axis(ax, sorted(set(all_x)))
    ax.set_yscale("log", base=2)
    ax.set_yticks(sorted(set(all_x)))
    ax.set_yticklabels([f"{r:g}" for r in sorted(set(all_x))])
    ax.set_xlabel("requested send rate (req/s, log scale)")
    ax.set_ylabel("achieved (effective) throughput (req/s, log scale)")
    ax.set_title(ctx.title("Fig. 3: achieved vs requested throughput (Phase A), saturation knees"))
    ax.grid(True, alpha=0.3)
    ax.legend(title="config", fontsize=8, loc="upper left")
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def _bar_err(est: dict[str, Any] | None, scale: float = 100.0) -> tuple[float, list[float]]:
    if not est or est.get("value") is None:
        return np.nan, [0.0, 0.0]
    v = est["value"] * scale
    ci = est.get("ci")
    if not ci or None in ci:
        return v, [0.0, 0.0]
    return v, [max(v - ci[0] * scale, 0.0), max(ci[1] * scale - v, 0.0)]


def fig4(ctx: Ctx, skipped: dict[str, str]) -> Figure:
    taxes = ctx.need_taxes("fig 4")
    safe = (taxes["phase_a"].get("ref_safe") or {})
    load = (taxes["phase_a"].get("ref_load") or {})
    names = [c for c in ctx.configs if c in (safe.get("configs") or {}) or c in (load.get("configs") or {})]
    if not safe.get("configs"):
        raise Skip("no tax at ref_safe: " + ("; ".join(f"{k}: {v}" for k, v in (safe.get("missing") or {}).items())
                                            or f"no Phase A cell at ref_safe={safe.get('rate')}"))  # fmt: skip
    has_load = bool(load.get("configs"))
    if not has_load:
        skipped["fig4_ref_load_bars"] = "no tax at ref_load: " + (
            "; ".join(f"{k}: {v}" for k, v in (load.get("missing") or {}).items()) or f"no Phase A cell at {load.get('rate')}")
    fig = new_figure(12.0, 4.8)
    axes = fig.subplots(1, 2)
    width = 0.38 if has_load else 0.6
    x = np.arange(len(names))
    for ax, metric, label in ((axes[0], "ttft_p90", "TTFT p90"), (axes[1], "tpot_p90", "TPOT p90")):
        for j, (entry, hatch, alpha, tag) in enumerate(((safe, None, 0.95, "ref_safe"), (load, "//", 0.55, "ref_load"))):
            if tag == "ref_load" and not has_load:
                continue
            vals, errs = [], []
            for c in names:
                v, e = _bar_err(((entry.get("configs") or {}).get(c) or {}).get(metric))
                vals.append(v)
                errs.append(e)
            off = (j - 0.5) * width if has_load else 0.0
            ax.bar(x + off, vals, width, yerr=np.array(errs).T, capsize=2, color=[ctx.palette(c) for c in names],
                   alpha=alpha, hatch=hatch, edgecolor="0.2", linewidth=0.6)  # fmt: skip
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax {label} vs {taxes['baseline']} (%) with 95% CI")
        ax.set_title(f"{label}")
        ax.grid(True, axis="y", alpha=0.3)
    handles = [Patch(facecolor="0.6", edgecolor="0.2", label=f"ref_safe = {safe.get('rate'):g} req/s (pure tax)")]
    if has_load:
        handles.append(Patch(facecolor="0.6", edgecolor="0.2", hatch="//", alpha=0.55,
                             label=f"ref_load = {load.get('rate'):g} req/s (tax + queueing)"))  # fmt: skip
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
    shared = [s for s in prime if s in base and prime[s]["configs"]]
    if not shared:
        raise Skip("no Phase B' taxes (Phase B' did not run: ref_load == ref_safe, or no phase_b_prime cells "
                   "for the baseline and another config)")  # fmt: skip
    names = [c for c in ctx.configs if any(c in prime[s]["configs"] for s in shared)]
    fig = new_figure(4.0 + 2.6 * len(shared), 4.6)
    axes = np.atleast_1d(fig.subplots(1, len(shared), sharey=True))
    x = np.arange(len(names))
    for ax, s in zip(axes, shared):
        for j, (cells, hatch, alpha) in enumerate(((base, None, 0.95), (prime, "//", 0.55))):
            vals, errs = zip(*[_bar_err(((cells[s]["configs"].get(c)) or {}).get("ttft_p90")) for c in names])
            ax.bar(x + (j - 0.5) * 0.38, vals, 0.38, yerr=np.array(errs).T, capsize=2, hatch=hatch, alpha=alpha,
                   color=[ctx.palette(c) for c in names], edgecolor="0.2", linewidth=0.6)  # fmt: skip
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"shape {s}")
        ax.set_xlabel("configuration")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel(f"tax TTFT p90 vs {taxes['baseline']} (%)")
    rs, rl = taxes[PHASE_B].get("rates") or [], taxes[PHASE_B_PRIME].get("rates") or []
    axes[-1].legend(handles=[Patch(facecolor="0.6", label=f"Phase B (ref_safe {', '.join(f'{r:g}' for r in rs)} req/s)"),
                             Patch(facecolor="0.6", hatch="//", alpha=0.55,
                                   label=f"Phase B' (ref_load {', '.join(f'{r:g}' for r in rl)} req/s)")]
                    + [Patch(facecolor=ctx.palette(c), label=c) for c in names], fontsize=7)  # fmt: skip
    fig.suptitle(ctx.title("Fig. 4b: TTFT p90 tax per shape, ref_safe (Phase B) vs ref_load (Phase B')"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig5(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 5")
    cells = (taxes.get(PHASE_B) or {}).get("cells") or {}
    shaped = {k: v for k, v in cells.items() if v.get("input") is not None and v.get("output") is not None}
    names = [c for c in ctx.configs if c != ctx.baseline and any(
        ((v["configs"].get(c) or {}).get("ttft_p90") or {}).get("value") is not None for v in shaped.values())]
    if not names:
        raise Skip("no Phase B tax on an input x output shape grid (Phase B missing for the baseline or every other "
                   "config, or shapes are mixes/patterns)")  # fmt: skip
    inputs = sorted({v["input"] for v in shaped.values()})
    outputs = sorted({v["output"] for v in shaped.values()})
    grids = {}
    for c in names:
        g = np.full((len(inputs), len(outputs)), np.nan)
        for v in shaped.values():
            est = (v["configs"].get(c) or {}).get("ttft_p90") or {}
            if est.get("value") is not None:
                g[inputs.index(v["input"]), outputs.index(v["output"])] = est["value"] * 100
        grids[c] = g
    vmax = max(float(np.nanmax(np.abs(g))) for g in grids.values()) or 1.0
    ncols = min(4, len(names))
    nrows = -(-len(names) // ncols)
    fig = new_figure(2.0 + 3.0 * ncols, 0.8 + 3.0 * nrows)
    grid = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax in grid[len(names):]:
        ax.set_visible(False)
    axes = grid[: len(names)]
    im = None
    for ax, c in zip(axes, names):
        g = np.ma.masked_invalid(grids[c])
        im = ax.imshow(g, cmap="RdBu_r", vmin=-vmax, vmax=vmax, origin="lower", aspect="auto")
        for i in range(len(inputs)):
            for j in range(len(outputs)):
                val = grids[c][i, j]
                ax.text(j, i, "n/a" if np.isnan(val) else f"{val:+.0f}%", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(outputs)))
        ax.set_xticklabels([str(o) for o in outputs], fontsize=7)
        ax.set_yticks(range(len(inputs)))
        ax.set_yticklabels([str(i) for i in inputs], fontsize=7)
        ax.set_xlabel("output length (tokens)")
        ax.set_ylabel("input length (tokens)")
        ax.set_title(c, color=ctx.palette(c), fontsize=9, fontweight="bold")
    cb = fig.colorbar(im, ax=list(axes), shrink=0.85)
    cb.set_label(f"tax TTFT p90 vs {taxes['baseline']} (%)")
    rates = (taxes.get(PHASE_B) or {}).get("rates") or []
    fig.suptitle(ctx.title(f"Fig. 5: TTFT p90 tax by shape (Phase B at {', '.join(f'{r:g}' for r in rates)} req/s)"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig6(ctx: Ctx) -> Figure:
    if not ctx.taxes:
        ctx.need_taxes("fig 6")
    rate = ctx.ref.get("ref_safe")
    cdf = (ctx.agg.get("step_cdf") or {})
    pcts = np.array(cdf.get("percentiles") or [], float) / 100.0
    key = f"{PHASE_A}/r{float(rate):g}" if rate is not None else None
    lines = {c: (cdf.get("configs") or {}).get(c, {}).get(key) for c in ctx.configs}
    lines = {c: v for c, v in lines.items() if v}
    if not lines:
        reasons = sorted({p.get("step_timing_reason") or "no engine_step file"
                          for st in (ctx.agg.get("config_status") or {}).values()
                          for ph, p in (st.get("phases") or {}).items() if ph == PHASE_A and not p.get("step_timing_available")})  # fmt: skip
        raise Skip(f"no engine step log at ref_safe={rate} (step timing unavailable"
                   + (f": {'; '.join(reasons)}" if reasons else "") + ")")
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot()
    for c, values in lines.items():
        ax.plot(values, pcts, color=ctx.palette(c), lw=1.6, label=c, drawstyle="steps-post")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("step duration: Scheduler.schedule() (µs, log scale)")
    ax.set_ylabel("CDF (fraction of steps)")
    ax.set_title(ctx.title(f"Fig. 6: per-step latency CDF at ref_safe = {float(rate):g} req/s (Phase A)"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="config", fontsize=8, loc="lower right")
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def _step_value(entry: dict[str, Any], c: str, key: str) -> dict[str, Any] | None:
    est = ((entry.get("configs") or {}).get(c) or {}).get(key)
    return est if est and est.get("value") is not None else None


def fig7(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 7")
    safe = taxes["phase_a"].get("ref_safe") or {}
    with_steps = [c for c in ctx.configs if _step_value(safe, c, "step_p50_us")]
    if not with_steps:
        raise Skip(f"no step-time tax at ref_safe={safe.get('rate')} (step timing unavailable for the baseline or "
                   "every connector config: figs 6-7 need the engine step log)")  # fmt: skip
    if NOOP not in ctx.configs or NOOP not in with_steps:
        raise Skip(f"{NOOP} did not run (or has no step log at ref_safe): framework cost cannot be separated; "
                   "the tax is reported as one number per config")  # fmt: skip
    fw = _step_value(safe, NOOP, "step_p50_us")["value"]  # type: ignore[index]
    names = with_steps
    fig = new_figure(11.0, 4.8)
    ax1, ax2 = fig.subplots(1, 2)
    x = np.arange(len(names))
    impl = [(_step_value(safe, c, "step_p50_us")["value"] - fw) if c != NOOP else 0.0 for c in names]  # type: ignore[index]
    ax1.bar(x, [fw] * len(names), 0.6, color="0.75", hatch="..", edgecolor="0.3", linewidth=0.6)
    ax1.bar(x, impl, 0.6, bottom=[fw] * len(names), color=[ctx.palette(c) for c in names], edgecolor="0.3", linewidth=0.6)
    ax1.set_title("framework (noop_connector) vs implementation")
    cb = [(_step_value(safe, c, "callback_p50_us") or {"value": 0.0})["value"] for c in names]
    un = [(_step_value(safe, c, "unattributed_p50_us") or {"value": 0.0})["value"] for c in names]
    ax2.bar(x, cb, 0.6, color=[ctx.palette(c) for c in names], edgecolor="0.3", linewidth=0.6)
    ax2.bar(x, un, 0.6, bottom=cb, color=[ctx.palette(c) for c in names], alpha=0.45, hatch="//", edgecolor="0.3",
            linewidth=0.6)  # fmt: skip
    ax2.set_title("callback-attributable vs unattributed")
    for ax in (ax1, ax2):
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax step p50 vs {taxes['baseline']} (µs)")
        ax.grid(True, axis="y", alpha=0.3)
    # Below the axes, never over bars (the tallest bar's height is not known in advance).
    fig.legend(handles=[Patch(facecolor="0.75", hatch="..", edgecolor="0.3", label="framework = tax(noop_connector)"),
                        Patch(facecolor="0.45", label="implementation = tax(X) - tax(noop), config colour"),
                        Patch(facecolor="0.45", label="callbacks: build_meta + get_finished + start_load_kv (p50)"),
                        Patch(facecolor="0.45", alpha=0.45, hatch="//", label="unattributed = tax_step - tax_callback")]
               + [Patch(facecolor=ctx.palette(c), label=c) for c in names],
               loc="outside lower center", ncol=3, fontsize=7)  # fmt: skip
    fig.suptitle(ctx.title(f"Fig. 7: per-step tax decomposition at ref_safe = {safe.get('rate'):g} req/s"))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


def fig8(ctx: Ctx) -> Figure:
    taxes = ctx.need_taxes("fig 8")
    safe = taxes["phase_a"].get("ref_safe") or {}
    need = [MOONCAKE_BOTH, LMCACHE_ONLY, MULTI]
    missing = [c for c in need if c not in (safe.get("configs") or {})]
    if missing:
        why = "; ".join(f"{c}: {(safe.get('missing') or {}).get(c) or 'not in the study or skipped'}" for c in missing)
        raise Skip(f"H4 needs {', '.join(need)} at ref_safe; missing {why}")
    h4 = next((h for h in ctx.hyp.get("hypotheses") or [] if h["id"] == "H4"), {})
    fig = new_figure(9.0, 4.8)
    axes = fig.subplots(1, 2)
    for ax, metric, label in ((axes[0], "ttft_p90", "TTFT p90"), (axes[1], "tpot_p90", "TPOT p90")):
        mb = safe["configs"][MOONCAKE_BOTH][metric]
        lm = safe["configs"][LMCACHE_ONLY][metric]
        mu = safe["configs"][MULTI][metric]
        (v1, e1), (v2, e2), (v3, e3) = _bar_err(mb), _bar_err(lm), _bar_err(mu)
        ax.bar(0, v1, 0.6, yerr=np.array([e1]).T, capsize=3, color=ctx.palette(MOONCAKE_BOTH), edgecolor="0.2")
        ax.bar(1, v2, 0.6, yerr=np.array([e2]).T, capsize=3, color=ctx.palette(LMCACHE_ONLY), edgecolor="0.2")
        ax.bar(2, v1, 0.6, color=ctx.palette(MOONCAKE_BOTH), edgecolor="0.2", alpha=0.7)
        ax.bar(2, v2, 0.6, bottom=v1, color=ctx.palette(LMCACHE_ONLY), edgecolor="0.2", alpha=0.7)
        ax.bar(3, v3, 0.6, yerr=np.array([e3]).T, capsize=3, color=ctx.palette(MULTI), edgecolor="0.2")
        total = v1 + v2
        if np.isfinite(total) and total > 0:  # |multi - sum| <= 0.30 multi  <=>  sum/1.3 <= multi <= sum/0.7
            ax.axhspan(total / 1.3, total / 0.7, color="0.85", zorder=0)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(range(4))
        ax.set_xticklabels(["mooncake_both", "lmcache_only", "sum", "multi"], rotation=20, fontsize=8)
        ax.set_xlabel("configuration")
        ax.set_ylabel(f"tax {label} vs {taxes['baseline']} (%)")
        ax.set_title(label)
        ax.grid(True, axis="y", alpha=0.3)
    rel = ((h4.get("numbers") or {}).get("rel_dev") or {}).get("value")
    fig.legend(handles=[Patch(facecolor=ctx.palette(c), label=c) for c in need]
               + [Patch(facecolor="0.85", label="additive band for multi: |multi - sum| <= 0.30 multi")],
               loc="outside lower center", ncol=2, fontsize=7)  # fmt: skip
    fig.suptitle(ctx.title(f"Fig. 8: H4 additivity at ref_safe = {safe.get('rate'):g} req/s — "
                           f"verdict {h4.get('verdict', 'n/a')}" + (f", rel. dev. {rel:+.2f}" if rel is not None else "")))
    stamp(fig, ctx.simulated, ctx.served_by)
    return fig


# name -> builder; the name is the file stem (figures/<name>.png/.pdf) and the skipped.json key.
FIGURES: dict[str, Callable[..., Figure]] = {
    "fig1_ttft_p90_vs_rate": fig1,
    "fig2_tpot_p90_vs_rate": fig2,
    "fig3_throughput_vs_requested": fig3,
    "fig4_tax_bars_ref_safe_ref_load": fig4,
    "fig4b_tax_shapes_phase_b_prime": fig4b,
    "fig5_tax_shape_heatmaps": fig5,
    "fig6_step_latency_cdf": fig6,
    "fig7_tax_decomposition": fig7,
    "fig8_h4_additivity": fig8,
}
