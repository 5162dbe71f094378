"""The figure of `ctax compare`: every change B / A - 1 with its 95 % interval, one panel per metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from connector_tax.plots.style import new_figure, save, stamp

NAME = "compare"
CALL_COLOURS = {
    "changed": "tab:red",
    "no change resolved": "tab:green",
    "below resolution": "tab:grey",
    "no interval": "tab:grey",
}
_TITLES = {
    "ttft_p90": "TTFT p90",
    "tpot_p90": "TPOT p90",
    "tax_ttft_p90": "TTFT p90 tax (variant / baseline)",
    "tax_tpot_p90": "TPOT p90 tax (variant / baseline)",
}


def figure(doc: dict[str, Any]) -> Figure:
    """Forest plot: a row per variant x phase x cell, its change and interval, coloured by the
    call; 0 and ± the margin marked."""
    metrics = [m for m in _TITLES if any(r["metric"] == m for r in doc["rows"])]
    labels = sorted({(r["variant"], r["phase"], r["cell"]) for r in doc["rows"]})
    fig = new_figure(4.2 * max(1, len(metrics)), 2.4 + 0.32 * len(labels))
    axes = fig.subplots(1, max(1, len(metrics)), sharey=True, squeeze=False)[0]
    margin = doc["margin"] * 100
    for ax, metric in zip(axes, metrics):
        for y, key in enumerate(labels):
            row = next(
                (r for r in doc["rows"] if (r["variant"], r["phase"], r["cell"]) == key and r["metric"] == metric), None
            )
            if row is None or row.get("change") is None:
                continue
            colour = CALL_COLOURS[row["call"]]
            x = row["change"] * 100
            if row.get("ci_lo") is not None and row.get("ci_hi") is not None:
                lo, hi = row["ci_lo"] * 100, row["ci_hi"] * 100
                ax.errorbar([x], [y], xerr=[[x - lo], [hi - x]], fmt="o", color=colour, capsize=3)
            else:
                ax.plot([x], [y], "o", mfc="none", color=colour)
        ax.axvline(0, color="black", lw=0.8)
        for edge in (100 / (1 + margin / 100) - 100, margin):
            ax.axvline(edge, color="0.6", lw=0.8, ls="--")
        ax.set_title(_TITLES[metric])
        ax.set_xlabel("change B / A − 1 (%)")
    axes[0].set_yticks(range(len(labels)), [f"{v}  {p}  {c}" for v, p, c in labels], fontsize=7)
    axes[0].set_ylabel("variant, phase, cell")
    for call, colour in CALL_COLOURS.items():
        if call != "no interval":
            axes[-1].plot([], [], "o", color=colour, label=call)
    axes[-1].legend(loc="best", fontsize=7, title=f"call (margin ±{margin:g} %)", title_fontsize=7)
    a, b = doc["a"], doc["b"]
    fig.suptitle(f"B = {b['spec']}\nagainst A = {a['spec']}\n(95 % intervals, the launch included)", fontsize=8)
    stamp(fig, doc["simulated"], a["served_by"] if a["served_by"] == b["served_by"] else None)
    return fig


def draw(doc: dict[str, Any], out_dir: Path) -> list[str]:
    """compare.png and compare.pdf in out_dir ([] when there is nothing to draw)."""
    if not doc["rows"]:
        return []
    return save(figure(doc), Path(out_dir), NAME)
