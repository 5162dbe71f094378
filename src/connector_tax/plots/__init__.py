"""Figures 1-8 from the analysis documents (aggregate.json + hypotheses.json); see README.md."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def build_figure(name: str, aggregate: dict[str, Any], hypotheses: dict[str, Any] | None = None) -> Any:
    """The matplotlib Figure of one figure name (raises figures.Skip when its data is missing)."""
    from connector_tax.plots.figures import FIGURES, Ctx

    builder = FIGURES[name]
    ctx = Ctx(aggregate, hypotheses)
    if name.startswith("fig4_"):
        return builder(ctx, {})
    return builder(ctx)


def make_figures(aggregate: dict[str, Any], hypotheses: dict[str, Any] | None, out_dir: Path) -> dict[str, Any]:
    """Draw every figure into out_dir as PNG + PDF (a skipped one as a notice of why). Returns
    {"made": {name: [paths]}, "skipped": {name: reason}, "meta": {name: titles/labels/legends}}."""
    from connector_tax.plots.figures import FIGURES, Ctx, Skip
    from connector_tax.plots.style import describe, notice, save

    out_dir = Path(out_dir)
    made: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    meta: dict[str, Any] = {}
    for name, builder in FIGURES.items():
        ctx = Ctx(aggregate, hypotheses)
        try:
            fig = builder(ctx, skipped) if name.startswith("fig4_") else builder(ctx)
        except Skip as exc:
            skipped[name] = str(exc)
        except Exception as exc:  # a plotting bug must not lose the analysis outputs
            log.exception("figure %s failed", name)
            skipped[name] = f"internal error while drawing: {type(exc).__name__}: {exc}"
        if name in skipped:
            # Every figure file exists (the workflow declares them all), and one without its data
            # says so in words: a notice, never an empty chart, nor a stale one of an earlier run.
            save(notice(name, skipped[name], aggregate.get("simulated", False)), out_dir, name)
            continue
        meta[name] = describe(fig)
        made[name] = save(fig, out_dir, name)
    return {"made": made, "skipped": skipped, "meta": meta}


__all__ = ["build_figure", "make_figures"]
